"""A config that cannot be applied is refused in one line: where the key came from (``--set``,
or the file with line and column), what is wrong and the fix (the closest key for a typo)."""

from __future__ import annotations

import pytest

from alignflow.config import ConfigError, closest_key, load_config


def _refusal(path=None, overrides=None) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides or [])
    message = str(caught.value)
    assert "\n" not in message, f"more than one line:\n{message}"
    assert "pydantic" not in message and "errors.pydantic.dev" not in message
    return message


def test_a_misspelt_override_is_blamed_on_the_override_with_the_closest_key():
    assert _refusal(None, ["dpo.betaa=0.2"]) == (
        "--set dpo.betaa=0.2: unknown key dpo.betaa; did you mean dpo.beta?"
    )


def test_the_same_override_on_a_config_file_is_still_blamed_on_the_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("project: demo\ndpo:\n  beta: 0.1\n")
    assert _refusal(path, ["dpo.betaa=0.2"]).startswith("--set dpo.betaa=0.2: unknown key dpo.betaa;")


def test_a_misspelt_key_in_a_file_names_its_line_and_column(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("project: demo\ndpo:\n  beta: 0.1\n  betaa: 0.2\n")
    assert _refusal(path) == f"{path}:4:3: unknown key dpo.betaa; did you mean dpo.beta?"


def test_an_unknown_section_names_the_closest_one(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("project: demo\ndpoo:\n  beta: 0.1\n")
    assert _refusal(path) == f"{path}:2:1: unknown config section 'dpoo'; did you mean dpo?"
    assert _refusal(None, ["dpoo.beta=1"]).startswith("--set dpoo.beta=1: unknown config section 'dpoo'")


def test_a_key_in_no_section_suggests_the_sections_that_have_it():
    assert closest_key(("beta",)) == "one of dpo.beta, grpo.beta, kto.beta, orpo.beta, simpo.beta"
    assert closest_key(("sft", "max_stepss")) == "sft.max_steps"


def test_a_bad_value_names_the_key_the_rule_and_what_was_given(tmp_path):
    assert _refusal(None, ["dpo.beta=abc"]).startswith(
        "--set dpo.beta=abc: dpo.beta: Input should be a valid number"
    )
    path = tmp_path / "c.yaml"
    path.write_text("sft:\n  max_steps: -1\n")
    assert _refusal(path) == (
        f"{path}:2:3: sft.max_steps: Input should be greater than or equal to 1 (got -1)"
    )


def test_a_section_level_rule_is_blamed_on_the_override_it_names():
    message = _refusal(None, ["dpo.loss_type=foo"])
    assert message.startswith("--set dpo.loss_type=foo: dpo.loss_type: unknown ['foo']")


def test_unparsable_yaml_and_overrides_are_one_line_with_the_position(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("project: demo\ndpo:\n  beta: [0.1\n")
    assert _refusal(path).startswith(f"{path}:4:1: not valid YAML: expected ',' or ']'")
    assert _refusal(None, ["dpo.beta=["]).startswith("--set dpo.beta=[: cannot parse the value")
    assert _refusal(None, ["seed"]) == "--set seed: not key=value; write it as --set section.key=value"
    assert _refusal(None, ["seed.x=1"]).startswith("--set seed.x=1: seed is a value, not a section")


@pytest.mark.parametrize("key", ["model.nmae=x", "tracking.urii=x", "orchestration.num_processs=2"])
def test_every_section_refuses_a_misspelt_key(key):
    section, name = key.split("=")[0].split(".")
    assert _refusal(None, [key]).startswith(f"--set {key}: unknown key {section}.{name}; did you mean")
