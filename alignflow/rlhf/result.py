"""What a training run hands back, and keeps beside the models as ``training_results.json``.

The histories are per PPO iteration and come from what ran (the PPO stage's history
file), so a plot of ``reward_history`` shows the reward the policy actually collected.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

RESULTS_FILE = "training_results.json"


@dataclass
class TrainingResult:
    """Spec 002's result fields, plus where the numbers come from.

    ``final_reward_mean``/``final_reward_std``: the saved policy's greedy answers to the
    held-out prompts (``final_reward_n`` of them), scored raw by the reward model.
    ``reward_history``: mean reward of each iteration's sampled responses, on the scale PPO
    maximised (a saved reward model's output normalised by its training mean/std; a
    ``RewardModel`` object's own output); ``kl_history``: KL(policy || reference) per
    response; ``loss_history``: the PPO loss (policy + value - entropy terms);
    ``value_loss_history``: the value head's error.
    """

    model_path: str
    reward_model_path: str | None
    feedback_count: int
    final_reward_mean: float
    final_reward_std: float
    training_steps: int
    reward_history: list[float] = field(default_factory=list)
    kl_history: list[float] = field(default_factory=list)
    loss_history: list[float] = field(default_factory=list)
    value_loss_history: list[float] = field(default_factory=list)
    final_reward_n: int = 0
    reward_mode: str | None = None
    data_version: str | None = None
    resumed_from: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | Path) -> Path:
        """Write the result as JSON (atomically); a folder gets ``training_results.json`` inside."""
        path = Path(path)
        if path.is_dir():
            path = path / RESULTS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True), encoding="utf-8")
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> TrainingResult:
        """Read a result written by :meth:`save` (a file, or a folder holding ``training_results.json``).

        Keys this version does not know are ignored, so an older reader opens a newer file.
        """
        path = Path(path)
        if path.is_dir():
            path = path / RESULTS_FILE
        data = json.loads(path.read_text(encoding="utf-8"))
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
