"""The shared stage pieces: checkpoint completeness, scored->pair derivation, config checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.config import ConfigError, load_config
from alignflow.data.pairing import pairs_from_scored
from alignflow.registry.trainer_callback import metric_names
from alignflow.training.checkpoints import last_complete_checkpoint

REPO = Path(__file__).resolve().parents[2]


def _checkpoint(root: Path, step: int, complete: bool) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"x")
    if complete:
        (path / "trainer_state.json").write_text("{}")
    return path


def test_last_complete_checkpoint_skips_partial_ones_and_cleans_staging(tmp_path):
    _checkpoint(tmp_path, 10, complete=True)
    _checkpoint(tmp_path, 20, complete=False)
    (tmp_path / ".staging" / "checkpoint-30").mkdir(parents=True)
    assert last_complete_checkpoint(tmp_path).name == "checkpoint-10"
    assert not (tmp_path / ".staging").exists()
    assert last_complete_checkpoint(tmp_path / "missing") is None


def test_pairs_from_scored_prefers_the_higher_score_per_prompt():
    rows = [
        {"id": "a", "prompt": "p", "completion": "good", "score": 0.9},
        {"id": "b", "prompt": "p", "completion": "bad", "score": 0.1},
        {"id": "c", "prompt": "p", "completion": "tie", "score": 0.1},
        {"id": "d", "prompt": "q", "completion": "alone", "score": 1.0},
        {"id": "e", "prompt": "q", "completion": "alone", "score": 0.2},  # one text rated twice
    ]
    pairs = pairs_from_scored(rows)
    assert {(p["chosen"], p["rejected"]) for p in pairs} == {("good", "bad"), ("good", "tie")}
    assert all(p["margin"] == pytest.approx(0.8) for p in pairs)


def test_metric_names_are_scoped():
    named = metric_names({"loss": 1.0, "eval_loss": 2.0, "rewards/accuracies": 0.7})
    assert named == {"train/loss": 1.0, "eval/loss": 2.0, "train/rewards/accuracies": 0.7}


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_config_preset_loads(path):
    config = load_config(path)
    assert config.sft.max_steps >= 1 and config.grpo.num_generations >= 2


def test_bad_stage_values_name_the_key():
    with pytest.raises(ConfigError, match="loss_type"):
        load_config(None, ["dpo.loss_type=nonsense"])
    with pytest.raises(ConfigError, match=r"loss_weights: 1 weight\(s\) for 2 loss"):
        load_config(None, ["dpo.loss_type=[sigmoid, sft]", "dpo.loss_weights=[1.0]"])
    with pytest.raises(ConfigError, match="num_generations"):
        load_config(None, ["grpo.per_device_train_batch_size=6", "grpo.num_generations=4"])
    with pytest.raises(ConfigError, match="path"):
        load_config(None, ["grpo.reward_functions=[{kind: python}]"])


@pytest.mark.parametrize("stage", ["sft", "reward", "dpo", "grpo"])
def test_activation_checkpointing_follows_the_stage_config(stage, tmp_path):
    """TRL's configs default checkpointing to on; a stage runs without it unless configured."""
    import trl

    from alignflow.training.stage import filter_known_args, trainer_arguments

    trl_config = {"sft": trl.SFTConfig, "reward": trl.RewardConfig, "dpo": trl.DPOConfig}.get(
        stage, trl.GRPOConfig
    )
    for wanted in (False, True):
        config = load_config(None, [f"{stage}.gradient_checkpointing={str(wanted).lower()}"])
        section = getattr(config, stage)
        kwargs = trainer_arguments(section, tmp_path, config.model, 0, has_eval=False)
        if stage == "grpo":  # GRPO checks its generation batch against these at construction
            kwargs.update(num_generations=section.num_generations)
        args = trl_config(**filter_known_args(trl_config, kwargs))
        assert args.gradient_checkpointing is wanted
        assert getattr(args, "activation_checkpointing", wanted) is wanted


def test_grpo_generation_cache_and_compile_reach_trl(tmp_path):
    """grpo.cache_implementation lands in the GRPOConfig the stage hands TRL, and
    grpo.compile_generation lifts the disable_compile=True TRL generates with."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from alignflow.training.grpo import allow_compiled_decoding, trl_grpo_args

    default = load_config(None, [])
    assert trl_grpo_args(default, default.grpo, tmp_path, 0, [1.0, 1.0]).cache_implementation is None
    config = load_config(None, ["grpo.cache_implementation=static", "grpo.compile_generation=true"])
    args = trl_grpo_args(config, config.grpo, tmp_path, 0, [1.0, 1.0])
    assert args.cache_implementation == "static"
    # what TRL's GRPOTrainer builds from these args (grpo_trainer.py: transformers' generate path)
    built = GenerationConfig(cache_implementation=args.cache_implementation, disable_compile=True)
    assert not allow_compiled_decoding(SimpleNamespace(generation_config=built), default.grpo)
    assert built.disable_compile is True
    assert allow_compiled_decoding(SimpleNamespace(generation_config=built), config.grpo)
    assert built.disable_compile is False
    with pytest.raises(ConfigError, match="compile_generation"):
        load_config(None, ["grpo.compile_generation=true"])


def test_held_out_figures_have_one_spelling_before_and_after_training():
    from alignflow.training.stage import as_before, held_out_metrics

    evaluated = {"eval_loss": 0.5, "eval_rewards/accuracies": 0.75, "eval_done": True, "epoch": 1.0}
    after = held_out_metrics(evaluated)
    assert after == {"eval/loss": 0.5, "eval/rewards/accuracies": 0.75}  # numbers only, eval_ only
    assert as_before(after) == {"eval/before_loss": 0.5, "eval/before_rewards/accuracies": 0.75}
