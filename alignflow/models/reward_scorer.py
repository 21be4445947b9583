"""Scoring text with a trained reward model: the single way any stage turns text into rewards.

The reward model may use a different tokenizer from the policy (a MiniLM encoder judging
a Llama policy), so it always receives *text* and re-tokenises it with its own tokenizer,
exactly as the reward stage encoded its training data (:func:`encode_for_reward`).
The reward stage saves the reward mean/std beside the weights (``alignflow_reward.json``);
the scorer applies them so that downstream rewards have zero mean and unit variance.
How the model pools its tokens into a reward (``RewardMeta.pooling``) is saved there too and
applied by :func:`reward_logits`, the one forward pass training and every consumer share.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from alignflow.models.prompting import Prompt, completion_text, format_prompt

REWARD_META = "alignflow_reward.json"


@dataclass
class RewardMeta:
    """What a reward model needs beside its weights to be used correctly downstream."""

    mean: float = 0.0
    std: float = 1.0
    objectives: list[str] = field(default_factory=lambda: ["reward"])
    weights: list[float] = field(default_factory=lambda: [1.0])
    max_length: int = 512
    mode: str = "pairwise"
    # "model": the architecture's own head (BERT's [CLS] pooler, a decoder's last token);
    # "mean": the head on the attention-masked mean of the last hidden states
    pooling: str = "model"
    metrics: dict[str, float] = field(default_factory=dict)

    def save(self, model_dir: str | Path) -> Path:
        path = Path(model_dir) / REWARD_META
        path.write_text(json.dumps(asdict(self), indent=2, sort_keys=True), encoding="utf-8")
        return path

    @classmethod
    def load(cls, model_dir: str | Path) -> RewardMeta:
        path = Path(model_dir) / REWARD_META
        if not path.exists():
            return cls()
        return cls(**json.loads(path.read_text(encoding="utf-8")))


def reward_text(tokenizer: Any, prompt: Prompt, completion: str | list[dict[str, str]]) -> str:
    """The text a reward model reads: the policy-style prompt, the completion, an end marker."""
    end = tokenizer.eos_token or tokenizer.sep_token or ""
    text = format_prompt(tokenizer, prompt) + completion_text(completion)
    return text if not end or text.endswith(end) else text + end


def encode_for_reward(tokenizer: Any, prompt: Prompt, completion: Any, max_length: int) -> list[int]:
    """Token ids of one (prompt, completion), truncated from the left so the response survives."""
    side = tokenizer.truncation_side
    tokenizer.truncation_side = "left"
    try:
        ids = tokenizer(reward_text(tokenizer, prompt, completion), truncation=True, max_length=max_length)
    finally:
        tokenizer.truncation_side = side
    return ids["input_ids"]


def combine_heads(logits: torch.Tensor, weights: Sequence[float]) -> torch.Tensor:
    """One scalar per row from a model's objective heads: their weighted sum."""
    w = torch.as_tensor(list(weights), dtype=logits.dtype, device=logits.device)
    if logits.shape[-1] != w.numel():
        raise ValueError(f"reward model has {logits.shape[-1]} heads but {w.numel()} objective weights")
    return logits @ w


POOLINGS = ("model", "mean")


def _parts(model: Any) -> tuple[Any, torch.nn.Module, Any]:
    """Body, linear head and head dropout of a ``*ForSequenceClassification`` model (PEFT-wrapped or not)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = getattr(inner, inner.base_model_prefix, None)
    head = getattr(inner, "classifier", None)
    head = getattr(inner, "score", None) if head is None else head
    linear = getattr(head, "modules_to_save", {}).get("default", head)  # PEFT keeps a trainable copy
    if body is None or not isinstance(linear, torch.nn.Linear):
        raise ValueError(f"{type(inner).__name__}: mean pooling needs a model body and a linear head")
    return body, head, getattr(inner, "dropout", None)


def reward_logits(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, pooling: str = "model"):
    """Per-objective logits ``[n, n_objectives]`` under ``pooling`` (see :class:`RewardMeta`).

    all-MiniLM-L6-v2 was trained as a mean-pooled sentence encoder and its [CLS] pooler was
    not, so "mean" lets the reward head start from the representation the encoder learned.
    """
    if pooling == "model":
        return model(input_ids=input_ids, attention_mask=attention_mask).logits
    if pooling != "mean":
        raise ValueError(f"unknown reward pooling {pooling!r}; expected one of {POOLINGS}")
    body, head, dropout = _parts(model)
    hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
    return head(dropout(pooled) if dropout is not None else pooled)


class RewardScorer:
    """Callable ``(prompts, completions) -> rewards`` over a saved reward model."""

    def __init__(
        self, model: Any, tokenizer: Any, meta: RewardMeta, normalize: bool = True, batch_size: int = 32
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.meta = meta
        self.normalize = normalize
        self.batch_size = batch_size
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.no_grad()
    def heads(self, prompts: Sequence[Prompt], completions: Sequence[Any]) -> torch.Tensor:
        """Raw per-objective outputs, shape ``[n, n_objectives]``."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        encoded = [
            encode_for_reward(self.tokenizer, p, c, self.meta.max_length)
            for p, c in zip(prompts, completions, strict=True)
        ]
        # batches of similar length pad little; the rows go back to their order at the end
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        parts = []
        for start in range(0, len(order), self.batch_size):
            index = order[start : start + self.batch_size]
            batch = self.tokenizer.pad(
                [{"input_ids": encoded[i]} for i in index], return_tensors="pt", padding=True
            ).to(self.device)
            logits = reward_logits(self.model, batch["input_ids"], batch["attention_mask"], self.meta.pooling)
            parts.append(logits.float().cpu())
        if not parts:
            return torch.zeros(0, len(self.meta.weights))
        out = torch.empty_like(torch.cat(parts))
        out[order] = torch.cat(parts)
        return out

    def raw(self, prompts: Sequence[Prompt], completions: Sequence[Any]) -> list[float]:
        """Weighted-sum rewards before normalisation."""
        return combine_heads(self.heads(prompts, completions), self.meta.weights).tolist()

    def __call__(self, prompts: Sequence[Prompt], completions: Sequence[Any]) -> list[float]:
        rewards = self.raw(prompts, completions)
        if not self.normalize:
            return rewards
        std = self.meta.std if self.meta.std > 1e-8 else 1.0
        return [(r - self.meta.mean) / std for r in rewards]


def load_reward_scorer(
    path: str | Path, normalize: bool = True, device: str | torch.device | None = None, batch_size: int = 32
) -> RewardScorer:
    """Load a reward model saved by the reward stage (weights, tokenizer, normalisation)."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: not a saved reward model (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, use_safetensors=True)
    if device is not None:
        model = model.to(device)
    return RewardScorer(model, tokenizer, RewardMeta.load(path), normalize=normalize, batch_size=batch_size)
