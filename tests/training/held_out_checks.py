"""What a stage that hands on its best held-out step must show, whichever stage it is."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file


def assert_hands_on_the_best_step(
    metrics: Mapping[str, float],
    scores: Mapping[int, float],
    model_dir: str | Path,
    start_dir: str | Path,
    rescored: str | None = None,
) -> int:
    """``scores`` (step -> held-out score, 0 the start) of a run whose learning rate wrecks the
    policy: its last step is not the best; the stage hands on the best (a tie goes to the
    earlier step), and says so; ``rescored``: the stage's final figure, the handed-on policy
    scored again. When the start was best, the handed-on weights are the start's. The best step."""
    best = max(scores, key=lambda step: (scores[step], -step))
    assert best != max(scores), f"a wrecking learning rate: the last step is not the best ({scores})"
    assert metrics["handed_on_step"] == best
    if rescored is not None:
        assert metrics[rescored] == pytest.approx(scores[best])
    if best == 0:
        handed = load_file(Path(model_dir) / "model.safetensors")
        start = load_file(Path(start_dir) / "model.safetensors")
        assert all(torch.equal(handed[k], start[k]) for k in start)
    return best
