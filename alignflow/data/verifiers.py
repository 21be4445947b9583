"""Task verifiers: the reference answer of a prompt, computed from its text, or None.

A pair whose rows carry ``metadata.answer`` is judged by that answer. A pair without one can
still be judged with no model in the way when its task has a verifier: the arithmetic tasks'
answer follows from the prompt itself. A verifier answers only when it is sure (one
recognised question, exactly two operands); anything else is None, and the pair is left to
a model judge (:mod:`alignflow.evaluation.label_check`).

Verifiers are registered by name (:func:`register_verifier`); :func:`reference_answer` asks
the row's own answer first, then each registered verifier in turn. The built-in
``arithmetic`` verifier recognises every phrasing of the built-in tasks (the addition demo's
``PHRASINGS``, the word problems' stories) and plain sums and differences asked in other
words (``Tell me 3 plus 4.``, ``12 - 5 = ?``, ``Subtract 5 from 12.``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from alignflow.data.checks import as_text

Verifier = Callable[[str], int | None]
METADATA_ANSWER = "metadata.answer"

_VERIFIERS: dict[str, Verifier] = {}


def register_verifier(name: str) -> Callable[[Verifier], Verifier]:
    """Register ``fn(prompt) -> answer | None`` under ``name`` (later names are asked later)."""

    def add(fn: Verifier) -> Verifier:
        _VERIFIERS[name] = fn
        return fn

    return add


def registered_verifiers() -> dict[str, Verifier]:
    """The registered verifiers, in the order they are asked."""
    return dict(_VERIFIERS)


def reference_answer(
    record: Mapping[str, Any], verifiers: Mapping[str, Verifier] | None = None
) -> tuple[int | None, str | None]:
    """The row's reference answer and who gave it: its ``metadata.answer``, else the first
    verifier (``verifiers``, default: every registered one) that recognises its prompt."""
    answer = (record.get("metadata") or {}).get("answer")
    if answer is not None:
        try:
            return int(answer), METADATA_ANSWER
        except (TypeError, ValueError):
            return None, None  # a non-numeric answer: nothing here can check it
    prompt = _question(record.get("prompt"))
    if not prompt:
        return None, None
    for name, verifier in (registered_verifiers() if verifiers is None else dict(verifiers)).items():
        found = verifier(prompt)
        if found is not None:
            return found, name
    return None, None


def _question(prompt: Any) -> str | None:
    """The text a verifier reads: the prompt, or the last user turn of a message list."""
    if isinstance(prompt, list):
        turns = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role", "user") == "user"]
        return turns[-1] if turns and isinstance(turns[-1], str) else None
    return as_text(prompt)


# ---------------------------------------------------------------- the built-in arithmetic verifier

_NUMBER = r"(\d+)"
_SPACES = re.compile(r"\s+")
_DIGITS = re.compile(r"\d+")
# words and signs of any other operation, a decimal or a third operand: not a plain a + b
_OTHER_OPERATION = re.compile(
    r"\b(times|multipl\w*|divid\w*|product|quotient|percent|squared?|cubed?|power|root|"
    r"half|twice|double|triple|average|mean|remainder|mod(ulo)?)\b|[*/×÷^%]|\d[.,]\d"
)
# (words before the first operand, words between the operands) -> the operation
_PLUS = ("+", "plus", "added to")
_MINUS = ("-", "minus", "−", "take away")


def _plain(text: str) -> str:
    return _SPACES.sub(" ", text).strip().casefold()


@cache
def _task_templates() -> list[tuple[re.Pattern[str], str]]:
    """The built-in tasks' phrasings as patterns (operands captured) and their operation."""
    from alignflow.data import word_problems
    from alignflow.data.demo import PHRASINGS

    stories = [(t, "+") for t in word_problems.ADDITION] + [(t, "-") for t in word_problems.SUBTRACTION]
    patterns = [(_template_pattern(t, f" {word_problems.INSTRUCTION}"), op) for t, op in stories]
    patterns += [(_template_pattern(p), "+") for p in PHRASINGS]
    return patterns


def _template_pattern(template: str, optional_suffix: str = "") -> re.Pattern[str]:
    """``{a}``/``{b}`` capture numbers; other fields (a name, the things) match a word, the same
    word where the template repeats the field."""
    parts, seen = [], set()
    for literal, field in re.findall(r"([^{]*)(?:\{(\w+)\})?", template):
        parts.append(re.escape(_SPACES.sub(" ", literal).casefold()))
        if not field:
            continue
        if field in ("a", "b"):
            parts.append(f"(?P<{field}>\\d+)")
        elif field in seen:
            parts.append(f"(?P={field})")
        else:
            seen.add(field)
            parts.append(f"(?P<{field}>[\\w'-]+)")
    suffix = f"(?:{re.escape(_SPACES.sub(' ', optional_suffix).casefold())})?" if optional_suffix else ""
    return re.compile("".join(parts).replace(r"\ ", " ") + suffix)


def _from_templates(prompt: str) -> int | None:
    text = _plain(prompt)
    for pattern, op in _task_templates():
        found = pattern.fullmatch(text)
        if found:
            a, b = int(found.group("a")), int(found.group("b"))
            return a + b if op == "+" else a - b
    return None


def _plain_sum(prompt: str) -> int | None:
    """``a plus b``, ``a + b``, ``a minus b``, ``a - b``, ``the sum of a and b``, ``add a and b``,
    ``subtract b from a``, in any surrounding words that name no other operation."""
    text = _plain(prompt)
    if _OTHER_OPERATION.search(text):
        return None
    numbers = list(_DIGITS.finditer(text))
    if len(numbers) != 2:
        return None
    first, second = numbers
    before, between = text[: first.start()], text[first.end() : second.start()].strip()
    after = text[second.end() :]
    a, b = int(first.group()), int(second.group())
    if re.search(r"(^|[^\w])-\s*$", before) or re.search(r"\b(minus|negative)\s*$", before):
        return None  # a negative first operand, or a sign we cannot place
    if re.search(r"(plus|minus|\+|-|−|and|from)\s*$", after.split("?")[0].split("=")[0]):
        return None  # a third term without a number
    if between in _PLUS:
        return a + b
    if between in _MINUS:
        return a - b
    if between == "and" and re.search(r"\b(sum of|total of|add|adding|add together)\s*$", before):
        return a + b
    if between == "and" and re.search(r"\bdifference between\s*$", before):
        return None  # which way round is not said
    if between == "from" and re.search(r"\b(subtract|take|take away)\s*$", before):
        return b - a
    return None


@register_verifier("arithmetic")
def arithmetic_answer(prompt: str) -> int | None:
    """The answer of a sum or difference of two whole numbers, however the built-in tasks (or a
    plain question) ask it; None for anything else."""
    return _from_templates(prompt) if (found := _plain_sum(prompt)) is None else found
