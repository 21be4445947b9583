"""Setting aside preference pairs whose label looks wrong, before a reward model learns from them.

Human preference labels are noisy: many comparisons have no clear winner and annotators
disagree on them. A small reward model trained on such data spends part of its few steps
fitting the flips. The remedy of confident learning is to score every train pair
*out-of-fold* with a cheap model and to set aside the pairs whose given label it finds least
plausible. The cheap model here is a Bradley-Terry linear probe on the frozen backbone: for
each side of a pair, the mean of every layer's hidden states over the answer's tokens, once
read in the context of its prompt and once alone, and the chosen-minus-rejected difference of
those features. The pairs set aside are returned with their probability so the stage writes
them out (nothing is dropped silently).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from alignflow.models.reward_scorer import classifier_parts, encode_with_answer_span, padded_span_mask

PROBE_L2 = 1.0  # per standardised feature; the frozen-probe bench found 0.3-3 alike
PROBE_FOLDS = 5
PROBE_BATCH = 64
NOISY_PAIRS_FILE = "noisy_pairs.jsonl"
SET_ASIDE_REASON = "label_implausible_to_probe"


@dataclass(frozen=True)
class NoisyPairs:
    """Which train pairs were set aside, and the out-of-fold probability of each pair's label."""

    indices: list[int]
    label_probability: np.ndarray

    def kept(self, n_pairs: int) -> list[int]:
        dropped = set(self.indices)
        return [i for i in range(n_pairs) if i not in dropped]


@torch.no_grad()
def answer_layer_means(
    model: Any, tokenizer: Any, prompts: list[Any], completions: list[Any], max_length: int
) -> np.ndarray:
    """``[n, layers * hidden]``: per row, the mean of every layer's hidden states over the answer's tokens."""
    body = classifier_parts(model)[0]
    was_training = body.training
    body.eval()
    encoded = [
        encode_with_answer_span(tokenizer, p, c, max_length)
        for p, c in zip(prompts, completions, strict=True)
    ]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    out: dict[int, np.ndarray] = {}  # by row; every row is filled below
    device = next(body.parameters()).device
    for start in range(0, len(order), PROBE_BATCH):
        index = order[start : start + PROBE_BATCH]
        rows = [encoded[i][0] for i in index]
        batch = tokenizer.pad({"input_ids": rows}, return_tensors="pt")
        attention = batch["attention_mask"]
        answer = padded_span_mask(tokenizer, rows, [encoded[i][1] for i in index], attention.shape[1])
        states = body(
            input_ids=batch["input_ids"].to(device),
            attention_mask=attention.to(device),
            output_hidden_states=True,
        ).hidden_states
        mask = (answer * attention).unsqueeze(-1).to(device)
        pooled = torch.cat([(h.float() * mask).sum(1) / mask.sum(1).clamp_min(1.0) for h in states], dim=-1)
        for row, i in enumerate(index):
            out[i] = pooled[row].cpu().numpy()
    body.train(was_training)
    return np.stack([out[i] for i in range(len(encoded))])


def pair_feature_views(
    model: Any, tokenizer: Any, pairs: list[dict[str, Any]], max_length: int
) -> list[np.ndarray]:
    """Chosen-minus-rejected features per pair, one array per view: answer in context, answer alone."""
    views = []
    for prompts in ([p["prompt"] for p in pairs], [""] * len(pairs)):
        chosen, rejected = (
            answer_layer_means(model, tokenizer, prompts, [p[side] for p in pairs], max_length)
            for side in ("chosen", "rejected")
        )
        views.append(chosen - rejected)
    return views


def fit_bradley_terry_probe(diff: np.ndarray, l2: float, offset: np.ndarray) -> np.ndarray:
    """Weights ``w`` of P(chosen wins) = sigmoid(diff @ w + offset), L2-penalised on standardised features."""
    scale = diff.std(0) + 1e-6
    x = torch.tensor(diff / scale, dtype=torch.float32)
    b = torch.tensor(offset, dtype=torch.float32)
    w = torch.zeros(x.shape[1], requires_grad=True)
    optimizer = torch.optim.LBFGS([w], max_iter=300, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.softplus(-(x @ w + b)).mean() + l2 * (w * w).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return w.detach().numpy() / scale


def out_of_fold_margins(
    diff: np.ndarray, offset: np.ndarray, folds: np.ndarray, l2: float = PROBE_L2
) -> np.ndarray:
    """Each pair's probe margin from a probe fitted on the other folds only."""
    margins = np.zeros(len(diff))
    for k in np.unique(folds):
        fit, held = folds != k, folds == k
        margins[held] = diff[held] @ fit_bradley_terry_probe(diff[fit], l2, offset[fit])
    return margins


def calibrate(logit: np.ndarray) -> np.ndarray:
    """P(the given label) = sigmoid(a * logit), ``a`` by maximum likelihood (the labels are all
    'chosen wins', so one temperature is all a calibration can fit)."""
    a = 1.0
    for _ in range(50):  # Newton's method on the concave log-likelihood in a
        p = 1.0 / (1.0 + np.exp(-a * logit))
        step = ((1.0 - p) * logit).sum() / max((p * (1.0 - p) * logit * logit).sum(), 1e-12)
        a += step
        if abs(step) < 1e-8:
            break
    return 1.0 / (1.0 + np.exp(-a * logit))


def find_noisy_pairs(
    model: Any,
    tokenizer: Any,
    pairs: list[dict[str, Any]],
    fraction: float,
    max_length: int,
    prior_logit: np.ndarray,
    seed: int,
) -> NoisyPairs:
    """The ``fraction`` of ``pairs`` whose label the answers' content, out of fold, finds least plausible.

    The probe is fitted with ``prior_logit`` (the stage's length prior) as a fixed offset, so
    its weights explain what length does not; pairs are ranked by those weights alone. Ranked
    with the prior added, the pairs that go against it would look least plausible and the
    filter would leave the data more one-sided about length than it was. The price: a label
    that only its length argues against is never set aside.
    """
    n_drop = int(round(fraction * len(pairs)))
    if n_drop == 0:  # too few pairs for this fraction: nothing to judge
        return NoisyPairs([], np.full(len(pairs), np.nan))
    folds = np.random.default_rng(seed).permutation(np.arange(len(pairs)) % PROBE_FOLDS)
    views = pair_feature_views(model, tokenizer, pairs, max_length)
    margins = [out_of_fold_margins(v, prior_logit, folds) for v in views]
    probability = calibrate(np.mean([m / max(m.std(), 1e-12) for m in margins], axis=0))
    return NoisyPairs(sorted(np.argsort(probability, kind="stable")[:n_drop].tolist()), probability)


def write_noisy_pairs(path: Path, pairs: list[dict[str, Any]], noisy: NoisyPairs) -> Path:
    """One JSON line per pair set aside: its index in the train split, why, the probability, the pair."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for i in noisy.indices:
            pair = {k: pairs[i][k] for k in ("prompt", "chosen", "rejected") if k in pairs[i]}
            record = {"train_index": i, "reason": SET_ASIDE_REASON}
            record["label_probability"] = round(float(noisy.label_probability[i]), 4)
            out.write(json.dumps(record | pair, ensure_ascii=False) + "\n")
    return path
