"""Task verifiers: the reference answer computed from the prompt, or None when not sure (#47)."""

from __future__ import annotations

import pytest

from alignflow.data import word_problems
from alignflow.data.demo import PHRASINGS, make_prompt
from alignflow.data.verifiers import (
    METADATA_ANSWER,
    arithmetic_answer,
    reference_answer,
    register_verifier,
    registered_verifiers,
)


@pytest.mark.parametrize("phrasing", range(len(PHRASINGS)))
def test_every_demo_phrasing_is_read(phrasing):
    for a, b in ((0, 2), (7, 9), (9, 0)):
        assert arithmetic_answer(make_prompt(a, b, phrasing)) == a + b


def test_every_word_problem_is_read():
    problems = word_problems.all_problems(300, seed=4)
    assert {p.op for p in problems} == {"+", "-"}
    assert all(arithmetic_answer(p.prompt) == p.answer for p in problems)


@pytest.mark.parametrize(
    ("prompt", "answer"),
    [
        ("Tell me 3 plus 4.", 7),
        ("12 - 5 = ?", 7),
        ("Subtract 5 from 12.", 7),
        ("What is the sum of 10 and 20?", 30),
        ("Please add 3 and 4.", 7),
        ("Compute 7 minus 9.", -2),
        ("  what is 3   PLUS 4 ?", 7),
    ],
)
def test_sums_asked_in_other_words_are_read(prompt, answer):
    assert arithmetic_answer(prompt) == answer


@pytest.mark.parametrize(
    "prompt",
    [
        "What is 3 times 4?",
        "What is 3 plus 4 plus 5?",
        "What is -3 plus 4?",
        "What is 2.5 plus 1?",
        "What is 3 plus?",
        "3 and 4",
        "What is the difference between 3 and 9?",
        "How many legs do 3 cats have?",
        "Write a poem about 2 cats and 3 dogs.",
        "Hello",
        "",
    ],
)
def test_anything_else_is_none_never_a_guess(prompt):
    assert arithmetic_answer(prompt) is None


def test_the_rows_own_answer_comes_first_then_the_registered_verifiers():
    assert reference_answer({"prompt": "What is 1 plus 2?", "metadata": {"answer": 5}}) == (
        5,
        METADATA_ANSWER,
    )
    assert reference_answer({"prompt": "What is 1 plus 2?"}) == (3, "arithmetic")
    assert reference_answer({"prompt": "What is 1 plus 2?"}, verifiers={}) == (None, None)
    assert reference_answer({"prompt": "Name a colour."}) == (None, None)
    assert reference_answer({"prompt": [{"role": "user", "content": "Add 2 and 2."}]}) == (4, "arithmetic")
    assert reference_answer({"prompt": "x", "metadata": {"answer": "many"}}) == (None, None)


def test_a_verifier_registered_by_name_is_asked_after_the_built_in_one(monkeypatch):
    import alignflow.data.verifiers as verifiers

    monkeypatch.setattr(verifiers, "_VERIFIERS", dict(verifiers._VERIFIERS))

    @register_verifier("capital")
    def capital(prompt: str) -> int | None:
        return 1 if prompt == "How many capitals has France?" else None

    assert list(registered_verifiers()) == ["arithmetic", "capital"]
    assert reference_answer({"prompt": "How many capitals has France?"}) == (1, "capital")
