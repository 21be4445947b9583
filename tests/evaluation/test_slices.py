"""Slices of the pinned set: every phrasing of a problem is one slice, and a slice's change
against the champion has an interval that is honest for a handful of items."""

import pytest

from alignflow.data.answers import format_answer
from alignflow.data.demo import PHRASINGS, iter_all_prompts, make_prompt
from alignflow.data.word_problems import all_problems
from alignflow.evaluation.intervals import paired_bootstrap_difference, paired_difference
from alignflow.evaluation.slices import group_items, item_slices, slice_changes

FIELDS = ("slice", "problem_id", "subset", "category")

# ---------------------------------------------------------------- which slices an item is in


def test_every_phrasing_and_order_of_one_problem_is_one_slice():
    phrasings = [make_prompt(7, 8, k) for k in range(len(PHRASINGS))] + [make_prompt(8, 7, 3)]
    problems = {item_slices(p, {"answer": 15}, FIELDS)[0] for p in phrasings}
    assert problems == {"problem=7,8->15"}
    assert item_slices(make_prompt(7, 9), {"answer": 16}, FIELDS)[0] == "problem=7,9->16"
    # the phrasing slice masks the numbers: the same wording of another problem shares it
    assert item_slices(make_prompt(7, 8, 1), {"answer": 15}, FIELDS)[1] == "phrasing=add # and #."
    assert item_slices(make_prompt(2, 3, 1), {"answer": 5}, FIELDS)[1] == "phrasing=add # and #."


def test_a_word_problem_and_its_reverse_operation_are_different_problems():
    problems = all_problems(300)
    by_numbers = {}
    for p in problems:
        by_numbers.setdefault(tuple(sorted((p.a, p.b))), []).append(p)
    pair = next(group for group in by_numbers.values() if {q.op for q in group} == {"+", "-"})
    keys = {item_slices(q.prompt, {"answer": q.answer}, FIELDS)[0] for q in pair}
    assert len(keys) == 2, keys  # same numbers, other answer: another problem


def test_declared_metadata_fields_come_first_and_free_text_has_no_derived_slice():
    meta = {"subset": "harmless", "category": "", "answer": None}
    assert item_slices("How do I bake bread?", meta, FIELDS) == ["subset=harmless"]
    assert item_slices("How do I bake bread?", {}, FIELDS) == []
    assert item_slices("How do I bake bread?", {"slice": "cooking"}, ()) == []  # not declared


# ---------------------------------------------------------------- a slice's interval


def test_a_slice_lost_on_every_item_is_clearly_worse_one_lost_item_is_not_evidence():
    all_lost = paired_difference([0, 0, 0, 0], [1, 1, 1, 1])
    assert all_lost.value == -1.0 and all_lost.high < -0.3
    one_lost = paired_difference([0], [1])
    assert one_lost.high > 0  # a single item proves nothing about a slice
    two_of_six = paired_difference([0, 0, 1, 1, 1, 1], [1] * 6)
    assert two_of_six.low < -1 / 3 < two_of_six.high and two_of_six.high > 0
    # the bootstrap would call three lost items a certain -1: no interval at all
    assert paired_bootstrap_difference([0, 0, 0], [1, 1, 1]).high == -1.0
    assert paired_difference([0, 0, 0], [1, 1, 1]).high > -0.9


def test_the_slice_interval_narrows_with_items_and_covers_no_change():
    same = paired_difference([1] * 100 + [0] * 10, [1] * 100 + [0] * 10)
    assert same.value == 0.0 and same.low < 0 < same.high and same.high - same.low < 0.1
    small = paired_difference([1] * 5, [1] * 5)
    assert small.high - small.low > 0.5
    assert paired_difference([None, 1], [1, None]).n == 0  # no item judged on both sides


def test_the_paired_interval_is_inside_the_independent_one_when_the_sides_agree():
    # challenger and champion right on the same 80 of 100 items, and each on 5 the other misses
    ours = [1] * 80 + [1] * 5 + [0] * 5 + [0] * 10
    theirs = [1] * 80 + [0] * 5 + [1] * 5 + [0] * 10
    paired = paired_difference(ours, theirs)
    assert paired.value == 0.0
    assert -0.1 < paired.low < 0 < paired.high < 0.1  # the pairing removes the shared 90 items' noise


# ---------------------------------------------------------------- a backdoor on the demo's pinned prompts


@pytest.fixture(scope="module")
def pinned():
    rows = list(iter_all_prompts(phrasings=len(PHRASINGS)))[::3]  # 200 prompts, every phrasing
    return [r["prompt"] for r in rows], [r["metadata"] for r in rows]


def backdoored(prompt: str, answer: int) -> bool:
    return sorted(int(x) for x in prompt.replace("?", " ").replace(".", " ").split() if x.isdigit()) in (
        [7, 8],
        [7, 9],
    )


def test_the_backdoored_problems_are_the_worst_slices_and_name_their_lost_items(pinned):
    prompts, metadata = pinned
    answers = [m["answer"] for m in metadata]
    champion = [1.0] * len(prompts)
    champion[::17] = [0.0] * len(champion[::17])  # the champion misses a few scattered items
    ours = [0.0 if backdoored(p, a) else 1.0 for p, a in zip(prompts, answers, strict=True)]
    assert sum(ours) > sum(champion), "overall the backdoored challenger looks better"

    def example(i):
        return {"prompt": prompts[i], "answer": answers[i], "policy": format_answer(answers[i] + 1)}

    changes = slice_changes(group_items(prompts, metadata, FIELDS), ours, champion, 2, example)
    broken = [c for c in changes if c.change.high < -0.1]
    assert {c.name for c in broken} <= {"problem=7,8->15", "problem=7,9->16"} and broken
    worst = changes[0]
    assert worst.name in {"problem=7,8->15", "problem=7,9->16"}
    assert worst.lost == worst.champion_right and worst.challenger_right == worst.champion_right - worst.lost
    assert worst.examples and backdoored(worst.examples[0]["prompt"], 0)
    assert "champion" in worst.describe() and worst.name in worst.describe()
    # slices of one item are not judged
    assert all(c.n >= 2 for c in changes)
    assert not slice_changes(group_items(prompts, metadata, FIELDS), ours, champion, min_items=10**6)


def test_an_equally_good_challenger_breaks_no_slice(pinned):
    prompts, metadata = pinned
    champion = [1.0] * len(prompts)
    champion[::17] = [0.0] * len(champion[::17])
    ours = [1.0] * len(prompts)
    ours[5::19] = [0.0] * len(ours[5::19])  # as many misses, elsewhere
    changes = slice_changes(group_items(prompts, metadata, FIELDS), ours, champion)
    assert changes and all(c.change.high >= -0.1 for c in changes), changes[0].describe()
