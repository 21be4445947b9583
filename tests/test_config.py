import pytest

from alignflow.config import ConfigError, config_hash, load_config


def test_overrides_reach_nested_keys_and_change_the_hash(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("project: demo\ndata:\n  eval_fraction: 0.2\n")
    base = load_config(path)
    changed = load_config(path, ["data.eval_fraction=0.3", "seed=7"])
    assert base.data.eval_fraction == 0.2
    assert changed.data.eval_fraction == 0.3 and changed.seed == 7
    assert config_hash(base) != config_hash(changed)
    assert config_hash(base) == config_hash(load_config(path))


def test_unknown_section_and_bad_override_name_the_problem(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("nonsense: 1\n")
    with pytest.raises(ConfigError, match="nonsense"):
        load_config(path)
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["seed"])
