"""A training stage across 2 CPU processes (accelerate launch, DDP over gloo) vs 1 process.

Same start model, same data, same global batch (per-device batch halved): DDP averages
the two halves' gradients, so the runs must end at (nearly) the same losses.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from alignflow.config import load_config
from alignflow.training.launch import launch_stage
from alignflow.training.registry import stage_spec

REPO = Path(__file__).resolve().parents[2]
STEPS = 12
GLOBAL_BATCH = 16
COMMON = (
    f"sft.max_steps={STEPS}",
    "sft.save_steps=6",
    "sft.logging_steps=2",
    "sft.eval_max_rows=64",
    "sft.learning_rate=0.003",
)


def _config(*overrides: str):
    return load_config(REPO / "configs" / "demo.yaml", [*COMMON, *overrides])


@pytest.fixture(scope="module")
def snapshot_and_base(tmp_path_factory) -> tuple[Path, str]:
    """A demo snapshot and one tiny base model that both runs start from."""
    from alignflow.data.demo import iter_demo_pairs
    from alignflow.data.snapshot import load_split, write_split
    from alignflow.training.stage import resolve_start_model

    data_dir = tmp_path_factory.mktemp("mp-data")
    records = [dict(r, kind="pair") for r in iter_demo_pairs(480, seed=3)]
    write_split(data_dir, "train", records[:400])
    write_split(data_dir, "eval", records[400:])
    base = resolve_start_model(
        _config().model, load_split(data_dir, "train"), tmp_path_factory.mktemp("mp-base"), None
    )
    return data_dir, base


def test_unknown_stage_names_the_choices():
    with pytest.raises(ValueError, match="unknown training stage 'rlhf'.*sft"):
        stage_spec("rlhf")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sft_on_two_gloo_processes_matches_one_process(snapshot_and_base, tmp_path):
    data_dir, base = snapshot_and_base
    single = launch_stage(
        "sft", _config(f"sft.per_device_train_batch_size={GLOBAL_BATCH}"), data_dir, tmp_path / "one", base
    )
    config = _config(f"sft.per_device_train_batch_size={GLOBAL_BATCH // 2}", "orchestration.num_processes=2")
    double = launch_stage("sft", config, data_dir, tmp_path / "two", base)

    # it really ran as two ranks: a distributed checkpoint names its RNG file by rank
    checkpoint = tmp_path / "two" / "checkpoints" / f"checkpoint-{STEPS}"
    assert (checkpoint / "rng_state_0.pth").exists() and not (checkpoint / "rng_state.pth").exists()
    assert not (tmp_path / "two" / ".ranks").exists(), "the other rank's private folder is cleaned up"
    assert (Path(double.model_dir) / "model.safetensors").exists()
    assert Path(double.output_dir) == tmp_path / "two"

    # the stage learned, so matching losses are not two untrained models agreeing
    assert double.metrics["eval/loss"] < 0.8 * double.metrics["eval/before_loss"]
    assert math.isclose(double.metrics["eval/before_loss"], single.metrics["eval/before_loss"], rel_tol=1e-4)
    assert math.isclose(double.metrics["eval/loss"], single.metrics["eval/loss"], rel_tol=0.05)
    assert math.isclose(double.metrics["train_loss"], single.metrics["train_loss"], rel_tol=0.05)
