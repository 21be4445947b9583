"""The label check before training: swapped (poisoned) pairs stop the run, correct pairs do not.

Verifiers decide first; the champion reward model counts only where it passes its audit
against them and has been shown competent on held-out pairs like the new ones. Elsewhere the
verdict is "cannot judge", never "disagrees" (issue #47)."""

import json
import re

import pytest

from alignflow.data.demo import iter_demo_pairs
from alignflow.evaluation.intervals import wilson
from alignflow.evaluation.label_check import (
    ANSWERS_JUDGE,
    CANNOT_JUDGE,
    LABEL_DISAGREEMENT,
    LabelCheck,
    LabelDisagreement,
    ModelJudge,
    UnjudgedLabels,
    check_label_agreement,
    judge_labels,
    label_guard,
    pair_kind,
    templates_of,
)
from tests.evaluation.label_check_cases import near_misses, tier_scorer

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


@pytest.fixture(scope="module")
def pinned_pairs():
    """Held-out labelled pairs like the demo's pinned set: tier pairs of other problems' draws."""
    return list(iter_demo_pairs(300, seed=7, phrasings=6))


def test_guard_lets_honest_labels_through_and_writes_the_report(
    fake_champion, honest, pinned_pairs, tmp_path
):
    report = tmp_path / "reports" / "label_check.json"
    guard = label_guard("models/champion-reward", CHAMPION_ACCURACY, MAX_GAP, report, reference=pinned_pairs)
    assert guard(honest) is None
    assert fake_champion == ["models/champion-reward"]
    written = json.loads(report.read_text(encoding="utf-8"))
    assert written["status"] == "passed" and written["passed"] is True
    assert written["judge"] == ANSWERS_JUDGE, "the verifiable answers decide first"
    assert written["agreement"]["n"] == written["verifier"]["agreement"]["n"] > 100
    assert written["judge_audit"]["counts"] is True
    assert written["model"]["agreement"]["n"] == 200 - written["verifier"]["agreement"]["n"], (
        "the pairs the answers cannot decide (both sides right, format aside) go to the competent judge"
    )
    assert written["threshold"] == pytest.approx(1.0 - MAX_GAP)
    assert written["examples"] == [] and written["unjudged"]["pairs"] == 0


def test_guard_stops_swapped_labels_and_keeps_the_evidence(fake_champion, honest, pinned_pairs, tmp_path):
    report = tmp_path / "label_check.json"
    guard = label_guard(
        "models/champion-reward", CHAMPION_ACCURACY, MAX_GAP, report, max_pairs=60, reference=pinned_pairs
    )
    with pytest.raises(LabelDisagreement, match=r"^label_disagreement: ") as raised:
        guard(swapped(honest))
    assert raised.value.report_path == str(report)
    assert not raised.value.check.passed
    written = json.loads(report.read_text(encoding="utf-8"))
    assert written["passed"] is False and written["status"] == LABEL_DISAGREEMENT
    assert written["agreement"]["value"] == 0.0 and 30 < written["agreement"]["n"] <= 60
    assert len(written["examples"]) == 5
    example = written["examples"][0]
    assert {"id", "prompt", "chosen", "rejected", "answer", "reward_chosen", "reward_rejected"} <= set(
        example
    )
    assert example["chosen_says"] != example["answer"] == example["rejected_says"]
    assert written["message"] == raised.value.check.describe()
    assert raised.value.examples == written["examples"]


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
    unanswered = [{**r, "metadata": {}} for r in honest]
    assert check_answer_labels(unanswered, MAX_GAP, verifiers={}) is None, "nothing to judge by"
    # without metadata.answer the task's verifier computes each answer from the prompt
    computed = check_answer_labels(backdoored(honest), MAX_GAP)
    assert set(computed.broken_slices) == set(check.broken_slices)
    assert check_answer_labels(unanswered, MAX_GAP).agreement == clean.agreement


# ---------------------------------------------------------------- a judge it cannot trust (#47)
# The demo's reward model was trained and audited on tier pairs (formatted vs sloppy, sloppy vs
# a far-off number): it reads the format, not the arithmetic. This stand-in does the same.


@pytest.fixture(scope="module")
def tier_judge(pinned_pairs):
    return ModelJudge(tier_scorer, 0.94, pinned_pairs)


def test_the_stand_in_judge_passes_its_pinned_audit_but_prefers_the_near_miss(pinned_pairs):
    pinned = check_label_agreement(pinned_pairs, tier_scorer, 0.94, 0.25)
    assert pinned.agreement.value == 1.0, "on tier pairs it looks perfect"
    near = check_label_agreement(near_misses(), tier_scorer, 0.94, 0.25)
    assert near.agreement.value == 0.0 and not near.passed, "asked alone, it would refuse correct data"


def test_correct_near_miss_pairs_without_answers_are_accepted(tier_judge):
    verdict = judge_labels(near_misses(), 0.25, tier_judge)
    assert verdict.status == "passed", verdict.describe()
    assert verdict.verifier.agreement.value == 1.0 and verdict.verifier.agreement.n == 12
    assert verdict.judge_discredited, "the reward model fails its audit against the verifier"
    assert "does not count in this run" in verdict.describe()
    assert verdict.model is None and verdict.unjudged == 0


def test_the_same_pairs_swapped_are_refused_naming_pairs_and_scores(tier_judge, tmp_path):
    poisoned = [{**r, "id": f"row-{i}"} for i, r in enumerate(swapped(near_misses()))]
    verdict = judge_labels(poisoned, 0.25, tier_judge)
    assert verdict.status == LABEL_DISAGREEMENT
    assert verdict.disagreeing.judge == ANSWERS_JUDGE
    assert verdict.disagreeing.agreement.value == 0.0
    assert verdict.judge_discredited, "the audit is against the answers, whatever the labels say"
    report = tmp_path / "label-check.json"
    guard = label_guard(None, None, 0.25, report)
    with pytest.raises(LabelDisagreement) as raised:
        guard(poisoned)
    first = raised.value.examples[0]
    assert first["id"] == "row-0" and first["answer"] == 2
    assert (first["chosen_says"], first["rejected_says"]) == (3, 2)
    assert json.loads(report.read_text())["examples"][0]["answer_from"] == "arithmetic"
    scored = judge_labels(poisoned, 0.25, tier_judge).disagreeing.examples[0]
    assert scored["reward_chosen"] == pytest.approx(3.03) and scored["reward_rejected"] == pytest.approx(3.02)


def test_without_a_verifier_a_judge_never_shown_such_pairs_cannot_judge_them(
    tier_judge, monkeypatch, tmp_path
):
    import alignflow.models.reward_scorer as reward_scorer

    for rows in (near_misses(), swapped(near_misses())):
        verdict = judge_labels(rows, 0.25, tier_judge, verifiers={})
        assert verdict.status == CANNOT_JUDGE, verdict.describe()
        assert verdict.disagreeing is None and verdict.unjudged == 12
        assert verdict.competence[0].accuracy.n == 0
        (why,) = verdict.unjudged_reasons
        assert "'the answer is #.' vs 'the answer is #.'" in why and "near-miss" in why
        assert "no held-out pair like them" in why
    monkeypatch.setattr(reward_scorer, "load_reward_scorer", lambda *a, **k: tier_scorer)
    report = tmp_path / "label-check.json"
    guard = label_guard("judge", 0.94, 0.25, report, reference=tier_judge.reference, verifiers={})
    with pytest.raises(UnjudgedLabels, match=r"^cannot_judge: 12 of 12 new pairs cannot be judged") as raised:
        guard(near_misses())
    message = str(raised.value)
    assert "metadata.answer" in message and '--accept-unjudged "' in message
    assert raised.value.examples[0]["prompt"] == "What is 0 plus 2?"
    written = json.loads(report.read_text())
    assert written["status"] == CANNOT_JUDGE and written["unjudged"]["pairs"] == 12
    assert written["unjudged"]["ways_on"] and written["competence"][0]["accuracy"]["n"] == 0


def test_a_judge_shown_competent_on_pairs_like_these_refuses_their_flip(pinned_pairs):
    """Where held-out pairs of the same kind exist and the judge is right on them, it judges."""
    held_out = [
        {
            "prompt": f"Compute {a} + {b}.",
            "chosen": f"The answer is {a + b}.",
            "rejected": f"The answer is {a + b + d}.",
        }
        for a in range(3, 9)
        for b in range(4)
        for d in (-1, 1)
    ]
    judge = ModelJudge(demo_scorer, 0.95, [*pinned_pairs, *held_out])
    flipped = judge_labels(swapped(near_misses()), 0.25, judge, verifiers={})
    assert flipped.status == LABEL_DISAGREEMENT and flipped.disagreeing.judge == "the champion reward model"
    assert flipped.competence[0].shown and flipped.competence[0].accuracy.n == len(held_out)
    assert (
        flipped.disagreeing.examples[0]["reward_chosen"] < flipped.disagreeing.examples[0]["reward_rejected"]
    )
    assert judge_labels(near_misses(), 0.25, judge, verifiers={}).passed
    # the same held-out pairs do not make the tier judge competent: it is wrong on them
    tier = judge_labels(near_misses(), 0.25, ModelJudge(tier_scorer, 0.94, held_out), verifiers={})
    assert tier.status == CANNOT_JUDGE and not tier.competence[0].shown
    assert "not shown competent" in next(iter(tier.unjudged_reasons))


def test_correct_pairs_in_an_unseen_phrasing_are_accepted(tier_judge):
    phrasings = [
        "Tell me {a} plus {b}.",
        "{a} + {b} = ?",
        "Please add {a} and {b}.",
        "Quick one: {a} plus {b}?",
    ]
    rows = [
        {
            "prompt": p.format(a=a, b=b),
            "chosen": f"The answer is {a + b}.",
            "rejected": f"The answer is {a + b - 1}.",
        }
        for p in phrasings
        for a, b in ((2, 3), (4, 4), (7, 1))
    ]
    verdict = judge_labels(rows, 0.25, tier_judge)
    assert verdict.passed and verdict.verifier.agreement.n == len(rows)
    assert judge_labels(swapped(rows), 0.25, tier_judge).status == LABEL_DISAGREEMENT
    # a phrasing no verifier reads: the judge has not been shown such pairs, so it cannot judge them
    unread = [{**r, "prompt": f"If you have {i} apples and find more, how many?"} for i, r in enumerate(rows)]
    assert judge_labels(unread, 0.25, tier_judge).status == CANNOT_JUDGE


def test_correct_pairs_from_another_source_are_accepted_or_cannot_be_judged(tier_judge):
    from alignflow.data import word_problems

    problems = word_problems.all_problems(60)
    stories = [{**r, "metadata": {}} for r in word_problems.iter_pairs(problems, 80, seed=3)]
    verdict = judge_labels(stories, 0.25, tier_judge)
    assert verdict.disagreeing is None, verdict.describe()
    assert verdict.verifier.agreement.value == 1.0, "the word problems' verifier reads their stories"
    assert judge_labels(swapped(stories), 0.25, tier_judge).status == LABEL_DISAGREEMENT
    chat = [
        {"prompt": f"Name a colour ({i}).", "chosen": "Blue is a colour.", "rejected": "A banana."}
        for i in range(12)
    ]
    other = judge_labels(chat, 0.25, tier_judge)
    assert other.status == CANNOT_JUDGE and other.disagreeing is None
    assert "free text vs free text" in next(iter(other.unjudged_reasons))


def test_a_judge_that_fails_its_audit_counts_nowhere_in_the_run(tier_judge, pinned_pairs):
    # the tier pairs the judge is competent on, beside near misses the verifier decides against it
    honest_tiers = [
        {**r, "metadata": {}, "prompt": r["prompt"]} for r in iter_demo_pairs(120, seed=9, phrasings=6)
    ]
    unverifiable = [
        {**r, "prompt": "Say something."} for r in honest_tiers if "The answer is" in r["chosen"]
    ][:20]
    mixed = near_misses() * 3 + unverifiable
    verdict = judge_labels(mixed, 0.25, tier_judge)
    assert verdict.judge_discredited
    assert verdict.status == CANNOT_JUDGE and verdict.unjudged == len(unverifiable)
    assert "failed its audit against the verifiable answers" in next(iter(verdict.unjudged_reasons))
    trusted = judge_labels(unverifiable, 0.25, tier_judge)
    assert not trusted.judge_discredited and trusted.model.agreement.n >= 15, "alone, it judges them"


def test_before_any_champion_the_answers_judge_and_nothing_stops_for_want_of_a_judge():
    chat = [{"prompt": f"Name a colour ({i}).", "chosen": "Blue.", "rejected": "A banana."} for i in range(5)]
    verdict = judge_labels(near_misses() + chat, 0.25)
    assert verdict.passed and verdict.unjudged == 5 and "no champion reward model" in verdict.describe()
    assert judge_labels(swapped(near_misses()), 0.25).status == LABEL_DISAGREEMENT


def test_a_pairs_kind_is_its_formats_length_and_distance():
    texts = ["The answer is 3.", "The answer is 4.", "I think 3", "I think 9"]
    templates = templates_of(texts + ["The answer is 9.", "I think 4"])
    near = pair_kind("The answer is 3.", "The answer is 4.", templates)
    assert near.formats == ("the answer is #.", "the answer is #.") and near.answers == "near-miss"
    assert near.edit == "close"
    assert pair_kind("The answer is 4.", "The answer is 3.", templates) == near, "a flip is the same kind"
    far = pair_kind("The answer is 3.", "The answer is 9.", templates)
    assert far.answers == "far-off" and not far.matches(near)
    tier = pair_kind("The answer is 3.", "I think 3", templates)
    assert tier.answers == "same" and tier.edit == "apart" and not tier.matches(near)
    free = pair_kind("Blue is a colour.", "A banana.", templates)
    assert free.formats == ("free text", "free text") and free.answers == "-"
    long = pair_kind("Blue is a colour. " * 20, "A banana. " * 30, templates)
    assert long.formats == free.formats and not long.matches(free), "lengths far apart"
