"""Pairwise judges: which of two completions of the same prompt is better.

A judge returns, per prompt, 1.0 when ``a`` wins, 0.0 when ``b`` wins, 0.5 for a tie and
``None`` when it cannot tell (no reference answer). Win rates are means over judged rows.
Anything with that ``compare`` method is a judge, so an LLM-as-judge or a human-label
lookup plugs in without touching the evaluation code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from alignflow.data.answers import task_accuracy

Scorer = Callable[[Sequence[Any], Sequence[Any]], list[float]]
Verdict = float | None


@runtime_checkable
class Judge(Protocol):
    name: str

    def compare(
        self,
        prompts: Sequence[Any],
        a: Sequence[str],
        b: Sequence[str],
        metadata: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[Verdict]: ...


def _verdict(score_a: float, score_b: float, tie_margin: float) -> float:
    if abs(score_a - score_b) <= tie_margin:
        return 0.5
    return 1.0 if score_a > score_b else 0.0


def _check_lengths(prompts: Sequence[Any], a: Sequence[str], b: Sequence[str]) -> None:
    if not len(prompts) == len(a) == len(b):
        raise ValueError(
            f"judge needs equal lengths: {len(prompts)} prompts, {len(a)} vs {len(b)} completions"
        )


class RewardModelJudge:
    """Prefers the completion the reward model scores higher (ties within ``tie_margin``)."""

    name = "reward"

    def __init__(self, scorer: Scorer, tie_margin: float = 0.0):
        self.scorer = scorer
        self.tie_margin = tie_margin

    def compare(self, prompts, a, b, metadata=None) -> list[Verdict]:
        _check_lengths(prompts, a, b)
        scores = self.scorer(list(prompts) * 2, list(a) + list(b))
        n = len(prompts)
        return [_verdict(scores[i], scores[n + i], self.tie_margin) for i in range(n)]


class AnswerJudge:
    """Prefers the completion that gets the verifiable answer right (``metadata['answer']``).

    ``score`` maps ``(completion, answer)`` to [0, 1]; the default is the demo task's strict
    accuracy (right number, required format). Rows without an answer are not judged.
    """

    name = "answer"

    def __init__(self, score: Callable[[str, Any], float] = task_accuracy, answer_key: str = "answer"):
        self.score = score
        self.answer_key = answer_key

    def compare(self, prompts, a, b, metadata=None) -> list[Verdict]:
        _check_lengths(prompts, a, b)
        metadata = metadata or [{}] * len(prompts)
        verdicts: list[Verdict] = []
        for ca, cb, meta in zip(a, b, metadata, strict=True):
            answer = (meta or {}).get(self.answer_key)
            verdicts.append(
                None if answer is None else _verdict(self.score(ca, answer), self.score(cb, answer), 0.0)
            )
        return verdicts


def win_rate(verdicts: Sequence[Verdict]) -> float | None:
    """Share of judged rows won (ties count half); None when nothing could be judged."""
    judged = [v for v in verdicts if v is not None]
    return sum(judged) / len(judged) if judged else None
