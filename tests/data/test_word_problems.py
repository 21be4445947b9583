"""The word-problem task: a fixed, verifiable universe of two-digit problems for real models."""

from __future__ import annotations

import json
import random
import re

from alignflow.data import word_problems
from alignflow.data.answers import task_accuracy
from alignflow.data.demo import write_demo_dataset


def test_the_universe_is_the_same_in_every_clone_and_every_answer_checks_out():
    first, again = word_problems.all_problems(200, seed=0), word_problems.all_problems(200, seed=0)
    assert [p.prompt for p in first] == [p.prompt for p in again]
    assert len({p.prompt for p in first}) == 200
    for problem in first:
        assert problem.answer == (problem.a + problem.b if problem.op == "+" else problem.a - problem.b)
        assert problem.answer >= 0, "a subtraction never goes below zero"
        assert f" {problem.a} " in f" {problem.prompt} " and word_problems.INSTRUCTION in problem.prompt
    assert {p.op for p in first} == {"+", "-"}


def test_only_the_best_tier_passes_the_strict_task_check():
    rng = random.Random(0)
    for problem in word_problems.all_problems(50, seed=3):
        assert task_accuracy(word_problems.response("best", problem, rng), problem.answer) == 1.0
        assert task_accuracy(word_problems.response("sloppy", problem, rng), problem.answer) == 0.0
        assert task_accuracy(word_problems.response("wrong", problem, rng), problem.answer) == 0.0


def test_the_dataset_holds_out_enough_problems_for_a_pinned_set(tmp_path):
    paths = write_demo_dataset(tmp_path, n_pairs=300, n_scored=50, eval_fraction=0.2, task="word_problems")
    held_out = [json.loads(line) for line in paths["eval"].read_text().splitlines()]
    assert len(held_out) >= 200, "the pinned set needs at least 200 problems with answers"
    assert all(isinstance(row["metadata"]["answer"], int) for row in held_out)
    pairs = [json.loads(line) for line in paths["pairs"].read_text().splitlines()]
    assert len(pairs) == 300 and all(row["source"] == "word_problems" for row in pairs)
    chosen_right = sum(task_accuracy(row["chosen"], row["metadata"]["answer"]) for row in pairs)
    assert chosen_right / len(pairs) > 0.6, "SFT on chosen imitates worked answers in most pairs"
    assert all(task_accuracy(row["rejected"], row["metadata"]["answer"]) == 0.0 for row in pairs)


def _steps(text: str) -> list[tuple[int, str, int, int]]:
    """Every ``x op y = z`` in a response, as numbers."""
    text = re.sub(r" = -\(\d+ - \d+\) = ", " = ", text)  # a borrow's worked ones step, as its result
    return [(int(x), op, int(y), int(z)) for x, op, y, z in re.findall(r"(\d+) ([+-]) (\d+) = (-?\d+)", text)]


def test_worked_answers_come_in_both_styles_and_every_step_of_a_right_one_is_right():
    rng = random.Random(0)
    problems = word_problems.all_problems(400, seed=5)
    best = [(p, word_problems.response("best", p, rng)) for p in problems]
    stepwise = [(p, text) for p, text in best if ":" in text]
    share = len(stepwise) / len(best)
    assert abs(share - word_problems.STEPWISE_SHARE) < 0.07, share
    for problem, text in stepwise:
        steps = _steps(text)
        assert len(steps) == 3, text
        for x, op, y, z in steps:
            assert z == (x + y if op == "+" else x - y), f"a best answer with a wrong step: {text}"
        (a_tens, _, b_tens, tens), (a_ones, _, b_ones, ones), (joined, join_op, _, result) = steps
        assert (a_tens, b_tens) == (problem.a - problem.a % 10, problem.b - problem.b % 10), text
        assert (a_ones, b_ones) == (problem.a % 10, problem.b % 10), text
        assert joined == tens and result == problem.answer, text
        if ones < 0:
            assert f"= -({b_ones} - {a_ones}) = {ones}," in text, "a borrow, worked from the positive one"
        assert join_op == ("-" if ones < 0 else "+"), text


def test_a_wrong_stepwise_answer_slips_in_its_last_step_only():
    rng = random.Random(1)
    seen = 0
    for problem in word_problems.all_problems(300, seed=6):
        text = word_problems.response("wrong", problem, rng)
        if ":" not in text:
            continue
        seen += 1
        *first, (x, op, y, z) = _steps(text)
        assert len(first) == 2, text
        for x1, op1, y1, z1 in first:
            assert z1 == (x1 + y1 if op1 == "+" else x1 - y1), text
        assert z != (x + y if op == "+" else x - y), text
        assert task_accuracy(text, problem.answer) == 0.0
    assert seen > 50
