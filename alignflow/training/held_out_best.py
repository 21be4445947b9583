"""The training step whose held-out score was best, kept so that a stage hands it on.

An RL stage's training reward can keep climbing while what it is meant to improve falls
(a reward model being gamed, an answer format drifting). A stage that scores a small
held-out set every few steps keeps the trainable weights of its best-scoring step here,
on disk beside its checkpoints (written whole, then renamed, so a killed run resumes with
it), and hands that policy on instead of the last one, saying which step it was.

Step 0 is the model the stage started from: when no step beat it, the start is handed on.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import TrainerCallback

from alignflow.registry import tracking
from alignflow.rl.checkpoint_files import move_into_place, staging_folder

BEST = "best"
WEIGHTS = "trainable.safetensors"
RECORD = "best.json"


def trainable_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the parameters that train (a LoRA run's adapters; every weight otherwise)."""
    return {
        n: p.detach().to("cpu").contiguous().clone() for n, p in model.named_parameters() if p.requires_grad
    }


class HeldOutBest:
    """The best held-out score so far, its step, and that step's trainable weights on disk."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder) / BEST
        self.step: int | None = None
        self.score: float | None = None

    def offer(self, step: int, score: float, model: torch.nn.Module) -> bool:
        """Keep ``model``'s trainable weights when ``score`` beats the best so far (ties keep the
        earlier step: fewer updates for the same score); True when it did."""
        if self.score is not None and score <= self.score:
            return False
        staging = staging_folder(self.folder.parent)
        staging.mkdir()
        save_file(trainable_weights(model), str(staging / WEIGHTS))
        (staging / RECORD).write_text(json.dumps({"step": step, "score": score}), encoding="utf-8")
        move_into_place(staging, self.folder, None)
        self.step, self.score = step, score
        return True

    def resume(self, upto: int) -> None:
        """Read the best kept by an earlier, interrupted run; a best from past ``upto`` (the
        checkpoint resumed from) is dropped: those steps are trained again."""
        record = self.folder / RECORD
        if not record.exists():
            return
        kept = json.loads(record.read_text(encoding="utf-8"))
        if int(kept["step"]) > upto:
            shutil.rmtree(self.folder)
            return
        self.step, self.score = int(kept["step"]), float(kept["score"])

    def restore(self, model: torch.nn.Module) -> None:
        """Put the best step's trainable weights back into ``model``."""
        weights: dict[str, Any] = load_file(str(self.folder / WEIGHTS))
        missing = set(weights) - {n for n, _ in model.named_parameters()}
        if missing:
            raise ValueError(f"{self.folder}: weights of parameters the model lacks: {sorted(missing)[:3]}")
        model.load_state_dict(weights, strict=False)


class HeldOutCurve(TrainerCallback):
    """For a Trainer-based stage: every ``every`` optimizer steps, score the held-out set
    (``score``, higher is better), log it as ``key`` beside the training figures, and offer the
    step to ``best`` (None: keep none, the last step is handed on).

    At the start, a fresh run logs and offers its starting model as step 0 (``start_score``: the score
    the stage measured before training; None: scored here); a resumed run reads the best the
    interrupted one kept.
    """

    def __init__(
        self,
        every: int,
        score: Callable[[], float],
        key: str,
        model: torch.nn.Module,
        best: HeldOutBest | None,
        start_score: Callable[[], float | None] | None = None,
    ) -> None:
        self.every, self.score, self.key, self.model = every, score, key, model
        self.best, self.start_score = best, start_score or score

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step:  # resumed: the curve's start and the best so far were kept
            if self.best is not None:
                self.best.resume(state.global_step)
            return
        start = self.start_score()
        if start is None:
            return
        tracking.log_metrics({self.key: start}, step=0)  # the curve starts where the stage started
        if self.best is not None:
            self.best.offer(0, start, self.model)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.every or state.global_step % self.every or not state.is_world_process_zero:
            return
        value = self.score()
        tracking.log_metrics({self.key: value}, step=state.global_step)
        if self.best is not None:
            self.best.offer(state.global_step, value, self.model)

    def hand_on(self, last_step: int) -> int:
        """Put the best step's weights back where it was not the last; the step handed on."""
        if self.best is None or self.best.step is None or self.best.step == last_step:
            return last_step
        self.best.restore(self.model)
        return self.best.step
