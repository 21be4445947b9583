"""Degeneration figures: which completions loop, how much of a text repeats, distinct-n."""

from __future__ import annotations

import pytest

from alignflow.evaluation.repetition import (
    Repetition,
    distinct_n,
    loop_rate,
    loops,
    repeated_ngram_share,
    words,
)

LOOPING = [
    "I'm not sure. I'm not sure. I'm not sure. I'm not sure. I'm not sure. I'm not sure.",
    # cut at the token budget in the middle of its third copy
    "I'd be happy to. I'd be happy to. I'd be",
    "The answer is 5. The answer is 5. The answer is 5.",
    "no no no no no no no",
    "yes, yes yes! yes. yes yes",
    # nothing back to back, yet most of it said before
    "You can ask a doctor. Or you can ask a friend. You can ask a doctor. Or you can ask a friend.",
]
NOT_LOOPING = [
    "85 + 50: 80 + 50 = 130, 5 + 0 = 5, 130 + 5 = 135. The answer is 135.",
    "Sure. Start with the basics and practise a little every day; it gets easier.",
    "Ha ha ha, that is a good one.",
    "Thank you, thank you!",
    "I think that it is what it is.",
    "",
    "5.",
]


@pytest.mark.parametrize("text", LOOPING)
def test_a_looping_completion_is_seen(text):
    assert loops(text)


@pytest.mark.parametrize("text", NOT_LOOPING)
def test_ordinary_answers_do_not_count_as_loops(text):
    assert not loops(text)


def test_words_drop_edge_punctuation_and_case_but_keep_symbols():
    assert words("Hello, World! 2 + 3 = 5.") == ["hello", "world", "2", "+", "3", "=", "5"]
    assert words("I'm (very) sure...") == ["i'm", "very", "sure"]


def test_repeated_share_counts_ngrams_already_said():
    assert repeated_ngram_share(words("a b c d a b c d"), 4) == pytest.approx(1 - 4 / 5)
    assert repeated_ngram_share(words("a b c"), 4) == 0.0
    assert repeated_ngram_share(words("one two three four five"), 4) == 0.0


def test_distinct_n_is_low_when_every_answer_is_the_same():
    same = ["I can help with that."] * 10
    varied = [f"Answer number {i} is different from {i + 1}." for i in range(10)]
    assert distinct_n(same, 2) == pytest.approx(4 / 40)
    assert distinct_n(varied, 2) > 0.5
    assert distinct_n(["", "one"], 2) is None


def test_loop_rate_and_per_model_figures():
    completions = [*LOOPING[:2], *NOT_LOOPING[:2]]
    assert loop_rate(completions) == 0.5
    assert loop_rate([]) is None
    figures = Repetition.of(completions)
    assert figures.looping == [1.0, 1.0, 0.0, 0.0]
    assert figures.repeated_share[0] > 0.5 and figures.repeated_share[2] < 0.2
    assert figures.distinct_2 is not None and 0 < figures.distinct_2 < 1
