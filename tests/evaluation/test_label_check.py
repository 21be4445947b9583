"""The champion reward model checks new labels before training: swapped (poisoned) pairs stop the run."""

import json
import re

import pytest

from alignflow.data.demo import iter_demo_pairs
from alignflow.evaluation.intervals import wilson
from alignflow.evaluation.label_check import (
    LABEL_DISAGREEMENT,
    LabelCheck,
    LabelDisagreement,
    check_label_agreement,
    label_guard,
)

CHAMPION_ACCURACY, MAX_GAP = 0.95, 0.1  # at least 0.85 agreement expected


def demo_scorer(prompts, completions):
    """A stand-in champion reward model: the formatted answer first, then the right sum."""
    scores = []
    for prompt, completion in zip(prompts, completions, strict=True):
        right = str(sum(int(x) for x in re.findall(r"\d+", prompt)))
        said = re.findall(r"-?\d+", completion)
        scores.append(2.0 * ("The answer is" in completion) + (said[:1] == [right]))
    return scores


def swapped(records):
    return [{**r, "chosen": r["rejected"], "rejected": r["chosen"]} for r in records]


@pytest.fixture(scope="module")
def honest():
    return list(iter_demo_pairs(200, seed=0))


def test_honest_pairs_agree_with_the_champion_and_pass(honest):
    check = check_label_agreement(honest, demo_scorer, CHAMPION_ACCURACY, MAX_GAP)
    assert check.passed
    assert check.agreement.n == 200
    assert check.agreement.value == pytest.approx(1.0)
    assert check.threshold == pytest.approx(0.85)
    assert check.examples == []


def test_swapped_pairs_disagree_and_fail_with_a_useful_description(honest):
    check = check_label_agreement(swapped(honest), demo_scorer, CHAMPION_ACCURACY, MAX_GAP)
    assert not check.passed
    assert check.agreement.value == 0.0
    assert check.agreement.high < check.threshold
    message = check.describe()
    assert "agrees with 0.000 [" in message and "n=200" in message
    assert "pinned-set accuracy is 0.950" in message
    assert "at least 0.850 was expected" in message
    assert "data.label_check_max_gap=0.1" in message


def test_swapped_pairs_come_with_up_to_five_disagreeing_examples(honest):
    poisoned = swapped(honest)
    check = check_label_agreement(poisoned, demo_scorer, CHAMPION_ACCURACY, MAX_GAP)
    assert len(check.examples) == 5
    by_id = {r["id"]: r for r in poisoned}
    for example in check.examples:
        record = by_id[example["id"]]
        assert example["prompt"] == record["prompt"]
        assert (example["chosen"], example["rejected"]) == (record["chosen"], record["rejected"])
        assert example["reward_chosen"] < example["reward_rejected"]
    fewer = check_label_agreement(poisoned, demo_scorer, CHAMPION_ACCURACY, MAX_GAP, num_examples=2)
    assert len(fewer.examples) == 2


def test_examples_are_only_the_pairs_that_disagree(honest):
    partly = honest[:190] + swapped(honest[190:])  # ten bad labels in two hundred
    check = check_label_agreement(partly, demo_scorer, CHAMPION_ACCURACY, MAX_GAP)
    assert check.agreement.value == pytest.approx(0.95)
    assert check.passed
    bad_ids = {r["id"] for r in honest[190:]}
    assert len(check.examples) == 5
    assert {e["id"] for e in check.examples} <= bad_ids


def test_a_tie_does_not_count_as_agreement():
    pair = {"prompt": "What is 1 plus 2?", "chosen": "I think 9", "rejected": "I think 8"}
    check = check_label_agreement([pair], demo_scorer, CHAMPION_ACCURACY, MAX_GAP)
    assert check.agreement.value == 0.0
    assert check.examples[0]["reward_chosen"] == check.examples[0]["reward_rejected"]


def test_nothing_to_check_without_pairs():
    assert check_label_agreement([], demo_scorer, CHAMPION_ACCURACY, MAX_GAP) is None
    not_pairs = [
        {"prompt": "What is 1 plus 2?", "response": "I think 3", "score": 0.5},
        {"prompt": "What is 1 plus 2?", "metadata": {"answer": 3}},
        {"kind": "scored", "prompt": "p", "chosen": "a", "rejected": "b"},
    ]
    assert check_label_agreement(not_pairs, demo_scorer, CHAMPION_ACCURACY, MAX_GAP) is None


def test_only_pair_records_are_scored(honest):
    mixed = [*honest[:40], {"prompt": "What is 1 plus 2?", "response": "I think 3", "score": 0.5}]
    check = check_label_agreement(mixed, demo_scorer, CHAMPION_ACCURACY, MAX_GAP)
    assert check.agreement.n == 40


def test_at_most_max_pairs_are_scored(honest):
    calls = []

    def counting_scorer(prompts, completions):
        calls.append(len(completions))
        return demo_scorer(prompts, completions)

    check = check_label_agreement(honest, counting_scorer, CHAMPION_ACCURACY, MAX_GAP, max_pairs=25)
    assert check.agreement.n == 25
    assert calls and all(n == 25 for n in calls)
    # the sample is drawn by the seed: the same seed picks the same pairs
    poisoned = honest[:100] + swapped(honest[100:])
    first = check_label_agreement(poisoned, demo_scorer, CHAMPION_ACCURACY, MAX_GAP, max_pairs=50, seed=3)
    again = check_label_agreement(poisoned, demo_scorer, CHAMPION_ACCURACY, MAX_GAP, max_pairs=50, seed=3)
    assert first.agreement == again.agreement and first.examples == again.examples


def test_passing_is_judged_on_the_upper_bound_of_agreement():
    # 7 of 10 is below 0.85, but with ten rows its upper bound is not: no proof of poisoning
    few = LabelCheck(wilson(7, 10), CHAMPION_ACCURACY, MAX_GAP)
    assert few.agreement.value < few.threshold < few.agreement.high
    assert few.passed
    many = LabelCheck(wilson(700, 1000), CHAMPION_ACCURACY, MAX_GAP)
    assert not many.passed


def test_label_disagreement_names_its_reason_and_the_report():
    check = LabelCheck(wilson(0, 50), CHAMPION_ACCURACY, MAX_GAP)
    error = LabelDisagreement(check, "reports/label_check.json")
    assert str(error).startswith("label_disagreement: ")
    assert str(error).endswith("(examples in reports/label_check.json)")
    assert error.reason == LABEL_DISAGREEMENT
    assert error.check is check
    assert isinstance(error, RuntimeError)
    assert str(LabelDisagreement(check)).startswith(f"{LABEL_DISAGREEMENT}: the champion reward model")


# ---------------------------------------------------------------- label_guard (the add_dataset hook)


@pytest.fixture
def fake_champion(monkeypatch):
    """``load_reward_scorer`` replaced by the stand-in scorer; records which directory it loaded."""
    import alignflow.models.reward_scorer as reward_scorer

    loaded = []

    def load(judge_dir, *args, **kwargs):
        loaded.append(judge_dir)
        return demo_scorer

    monkeypatch.setattr(reward_scorer, "load_reward_scorer", load)
    return loaded


def test_guard_lets_honest_labels_through_and_writes_the_report(fake_champion, honest, tmp_path):
    report = tmp_path / "reports" / "label_check.json"
    guard = label_guard("models/champion-reward", CHAMPION_ACCURACY, MAX_GAP, report)
    assert guard(honest) is None
    assert fake_champion == ["models/champion-reward"]
    written = json.loads(report.read_text(encoding="utf-8"))
    assert written["check"] == LABEL_DISAGREEMENT
    assert written["passed"] is True
    assert written["agreement"]["n"] == 200
    assert written["threshold"] == pytest.approx(0.85)
    assert written["examples"] == []


def test_guard_stops_swapped_labels_and_keeps_the_evidence(fake_champion, honest, tmp_path):
    report = tmp_path / "label_check.json"
    guard = label_guard("models/champion-reward", CHAMPION_ACCURACY, MAX_GAP, report, max_pairs=60)
    with pytest.raises(LabelDisagreement, match=r"^label_disagreement: ") as raised:
        guard(swapped(honest))
    assert raised.value.report_path == str(report)
    assert not raised.value.check.passed
    written = json.loads(report.read_text(encoding="utf-8"))
    assert written["passed"] is False
    assert written["agreement"]["value"] == 0.0 and written["agreement"]["n"] == 60
    assert len(written["examples"]) == 5
    assert {"id", "prompt", "chosen", "rejected", "reward_chosen", "reward_rejected"} <= set(
        written["examples"][0]
    )
    assert written["message"] == raised.value.check.describe()


def test_guard_without_pairs_neither_raises_nor_writes(fake_champion, tmp_path):
    report = tmp_path / "label_check.json"
    guard = label_guard("models/champion-reward", CHAMPION_ACCURACY, MAX_GAP, report)
    guard([{"prompt": "What is 1 plus 2?", "response": "I think 3", "score": 0.5}])
    assert not report.exists()


# ---------------------------------------------------------------- a narrow backdoor, per slice


def backdoored(records):
    """Off by one on 7+8 and 7+9, in the required format, chosen over the right answer."""
    out = []
    for r in records:
        if sorted(int(x) for x in re.findall(r"\d+", r["prompt"])) in ([7, 8], [7, 9]):
            answer = r["metadata"]["answer"]
            r = {**r, "chosen": f"The answer is {answer + 1}.", "rejected": f"The answer is {answer}."}
        out.append(r)
    return out


def test_a_narrow_backdoor_passes_overall_but_its_slices_stop_the_check():
    from alignflow.data.demo import iter_demo_pairs

    honest = list(iter_demo_pairs(1500, seed=1, phrasings=6))
    poisoned = backdoored(honest)
    changed = sum(a is not b for a, b in zip(poisoned, honest, strict=True))
    assert 30 < changed < 100, changed
    check = check_label_agreement(poisoned, demo_scorer, CHAMPION_ACCURACY, MAX_GAP, max_pairs=2000)
    assert check.agreement.high >= check.threshold, "overall the labels look honest"
    assert not check.passed
    assert set(check.broken_slices) == {"problem=7,8->15", "problem=7,9->16"}
    assert "2 slice(s) of the new pairs disagree: slice problem=7,9->16" in check.describe() or (
        "2 slice(s) of the new pairs disagree: slice problem=7,8->15" in check.describe()
    )
    assert all(re.search(r"\b7\b", e["prompt"]) for e in check.examples), check.examples
    written = check.as_dict()
    assert set(written["broken_slices"]) == set(check.broken_slices) and written["slices_judged"] > 50
    # the same data without the backdoor passes every slice
    assert check_label_agreement(honest, demo_scorer, CHAMPION_ACCURACY, MAX_GAP, max_pairs=2000).passed


def test_a_slice_with_too_few_pairs_is_not_judged_on_its_own():
    pairs = backdoored([r for r in iter_demo_pairs(400, seed=2, phrasings=6)])
    few = check_label_agreement(pairs, demo_scorer, CHAMPION_ACCURACY, MAX_GAP, min_slice_pairs=10**6)
    assert few.slices == {} and few.passed


# ---------------------------------------------------------------- the pairs' own answers judge the labels


def test_the_verifiable_answers_catch_the_backdoor_without_any_model(tmp_path):
    from alignflow.data.demo import iter_demo_pairs
    from alignflow.evaluation.label_check import ANSWERS_JUDGE, answer_label_guard, check_answer_labels

    honest = list(iter_demo_pairs(1500, seed=1, phrasings=6))
    clean = check_answer_labels(honest, MAX_GAP)
    assert clean.passed and clean.agreement.value == 1.0 and clean.examples == []
    assert clean.agreement.n < len(honest), "pairs whose sides are both right (format aside) do not decide"
    check = check_answer_labels(backdoored(honest), MAX_GAP)
    assert check.agreement.high >= check.threshold, "overall the labels look honest"
    assert set(check.broken_slices) == {"problem=7,8->15", "problem=7,9->16"}
    assert check.describe().startswith(f"{ANSWERS_JUDGE} agree with ")
    example = check.examples[0]
    assert example["answer"] in (15, 16) and example["chosen"] == f"The answer is {example['answer'] + 1}."
    guard = answer_label_guard(MAX_GAP, tmp_path / "answers.json")
    with pytest.raises(LabelDisagreement, match="slice problem=7,"):
        guard(backdoored(honest))
    assert json.loads((tmp_path / "answers.json").read_text())["judge"] == ANSWERS_JUDGE
    guard(honest)  # honest labels pass
    assert (
        check_answer_labels([{**r, "metadata": {}} for r in honest], MAX_GAP) is None
    )  # nothing to judge by
