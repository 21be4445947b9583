"""Feedback as torch datasets: rated responses for the reward model, distinct prompts for PPO.

Rated responses are encoded exactly as the reward stage encodes its training rows
(:func:`~alignflow.models.reward_scorer.encode_for_reward`), so a model trained on this
dataset reads text the way it will be scored later. Scores are rescaled by a
:class:`ScoreScale` kept with the dataset (and shared by its splits), whose ``inverse``
maps a prediction back onto the raters' [0, 1] scale.
"""

from __future__ import annotations

import copy
import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils.data import Dataset

from alignflow.data.split import prompt_key
from alignflow.models.reward_scorer import encode_for_reward
from alignflow.rlhf.feedback import feedback_records, is_rating

Normalization = Literal["minmax", "zscore", "none"]


@dataclass(frozen=True)
class ScoreScale:
    """``target = (score - shift) / scale``.

    ``minmax``: the lowest observed score maps to 0 and the highest to 1 (scores already
    span [0, 1] when raters used the whole range, then nothing changes); ``zscore``: mean 0,
    standard deviation 1; ``none``: scores as given. A constant score gets scale 1.
    """

    method: Normalization = "none"
    shift: float = 0.0
    scale: float = 1.0

    @classmethod
    def fit(cls, scores: Sequence[float], method: Normalization) -> ScoreScale:
        if method not in ("minmax", "zscore", "none"):
            raise ValueError(f"normalization must be 'minmax', 'zscore' or 'none', got {method!r}")
        if method == "none" or not scores:
            return cls(method)
        if method == "minmax":
            low, high = min(scores), max(scores)
            return cls(method, low, (high - low) or 1.0)
        spread = statistics.pstdev(scores) if len(scores) > 1 else 0.0
        return cls(method, statistics.fmean(scores), spread or 1.0)

    def apply(self, score: float) -> float:
        return (float(score) - self.shift) / self.scale

    def inverse(self, value: float) -> float:
        return float(value) * self.scale + self.shift


class FeedbackDataset(Dataset):
    """Rated responses: ``input_ids``, ``attention_mask`` and the normalised score (``labels``)."""

    def __init__(
        self,
        feedbacks: Iterable[Any],
        tokenizer: Any,
        max_length: int = 512,
        normalization: Normalization = "minmax",
        scale: ScoreScale | None = None,
    ):
        records = feedback_records(feedbacks)
        for i, record in enumerate(records):
            if not is_rating(record):
                raise ValueError(
                    f"feedback[{i}]: FeedbackDataset holds ratings (prompt, response, score); "
                    "comparisons train through RLHFTrainer"
                )
        self.records = records
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.scale = scale or ScoreScale.fit([r["score"] for r in records], normalization)
        self._encoded = [
            encode_for_reward(tokenizer, r["prompt"], r["response"], max_length) for r in records
        ]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self._encoded[index]
        return {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "attention_mask": torch.ones(len(ids), dtype=torch.long),
            "labels": torch.tensor(self.scale.apply(self.records[index]["score"]), dtype=torch.float32),
        }

    @property
    def scores(self) -> list[float]:
        """The raters' scores, as given."""
        return [r["score"] for r in self.records]

    @property
    def targets(self) -> list[float]:
        """The scores after normalisation: what a reward model trained on this dataset predicts."""
        return [self.scale.apply(s) for s in self.scores]

    @property
    def prompts(self) -> list[Any]:
        return [r["prompt"] for r in self.records]

    def subset(self, indices: Sequence[int]) -> FeedbackDataset:
        """The rows at ``indices``, with this dataset's tokenizer, length and score scale."""
        part = copy.copy(self)  # the rows are already checked and encoded: slice, do not redo
        part.records = [self.records[i] for i in indices]
        part._encoded = [self._encoded[i] for i in indices]
        return part

    def split(self, val_fraction: float = 0.2, seed: int = 0) -> tuple[FeedbackDataset, FeedbackDataset]:
        """(train, val) by prompt, so that no prompt sits on both sides.

        ``val_fraction`` of the distinct prompts (rounded up, at least one while there are
        two prompts or more) go to val, drawn with ``seed``.
        """
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
        keys = list(dict.fromkeys(prompt_key(p) for p in self.prompts))
        random.Random(seed).shuffle(keys)
        n_val = min(math.ceil(val_fraction * len(keys)), len(keys) - 1) if val_fraction else 0
        held_out = set(keys[: max(n_val, 0)])
        val = [i for i, p in enumerate(self.prompts) if prompt_key(p) in held_out]
        train = [i for i, p in enumerate(self.prompts) if prompt_key(p) not in held_out]
        return self.subset(train), self.subset(val)

    def snapshot_records(self) -> list[dict[str, Any]]:
        """The rows as the snapshot's scored records, scored with the normalised targets."""
        return [
            {
                "id": r["id"],
                "kind": "scored",
                "prompt": r["prompt"],
                "completion": r["response"],
                "score": target,
                "metadata": {**(r.get("metadata") or {}), "raw_score": r["score"]},
            }
            for r, target in zip(self.records, self.targets, strict=True)
        ]

    def collate(self, items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Right-padded batch (``DataLoader(ds, collate_fn=ds.collate)``)."""
        width = max(len(item["input_ids"]) for item in items)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(items), width), pad, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, item in enumerate(items):
            ids[row, : len(item["input_ids"])] = item["input_ids"]
            mask[row, : len(item["input_ids"])] = 1
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.stack([i["labels"] for i in items])}


class PPODataset(Dataset):
    """The distinct prompts of some feedback (ratings or comparisons), in first-seen order.

    Items are ``{"prompt": ...}``; with a tokenizer also ``query`` (the prompt as the policy
    sees it, :func:`~alignflow.models.prompting.format_prompt`) and its ``input_ids``.
    """

    def __init__(self, feedbacks: Iterable[Any], tokenizer: Any = None):
        records = feedback_records(feedbacks)
        distinct: dict[str, Any] = {}
        for record in records:
            distinct.setdefault(prompt_key(record["prompt"]), record["prompt"])
        self.prompts = list(distinct.values())
        self.tokenizer = tokenizer

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> dict[str, Any]:
        prompt = self.prompts[index]
        if self.tokenizer is None:
            return {"prompt": prompt}
        from alignflow.models.prompting import format_prompt

        query = format_prompt(self.tokenizer, prompt)
        ids = self.tokenizer(query, add_special_tokens=False)["input_ids"]
        return {"prompt": prompt, "query": query, "input_ids": torch.tensor(ids, dtype=torch.long)}
