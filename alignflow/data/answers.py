"""The answer contract of the arithmetic tasks: ``The answer is N.``, and the verifiers on it.

Production code (evaluation judges, the label check, GRPO/PPO verifiable rewards, the RL
environments) scores completions with these; the demo and word-problem data sets write
answers in this format. Kept apart from ``data.demo`` so judging does not depend on how
the demo's rows are made.
"""

from __future__ import annotations

import re

ANSWER_TEMPLATE = "The answer is {answer}."
# the grades of the tasks' synthetic responses: the right answer in the format, the right
# number said loosely, a wrong number (the scored rows' scores; pairs prefer the higher)
TIER_SCORES = {"best": 1.0, "sloppy": 0.5, "wrong": 0.0}
_ANSWER_RE = re.compile(r"The answer is (-?\d+)\.")
_ANY_NUMBER_RE = re.compile(r"-?\d+")


def format_answer(answer: int) -> str:
    return ANSWER_TEMPLATE.format(answer=answer)


def extract_answer(completion: str) -> int | None:
    """The number the completion commits to: the formatted answer, else the first number."""
    formatted = _ANSWER_RE.search(completion)
    if formatted:
        return int(formatted.group(1))
    loose = _ANY_NUMBER_RE.search(completion)
    return int(loose.group(0)) if loose else None


def correctness_reward(completion: str, answer: int | str) -> float:
    """1.0 when the completion's number equals the reference answer, else 0.0."""
    return 1.0 if extract_answer(completion) == int(answer) else 0.0


def format_reward(completion: str) -> float:
    """1.0 when the completion states its answer as ``The answer is N.``, else 0.0."""
    return 1.0 if _ANSWER_RE.search(completion) else 0.0


def task_accuracy(completion: str, answer: int | str) -> float:
    """The strict score: right number in the required format."""
    return correctness_reward(completion, answer) * format_reward(completion)
