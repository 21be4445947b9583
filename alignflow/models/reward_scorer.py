"""Scoring text with a trained reward model: the single way any stage turns text into rewards.

The reward model may use a different tokenizer from the policy (a MiniLM encoder judging
a Llama policy), so it always receives *text* and re-tokenises it with its own tokenizer,
exactly as the reward stage encoded its training data (:func:`encode_for_reward`).
The reward stage saves the reward mean/std beside the weights (``alignflow_reward.json``);
the scorer applies them so that downstream rewards have zero mean and unit variance.
How the model pools its tokens into a reward (``RewardMeta.pooling``) is saved there too and
applied by :func:`reward_logits`, the one forward pass training and every consumer share.
Pooling "answer" reads only the completion's tokens, located by :func:`encode_with_answer_span`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, PretrainedConfig

from alignflow.models.loading import ModelLoadError, load_pretrained, load_tokenizer, require_tokenizer_fits
from alignflow.models.positions import position_limit
from alignflow.models.prompting import Prompt, completion_text, format_prompt, text_key

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
    # "mean": the head on the attention-masked mean of the last hidden states;
    # "answer": the same mean over the completion's tokens only (the prompt still shapes them)
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
        try:
            return cls(**json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, TypeError) as exc:  # invalid JSON, unknown or missing fields
            raise ModelLoadError(f"{path}: not a reward-model description: {exc}") from exc


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


@lru_cache(maxsize=8)  # once per tokenizer, not once per scored row
def _special_tokens_around(tokenizer: Any) -> tuple[int, int]:
    """How many special tokens the tokenizer puts before and after a single text ([CLS] ... [SEP])."""
    core = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    for start in range(len(full) - len(core) + 1):
        if full[start : start + len(core)] == core:
            return start, len(full) - start - len(core)
    return 0, 0


def encode_with_answer_span(
    tokenizer: Any, prompt: Prompt, completion: Any, max_length: int
) -> tuple[list[int], tuple[int, int]]:
    """:func:`encode_for_reward` and the ``[start, end)`` positions of the completion's tokens in it.

    The completion (with the end marker) is the tail of the text, so its tokens are the last
    ones before the tokenizer's closing special tokens; left truncation can only cut the prompt
    (and, for a completion longer than ``max_length``, the completion's own head).
    """
    ids = encode_for_reward(tokenizer, prompt, completion, max_length)
    before, after = _special_tokens_around(tokenizer)
    end_marker = tokenizer.eos_token or tokenizer.sep_token or ""
    tail = completion_text(completion)
    tail += end_marker if end_marker and not tail.endswith(end_marker) else ""
    n_answer = len(tokenizer(tail, add_special_tokens=False)["input_ids"])
    end = len(ids) - after
    return ids, (max(before, end - n_answer), end)


def encode_reward_input(
    tokenizer: Any, prompt: Prompt, completion: Any, max_length: int, with_span: bool
) -> tuple[list[int], tuple[int, int] | None]:
    """The ids a reward model reads, and the answer's span only where it is pooled (``with_span``):
    locating the span costs a second tokenisation that the other poolings do not need."""
    if with_span:
        return encode_with_answer_span(tokenizer, prompt, completion, max_length)
    return encode_for_reward(tokenizer, prompt, completion, max_length), None


def span_mask(spans: Sequence[Sequence[int]], width: int) -> torch.Tensor:
    """``[n, width]`` float mask, 1 inside each row's ``[start, end)`` (rows padded on the right)."""
    positions = torch.arange(width)
    bounds = torch.as_tensor([list(s) for s in spans], dtype=torch.long).view(-1, 2)
    return ((positions >= bounds[:, :1]) & (positions < bounds[:, 1:])).float()


def padded_span_mask(
    tokenizer: Any, rows: Sequence[Sequence[int]], spans: Sequence[Sequence[int]], width: int
) -> torch.Tensor:
    """:func:`span_mask` for ``rows`` padded to ``width`` by ``tokenizer`` (left padding shifts spans)."""
    left = tokenizer.padding_side == "left"
    shifts = [(width - len(row)) * left for row in rows]
    return span_mask([(a + d, b + d) for (a, b), d in zip(spans, shifts, strict=True)], width)


def combine_heads(logits: torch.Tensor, weights: Sequence[float]) -> torch.Tensor:
    """One scalar per row from a model's objective heads: their weighted sum."""
    w = torch.as_tensor(list(weights), dtype=logits.dtype, device=logits.device)
    if logits.shape[-1] != w.numel():
        raise ValueError(f"reward model has {logits.shape[-1]} heads but {w.numel()} objective weights")
    return logits @ w


POOLINGS = ("model", "mean", "answer")


def peft_trainable_copy(module: Any) -> Any:
    """The copy PEFT trains of a module it was told to save (a LoRA reward model's head), else
    the module itself. PEFT keeps the copies in a ``ModuleDict`` keyed by adapter name."""
    copies = getattr(module, "modules_to_save", None)
    if copies is not None and "default" in copies:
        return copies["default"]
    return module


def classifier_parts(model: Any) -> tuple[Any, torch.nn.Module, Any]:
    """Body, linear head and head dropout of a ``*ForSequenceClassification`` model (PEFT-wrapped or not)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = getattr(inner, inner.base_model_prefix, None)
    head = getattr(inner, "classifier", None)
    head = getattr(inner, "score", None) if head is None else head
    linear = peft_trainable_copy(head)
    if body is None or head is None or not isinstance(linear, torch.nn.Linear):
        raise ValueError(f"{type(inner).__name__}: mean pooling needs a model body and a linear head")
    return body, head, getattr(inner, "dropout", None)


def reward_logits(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    pooling: str = "model",
    answer_mask: torch.Tensor | None = None,
):
    """Per-objective logits ``[n, n_objectives]`` under ``pooling`` (see :class:`RewardMeta`).

    all-MiniLM-L6-v2 was trained as a mean-pooled sentence encoder and its [CLS] pooler was
    not, so "mean" lets the reward head start from the representation the encoder learned.
    "answer" pools the completion's tokens only (``answer_mask``, from :func:`span_mask`): the
    prompt is the same on both sides of a pair, and in a mean over the whole text it dilutes
    what differs.
    """
    if pooling == "model":
        return model(input_ids=input_ids, attention_mask=attention_mask).logits
    if pooling not in POOLINGS:
        raise ValueError(f"unknown reward pooling {pooling!r}; expected one of {POOLINGS}")
    if pooling == "answer" and answer_mask is None:
        raise ValueError("reward pooling 'answer' needs answer_mask (see encode_with_answer_span)")
    body, head, dropout = classifier_parts(model)
    hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    if pooling == "mean":
        mask = attention_mask
    else:
        assert answer_mask is not None  # "answer" pooling: checked above
        mask = attention_mask * answer_mask.to(attention_mask.device)
    mask = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
    return head(dropout(pooled) if dropout is not None else pooled)


class RewardScorer:
    """Callable ``(prompts, completions) -> rewards`` over a saved reward model.

    ``remember``: score each (prompt, completion) once for the scorer's life. An evaluation
    asks for the same texts several times (win rates, reward means, the pinned set's verdicts,
    the held-out pairs it shares with the eval split): on the SmolLM2 HH run the reward model
    scored every text about three times, 74 of the evaluation's 268 s. Off by default: a
    training stage scores fresh samples that never come back.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        meta: RewardMeta,
        normalize: bool = True,
        batch_size: int = 32,
        remember: bool = False,
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.meta = meta
        self.normalize = normalize
        self.batch_size = batch_size
        self._remembered: dict[tuple[str, str], torch.Tensor] | None = {} if remember else None
        self.max_length = min(meta.max_length, position_limit(model, tokenizer) or meta.max_length)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def heads(self, prompts: Sequence[Prompt], completions: Sequence[Any]) -> torch.Tensor:
        """Raw per-objective outputs, shape ``[n, n_objectives]``."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if self._remembered is None:
            return self._forward(prompts, completions)
        keys = [(text_key(p), text_key(c)) for p, c in zip(prompts, completions, strict=True)]
        todo = {
            key: (p, c)
            for key, p, c in zip(keys, prompts, completions, strict=True)
            if key not in self._remembered
        }
        if todo:
            fresh = self._forward([p for p, _ in todo.values()], [c for _, c in todo.values()])
            self._remembered.update(zip(todo, fresh, strict=True))
        if not keys:
            return torch.zeros(0, len(self.meta.weights))
        return torch.stack([self._remembered[key] for key in keys])

    @torch.no_grad()
    def _forward(self, prompts: Sequence[Prompt], completions: Sequence[Any]) -> torch.Tensor:
        """The reward model's outputs for these rows, in batches of similar length."""
        with_span = self.meta.pooling == "answer"
        encoded: list[list[int]] = []
        spans: list[tuple[int, int]] = []  # one per row with_span, else none
        for p, c in zip(prompts, completions, strict=True):
            ids, span = encode_reward_input(self.tokenizer, p, c, self.max_length, with_span)
            encoded.append(ids)
            if span is not None:
                spans.append(span)
        # batches of similar length pad little; the rows go back to their order at the end
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
        parts = []
        for start in range(0, len(order), self.batch_size):
            index = order[start : start + self.batch_size]
            batch = self.tokenizer.pad(
                [{"input_ids": encoded[i]} for i in index], return_tensors="pt", padding=True
            ).to(self.device)
            answer = None
            if with_span:
                rows, row_spans = [encoded[i] for i in index], [spans[i] for i in index]
                answer = padded_span_mask(self.tokenizer, rows, row_spans, batch["input_ids"].shape[1])
            logits = reward_logits(
                self.model, batch["input_ids"], batch["attention_mask"], self.meta.pooling, answer
            )
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


def _weights_hint(config: PretrainedConfig) -> str:
    """How to use a classifier trained for something else (two-class sentiment, toxicity) as
    a reward: weigh its outputs in a description, e.g. the log-odds of the good class."""
    id2label: dict[Any, str] = dict(config.id2label or {})
    labels = [str(id2label.get(i, i)) for i in range(config.num_labels or len(id2label))]
    weights = [0.0] * len(labels)
    weights[-1], weights[0] = 1.0, -1.0
    example = json.dumps({"objectives": labels, "weights": weights})
    return (
        f"; to score with it, write {REWARD_META} giving each output a weight, e.g. {example} "
        f"for the log-odds of {labels[-1]!r} over {labels[0]!r}"
    )


def load_reward_scorer(
    path: str | Path,
    normalize: bool = True,
    device: str | torch.device | None = None,
    batch_size: int = 32,
    remember: bool = False,
) -> RewardScorer:
    """Load a reward model saved by the reward stage (weights, tokenizer, normalisation);
    ``remember``: see :class:`RewardScorer`."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: not a saved reward model (no config.json)")
    meta = RewardMeta.load(path)
    tokenizer = load_tokenizer(path)
    model = load_pretrained(AutoModelForSequenceClassification, path, "reward model", use_safetensors=True)
    require_tokenizer_fits(model, tokenizer, path)
    if model.config.num_labels != len(meta.weights):
        described = (path / REWARD_META).exists()
        raise ModelLoadError(
            f"{path}: the classifier has {model.config.num_labels} outputs but the reward model "
            f"combines {len(meta.weights)} objective(s) ({REWARD_META} "
            f"{'lists' if described else 'is absent, so one is expected'})"
            + ("" if described else _weights_hint(model.config))
        )
    if device is not None:
        model = model.to(device)
    return RewardScorer(model, tokenizer, meta, normalize=normalize, batch_size=batch_size, remember=remember)
