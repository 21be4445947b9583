"""How often a model's free text loops or repeats itself.

Greedy decoding of a small chat model, and a policy that learnt to please a reward model,
often answer with a loop ("I'm not sure. I'm not sure. I'm not sure."). A preference judge
scores such an answer like any other, so the evaluation measures it on its own:

- :func:`loops`: whether one completion loops: a span of words said again straight after
  itself (twice for a span of three words or more, more often for shorter spans; six times for a
  single word), or half of its word 4-grams already said earlier in it;
- :func:`repeated_ngram_share`: the share of a completion's word n-grams that it already said
  (Welleck et al.'s rep-n, per completion);
- :func:`distinct_n`: distinct n-grams over all n-grams of a model's completions (Li et al.):
  low when a model says the same few things to every prompt.

Words are whitespace-separated tokens with the punctuation around them stripped and lower-cased,
so the figure means the same for every tokenizer, and a ``+`` or ``=`` counts as a word.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_EDGE_PUNCTUATION = re.compile(r"^[\"'`(\[{.,;:!?…]+|[\"'`)\]}.,;:!?…]+$")
# a back-to-back repeat is a loop once it spans this many words (and the span is said twice)
MIN_LOOP_WORDS = 6
# spans longer than this are not searched for back-to-back repeats (4-grams catch those)
MAX_LOOP_PERIOD = 24
# a completion whose 4-grams are mostly repeats loops, even where nothing repeats back to back
NGRAM = 4
MAX_REPEATED_SHARE = 0.5


def words(text: str) -> list[str]:
    """The completion's words, lower-cased, with the punctuation at their edges stripped."""
    stripped = (_EDGE_PUNCTUATION.sub("", w).lower() for w in text.split())
    return [w for w in stripped if w]


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def longest_back_to_back_run(tokens: Sequence[str], period: int) -> int:
    """The most words covered by one span of ``period`` words said again straight after
    itself (the last copy may be cut short, as a generation cut at its token budget is)."""
    best, run = 0, 0
    for i in range(period, len(tokens)):
        run = run + 1 if tokens[i] == tokens[i - period] else 0
        best = max(best, run)
    return best + period if best else 0


def back_to_back_loop(tokens: Sequence[str]) -> bool:
    """A span said again right after itself: at least twice over and at least
    :data:`MIN_LOOP_WORDS` words in all (one word six times, two words three times...)."""
    for period in range(1, min(MAX_LOOP_PERIOD, len(tokens) // 2) + 1):
        covered = longest_back_to_back_run(tokens, period)
        if covered >= max(2 * period, MIN_LOOP_WORDS):
            return True
    return False


def repeated_ngram_share(tokens: Sequence[str], n: int = NGRAM) -> float:
    """The share of the completion's n-grams that already occurred earlier in it (0 if it has none)."""
    grams = ngrams(tokens, n)
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def loops(text: str) -> bool:
    """Whether one completion loops: a back-to-back repeat, or mostly repeated 4-grams."""
    tokens = words(text)
    return back_to_back_loop(tokens) or repeated_ngram_share(tokens) >= MAX_REPEATED_SHARE


def loop_rate(completions: Sequence[str]) -> float | None:
    """The share of completions that loop; None for no completions."""
    return sum(map(loops, completions)) / len(completions) if completions else None


def distinct_n(completions: Sequence[str], n: int = 2) -> float | None:
    """Distinct word n-grams over all word n-grams of the completions; None when they have none."""
    grams = [g for text in completions for g in ngrams(words(text), n)]
    return len(set(grams)) / len(grams) if grams else None


@dataclass(frozen=True)
class Repetition:
    """One model's completions, per item (whether each loops, its rep-4) and over all (distinct-2)."""

    looping: list[float]
    repeated_share: list[float]
    distinct_2: float | None

    @classmethod
    def of(cls, completions: Sequence[str]) -> Repetition:
        return cls(
            looping=[float(loops(c)) for c in completions],
            repeated_share=[repeated_ngram_share(words(c)) for c in completions],
            distinct_2=distinct_n(completions, 2),
        )
