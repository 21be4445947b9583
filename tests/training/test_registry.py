"""The stage registry is the one list of stages: a toy algorithm added to it alone is a config
section, a ``policy.algorithm``, an ``alignflow train`` command and part of the cache key."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.config import ConfigError, load_config
from alignflow.plan import RunPlan
from alignflow.training.registry import StageSpec, policy_algorithms, register_stage, stage_spec, stages

SMALL_MODEL = ["--set", "model.hidden_size=64", "--set", "model.intermediate_size=128"]


def test_builtin_stages_and_their_cache_sections():
    # the first built-ins in their order; a later built-in algorithm adds its line, not an edit here
    names = list(stages())
    assert names[:5] == ["sft", "reward", "dpo", "grpo", "ppo"]
    assert policy_algorithms() == tuple(name for name in names if stage_spec(name).role == "policy")
    assert {"dpo", "grpo", "ppo"} <= set(policy_algorithms()) and "sft" not in policy_algorithms()
    assert stage_spec("dpo").cache_sections == ("seed", "model", "dpo")
    assert stage_spec("dpo").distributed and not stage_spec("ppo").distributed
    with pytest.raises(ValueError, match="already registered"):
        register_stage(StageSpec("dpo", "x:y", "x:Y"))
    with pytest.raises(ValueError, match="identifier"):
        register_stage(StageSpec("no-dash", "x:y", "x:Y"))


@pytest.mark.parametrize("name", ["sft", "reward", "dpo", "grpo", "ppo", "simpo", "orpo", "kto"])
def test_every_builtin_runner_takes_the_run_settings_and_reads_its_own_section_typed(name):
    import inspect

    runner = stage_spec(name).load_runner()
    first = next(iter(inspect.signature(runner).parameters.values()))
    assert first.annotation == "RunSettings", f"{name}: {first.name}: {first.annotation}"
    assert "section_as(" in inspect.getsource(inspect.getmodule(runner)), f"{name} reads its section untyped"


def test_a_section_read_as_another_stages_class_is_refused():
    from alignflow.training.dpo_config import DPOConfig
    from alignflow.training.sft_config import SFTConfig

    config = load_config(None)
    assert isinstance(config.section_as("dpo", DPOConfig), DPOConfig)
    with pytest.raises(TypeError, match="'sft' is a SFTConfig, not a DPOConfig"):
        config.section_as("sft", DPOConfig)
    assert config.section_as("sft", SFTConfig) is config.sft


def test_an_unregistered_algorithm_is_neither_a_section_nor_an_algorithm():
    with pytest.raises(ConfigError, match="unknown config section"):
        load_config(None, ["toy.max_steps=2"])
    with pytest.raises(ConfigError, match="not a registered policy algorithm"):
        load_config(None, ["policy.algorithm=toy"])


def test_a_registered_toy_algorithm_is_a_config_section_and_part_of_the_policy_cache_key(toy_stage):
    config = load_config(None, ["policy.algorithm=toy", "toy.max_steps=2"])
    assert config.toy.max_steps == 2 and type(config.toy).__name__ == "ToyConfig"
    retuned = load_config(None, ["policy.algorithm=toy", "toy.max_steps=5"])
    assert RunPlan(config).section_hash("policy") != RunPlan(retuned).section_hash("policy")
    assert RunPlan(config).section_hash("sft") == RunPlan(retuned).section_hash("sft")
    with pytest.raises(ConfigError, match=r"toy\.max_steps"):
        load_config(None, ["toy.max_steps=0"])


def test_a_registered_toy_algorithm_runs_from_the_cli(
    toy_stage, demo_snapshot, tiny_model_dir, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the command's log goes to the working directory's .alignflow/logs
    result = CliRunner().invoke(
        app,
        ["train", "toy", "--data", str(demo_snapshot), "--output", str(tmp_path / "out"),
         "--model", str(tiny_model_dir), "--set", "toy.max_steps=2", "--quiet"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout[result.stdout.index("{") :])
    assert out["stage"] == "toy" and out["metrics"]["global_step"] == 2.0
    assert (tmp_path / "out" / "model" / "model.safetensors").exists()
    assert list((tmp_path / ".alignflow" / "logs").glob("train-toy-*.log")), "its log lies in the workspace"
    listed = CliRunner().invoke(app, ["train", "--help"]).stdout
    assert all(name in listed for name in ("sft", "reward", "dpo", "grpo", "ppo", "toy"))


def test_train_takes_a_data_file_and_snapshots_it_first(
    tmp_path, demo_records, tiny_model_dir, toy_stage, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # the command's log goes to the working directory's .alignflow/logs
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in demo_records[:120]))
    out = tmp_path / "out"
    args = ["train", "toy", "--data", str(source), "--output", str(out), "--model", str(tiny_model_dir), "-q"]
    # the demo generator repeats a few pairs: let them be quarantined, and every row accounted for
    sets = ["--set", "toy.max_steps=1", "--set", "data.max_bad_fraction=0.2"]
    result = CliRunner().invoke(app, [*args, *sets])
    assert result.exit_code == 0, result.output
    snapshot = out / "data"
    assert json.loads(result.stdout[result.stdout.index("{") :])["data_dir"] == str(snapshot)
    manifest = json.loads((snapshot / "manifest.json").read_text())
    assert manifest["input_rows"] == 120 and manifest["counts_add_up"]
    assert manifest["counts"]["quarantine"] > 0


def test_train_refuses_a_data_file_that_fails_validation(tmp_path, tiny_model_dir):
    source = tmp_path / "bad.jsonl"
    bad = json.dumps({"prompt": "p", "chosen": 1, "rejected": "r"})  # a number is no answer
    source.write_text(f"{bad}\n" * 5)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["train", "sft", "--data", str(source), "--output", str(out), "-q"])
    assert result.exit_code == 1
    assert "failed validation" in result.output and not (out / "model").exists()
    report = json.loads((out / "failed-report.json").read_text())
    assert len(report["quarantined_rows"]) == 5


def test_a_plugin_package_registers_its_stage_through_an_entry_point(tmp_path, monkeypatch):
    """What a separately installed package does: an ``alignflow.stages`` entry point, no code here."""
    from alignflow.training import registry

    dist = tmp_path / "toy_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[alignflow.stages]\ntoy = tests.training.toy_algorithm:TOY\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    try:
        assert "toy" in stages() and "toy" in policy_algorithms()
        assert load_config(None, ["policy.algorithm=toy", "toy.max_steps=4"]).toy.max_steps == 4
    finally:
        registry.unregister_stage("toy")
