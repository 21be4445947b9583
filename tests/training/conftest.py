"""Shared fixtures of the stage tests: a demo snapshot and one SFT policy trained once."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignflow.config import load_config

REPO = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO / "configs" / "demo.yaml"


def _demo_config(*overrides: str):
    return load_config(DEMO_CONFIG, list(overrides))


@pytest.fixture(scope="session")
def demo_config():
    """``demo_config("sft.max_steps=5", ...)``: configs/demo.yaml with overrides."""
    return _demo_config


@pytest.fixture(scope="session")
def demo_snapshot(tmp_path_factory) -> Path:
    from alignflow.data.demo import iter_demo_pairs
    from alignflow.data.snapshot import write_split

    data_dir = tmp_path_factory.mktemp("demo-snapshot")
    records = [dict(r, kind="pair") for r in iter_demo_pairs(800, seed=0)]
    write_split(data_dir, "train", records[:640])
    write_split(data_dir, "eval", records[640:])
    return data_dir


@pytest.fixture(scope="session")
def sft_result(tmp_path_factory, demo_snapshot):
    """The demo SFT policy, trained briefly so that it is good but not perfect."""
    from alignflow.training.sft import run_sft

    # 200 steps at 3e-3 (the demo's 500 take 1.5e-3): the learning tests need room above it
    config = _demo_config("sft.max_steps=200", "sft.learning_rate=0.003", "sft.save_steps=1000")
    return run_sft(config, demo_snapshot, tmp_path_factory.mktemp("sft"))


@pytest.fixture
def stage_tags(monkeypatch) -> dict[str, str]:
    """The tags a stage run sets on its tracking run, collected here instead of in MLflow."""
    from alignflow.training import stage

    tags: dict[str, str] = {}
    monkeypatch.setattr(stage.tracking, "set_tags", tags.update)
    return tags


@pytest.fixture(scope="session")
def task_accuracy_of():
    return _task_accuracy_of


def _task_accuracy_of(model_dir: str | Path, n: int = 100, seed: int = 123) -> float:
    """Greedy demo-task accuracy (correct AND formatted) on fresh prompts."""
    from alignflow.data.answers import task_accuracy
    from alignflow.data.demo import iter_demo_prompts
    from alignflow.models import load_causal_lm
    from alignflow.models.prompting import generate

    model, tokenizer = load_causal_lm(model_dir)
    prompts = list(iter_demo_prompts(n, seed=seed))
    outputs = generate(model, tokenizer, [p["prompt"] for p in prompts], max_new_tokens=10)
    return sum(task_accuracy(o, p["metadata"]["answer"]) for o, p in zip(outputs, prompts, strict=True)) / n
