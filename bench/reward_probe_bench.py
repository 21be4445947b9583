"""How far a frozen MiniLM carries on HH-RLHF harmless-base: linear heads on its features.

Issue #15 asks for >= 0.68 held-out accuracy with the packaged MiniLM. Fine-tuning runs cost
15-30 CPU minutes each (bench/reward_quality_bench.py), too few to search widely. This bench
asks a cheaper question first: how well does a Bradley-Terry head do on the *frozen*
encoder's features? Features take about a minute for every pair; each head fits in seconds,
so many views and regularisation strengths can be compared.

Views (mean-pooled hidden states of all seven layers, 7 x 384 values, or of layers 3-6):
- ``response``: the final answer alone (128 tokens);
- ``conversation``: the whole rendered conversation (left-truncated to 128 tokens);
- ``answer-in-context-128/256``: the conversation encoded, pooled over the answer's tokens
  only (the shared context shapes the answer's states but does not dilute the pool).

Protocol: hyperparameters (L2 strength, length-prior strength as in ``reward.length_debias``)
are chosen by 5-fold cross-validation on the train pairs only, as the best CV accuracy whose
CV length gap is within 0.08; the held-out pairs are scored once, by that choice. Equal-weight
ensembles of the chosen views are reported the same way. Nothing is chosen on held-out data.

A learning curve then refits the CV-picked ensemble (same views and settings) on random
fractions of the train pairs and scores the held-out pairs: how accuracy grows with the
number of labelled pairs, and how many pairs its trend would need for the issue's 0.68.

Run: ``python -m bench reward_probe`` (writes bench/results/reward_probe.{json,md}).
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = Path(__file__).resolve().parent / "results"
L2 = (0.1, 0.3, 1.0, 3.0)
DEBIAS = (0.0, 0.5, 1.0)
MAX_GAP = 0.08
FOLDS = 5
CURVE_FRACTIONS = (0.125, 0.25, 0.5, 0.75, 1.0)
CURVE_DRAWS = 5
TARGET = 0.68


def _encode(tokenizer, model, pairs, side: str, max_length: int, answer_only: bool, context: bool):
    """Per pair, the masked mean of every layer's hidden states: ``[n, layers, hidden]``."""
    import torch

    from alignflow.models.prompting import completion_text
    from alignflow.models.reward_scorer import encode_for_reward

    if context:
        ids = [encode_for_reward(tokenizer, p["prompt"], p[side], max_length) for p in pairs]
    else:
        ids = [encode_for_reward(tokenizer, "", completion_text(p[side]), max_length) for p in pairs]
    answer = [len(tokenizer(completion_text(p[side]), add_special_tokens=False)["input_ids"]) for p in pairs]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[Any] = [None] * len(ids)
    with torch.no_grad():
        for start in range(0, len(order), 64):
            index = order[start : start + 64]
            batch = tokenizer.pad([{"input_ids": ids[i]} for i in index], return_tensors="pt")
            mask = batch["attention_mask"].unsqueeze(-1).float()
            if answer_only:  # the answer's tokens sit just before the final [SEP]
                mask = torch.zeros_like(mask)
                for row, i in enumerate(index):
                    n = len(ids[i])
                    mask[row, n - 1 - min(answer[i], n - 2) : n - 1] = 1.0
            states = model(**batch, output_hidden_states=True).hidden_states
            pooled = torch.stack([(h * mask).sum(1) / mask.sum(1).clamp_min(1.0) for h in states], 1)
            for row, i in enumerate(index):
                out[i] = pooled[row].numpy()
    return np.stack(out)


def features(train, held_out) -> dict[str, dict[str, np.ndarray]]:
    """chosen - rejected feature differences per view, for the train and held-out pairs."""
    from transformers import AutoModel, AutoTokenizer

    from alignflow.models.factory import minilm_path

    path = str(minilm_path())
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    encodings = {
        "response": (128, False, False),
        "conversation": (128, False, True),
        "answer-in-context-128": (128, True, True),
        "answer-in-context-256": (256, True, True),
    }
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, (length, answer_only, context) in encodings.items():
        for split, pairs in (("train", train), ("held_out", held_out)):
            chosen = _encode(tokenizer, model, pairs, "chosen", length, answer_only, context)
            rejected = _encode(tokenizer, model, pairs, "rejected", length, answer_only, context)
            out.setdefault(f"{name}/all-layers", {})[split] = (chosen - rejected).reshape(len(pairs), -1)
            out.setdefault(f"{name}/layers-3-6", {})[split] = (chosen - rejected)[:, 3:].reshape(
                len(pairs), -1
            )
    return out


def accuracy_and_gap(margin: np.ndarray, length_diff: np.ndarray) -> tuple[float, float]:
    right = margin > 0
    longer, shorter = length_diff > 0, length_diff < 0
    return float(right.mean()), float(right[longer].mean() - right[shorter].mean())


def run() -> dict[str, Any]:
    from alignflow.data.pairing import load_optional_pairs, load_pairs
    from alignflow.evaluation.intervals import wilson
    from alignflow.training.noisy_pairs import fit_bradley_terry_probe
    from alignflow.training.reward import fit_length_prior, log_length_differences
    from bench.reward_quality_bench import prepare_snapshot

    with tempfile.TemporaryDirectory(prefix="alignflow-reward-probe-") as tmp:
        data_dir = prepare_snapshot(Path(tmp))
        train, held_out = load_pairs(data_dir, "train"), load_optional_pairs(data_dir, "eval", None)
    views = features(train, held_out)
    d_train, d_held = log_length_differences(train), log_length_differences(held_out)
    prior = fit_length_prior(train)
    folds = np.random.default_rng(0).permutation(np.arange(len(train)) % FOLDS)

    chosen: dict[str, dict[str, Any]] = {}
    for view, data in views.items():
        best = None
        for l2, debias in itertools.product(L2, DEBIAS):
            cv_margin = np.zeros(len(train))
            for k in range(FOLDS):
                fit, score = folds != k, folds == k
                w = fit_bradley_terry_probe(data["train"][fit], l2, debias * prior * d_train[fit])
                cv_margin[score] = data["train"][score] @ w
            acc, gap = accuracy_and_gap(cv_margin, d_train)
            if abs(gap) <= MAX_GAP and (best is None or acc > best["cv_accuracy"]):
                best = {"l2": l2, "debias": debias, "cv_accuracy": acc, "cv_gap": gap, "_cv": cv_margin}
        if best is None:
            continue
        w = fit_bradley_terry_probe(data["train"], best["l2"], best["debias"] * prior * d_train)
        best["_held"] = data["held_out"] @ w
        chosen[view] = best

    rows = []
    for size in range(1, len(chosen) + 1):
        for combo in itertools.combinations(chosen, size):
            cv = sum(chosen[v]["_cv"] / chosen[v]["_cv"].std() for v in combo)
            held = sum(chosen[v]["_held"] / chosen[v]["_cv"].std() for v in combo)
            cv_acc, cv_gap = accuracy_and_gap(cv, d_train)
            acc, gap = accuracy_and_gap(held, d_held)
            interval = wilson(int(round(acc * len(held_out))), len(held_out))
            rows.append(
                {
                    "views": list(combo),
                    "settings": {v: {"l2": chosen[v]["l2"], "debias": chosen[v]["debias"]} for v in combo},
                    "cv_accuracy": round(cv_acc, 3),
                    "cv_gap": round(cv_gap, 3),
                    "held_out_accuracy": round(acc, 3),
                    "held_out_ci": [round(interval.low, 3), round(interval.high, 3)],
                    "held_out_gap": round(gap, 3),
                }
            )
    pick = max((r for r in rows if abs(r["cv_gap"]) <= MAX_GAP), key=lambda r: r["cv_accuracy"])
    curve = learning_curve(views, pick["settings"], train, d_train, d_held)
    result = {
        "train_pairs": len(train),
        "held_out_pairs": len(held_out),
        "protocol": f"{FOLDS}-fold CV on train picks L2 and debias per view (|CV gap| <= {MAX_GAP}); "
        "held-out scored once",
        "rows": sorted(rows, key=lambda r: -r["cv_accuracy"]),
        "picked_by_cv": pick,
        "best_held_out_accuracy_any_row": max(r["held_out_accuracy"] for r in rows),
        "learning_curve": curve,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "reward_probe.md").write_text(_markdown(result), encoding="utf-8")
    return result


def learning_curve(
    views: dict[str, dict[str, np.ndarray]],
    settings: dict[str, dict[str, float]],
    train: list[dict[str, Any]],
    d_train: np.ndarray,
    d_held: np.ndarray,
) -> dict[str, Any]:
    """Held-out accuracy of the picked ensemble refitted on random fractions of the train pairs
    (mean and spread over draws), and the trend's gain per doubling of pairs (least squares on
    log2 of the count) with the count at which that trend would reach ``TARGET``."""
    from alignflow.training.noisy_pairs import fit_bradley_terry_probe
    from alignflow.training.reward import fit_length_prior

    points = []
    for fraction in CURVE_FRACTIONS:
        size = int(round(fraction * len(train)))
        draws = 1 if size == len(train) else CURVE_DRAWS
        accuracies, gaps = [], []
        for draw in range(draws):
            index = np.sort(np.random.default_rng(draw).permutation(len(train))[:size])
            prior = fit_length_prior([train[i] for i in index])
            held = 0.0
            for view, s in settings.items():
                x = views[view]["train"][index]
                w = fit_bradley_terry_probe(x, s["l2"], s["debias"] * prior * d_train[index])
                held = held + views[view]["held_out"] @ w / (x @ w).std()
            accuracy, gap = accuracy_and_gap(held, d_held)
            accuracies.append(accuracy)
            gaps.append(gap)
        points.append(
            {
                "train_pairs": size,
                "draws": draws,
                "held_out_accuracy": round(float(np.mean(accuracies)), 3),
                "spread": round(float(np.std(accuracies)), 3),
                "held_out_gap": round(float(np.mean(gaps)), 3),
            }
        )
    log2n = np.log2([p["train_pairs"] for p in points])
    slope, intercept = np.polyfit(log2n, [p["held_out_accuracy"] for p in points], 1)
    return {
        "points": points,
        "gain_per_doubling": round(float(slope), 3),
        "pairs_for_target_by_trend": int(round(2 ** ((TARGET - intercept) / slope))) if slope > 0 else None,
        "target": TARGET,
    }


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Frozen MiniLM + linear Bradley-Terry heads on HH-RLHF harmless-base",
        "",
        f"{result['train_pairs']} train / {result['held_out_pairs']} held-out pairs (the project's"
        f" prompt-disjoint split). {result['protocol']}. Written by `python -m bench reward_probe`;"
        " its docstring describes the views.",
        "",
        "| views | CV accuracy | CV gap | held-out accuracy [95% CI] | held-out gap |",
        "|---|---|---|---|---|",
    ]
    for r in result["rows"][:15]:
        ci = r["held_out_ci"]
        lines.append(
            f"| {' + '.join(r['views'])} | {r['cv_accuracy']} | {r['cv_gap']} |"
            f" {r['held_out_accuracy']} [{ci[0]}, {ci[1]}] | {r['held_out_gap']} |"
        )
    pick = result["picked_by_cv"]
    lines += [
        "",
        f"Picked by CV: {' + '.join(pick['views'])}, held-out {pick['held_out_accuracy']} (gap"
        f" {pick['held_out_gap']}). Best held-out accuracy of any row, chosen after the fact:"
        f" {result['best_held_out_accuracy_any_row']}.",
    ]
    curve = result["learning_curve"]
    lines += [
        "",
        "## Learning curve",
        "",
        "The picked ensemble (same views and settings) refitted on random fractions of the train pairs;"
        f" held-out accuracy is the mean over {CURVE_DRAWS} draws (one at the full set), each view's"
        " margin scaled by the spread of its train margins.",
        "",
        "| train pairs | held-out accuracy | spread over draws | held-out gap |",
        "|---|---|---|---|",
    ]
    for p in curve["points"]:
        figures = (p["train_pairs"], p["held_out_accuracy"], p["spread"], p["held_out_gap"])
        lines.append("| " + " | ".join(map(str, figures)) + " |")
    lines += [
        "",
        f"Trend (least squares on log2 of the pairs): {curve['gain_per_doubling']:+} accuracy per doubling"
        f" of the train pairs; it reaches {curve['target']} at about {curve['pairs_for_target_by_trend']}"
        " pairs. An extrapolation, not a measurement: it says how far the shared file's pairs are from"
        " the target, not that more pairs would reach it exactly there.",
    ]
    return "\n".join(lines) + "\n"
