"""Promotion gates as pure functions: judged on interval bounds, with enough rows, by trusted judges.

No MLflow here: metrics are built the way the pinned-set evaluation writes them
(:func:`put_estimate`), and ``decide`` is the decision that ``promote`` would record.
"""

import math

import pytest

from alignflow.data.answers import format_answer
from alignflow.data.demo import make_prompt
from alignflow.evaluation.challenger import judge_policy_completions, judge_reward_model, put_estimate
from alignflow.evaluation.intervals import Estimate, wilson
from alignflow.evaluation.judges import AnswerJudge, RewardModelJudge
from alignflow.evaluation.metric_names import INDEPENDENT_JUDGES, RANDOM_WEIGHTS
from alignflow.promotion.gates import (
    INSUFFICIENT_EVIDENCE,
    Gate,
    check_gates,
    decide,
    gates_for,
    trusted_judges,
)
from alignflow.promotion.promotion_config import PromotionConfig

CONFIG = PromotionConfig()  # min_judged_rows=30, win rate vs champion >= 0.4, length vs champion <= 1.5


def estimate(value: float, low: float, high: float, n: int = 120) -> Estimate:
    return Estimate(value, low, high, n, "test")


def golden(answers: int = 120, **figures: Estimate) -> dict[str, float]:
    """Pinned-set metrics: ``champion_reward__win_rate_vs_champion=...`` is ``golden/champion_reward/...``."""
    metrics: dict[str, float | None] = {"golden/answers": float(answers)}
    for name, figure in figures.items():
        put_estimate(metrics, f"golden/{name.replace('__', '/')}", figure)
    return {k: v for k, v in metrics.items() if v is not None}


FIRST_POLICY = golden(
    task_accuracy_gain=estimate(0.6, 0.5, 0.7),
    champion_reward__win_rate_vs_reference=estimate(0.8, 0.7, 0.9),
    length_growth_ratio=estimate(1.2, 1.1, 1.3),
    loop_rate_vs_reference=estimate(0.0, -0.03, 0.03),
)
GOOD_CHALLENGER = FIRST_POLICY | golden(
    task_accuracy_vs_champion=estimate(0.05, 0.0, 0.1),
    champion_reward__win_rate_vs_champion=estimate(0.55, 0.47, 0.63),
    length_growth_vs_champion=estimate(1.0, 0.95, 1.05),
    # its worst slice: one of six items lost, which is no evidence of a broken slice
    worst_slice_task_accuracy_vs_champion=estimate(-1 / 6, -0.56, 0.21, n=6),
)
# the judges' audit: where the answers decide, the champion reward model agrees with them
AUDITED = golden(
    champion_reward__verifier_agreement=estimate(0.95, 0.9, 0.98),
    reward__verifier_agreement=estimate(0.95, 0.9, 0.98),
    llm__verifier_agreement=estimate(0.9, 0.84, 0.94),
)


def formatted_scorer(prompts, completions):
    """A stand-in reward model: +1 for the required answer format, -1 otherwise."""
    return [1.0 if "The answer is" in c else -1.0 for c in completions]


def indifferent_scorer(prompts, completions):
    """A reward model that cannot tell anything apart."""
    return [0.0] * len(completions)


def result(results, name):
    [found] = [r for r in results if r.name == name]
    return found


def gate(name: str, config: PromotionConfig = CONFIG, **kwargs) -> Gate:
    return next(g for g in gates_for(config, **kwargs) if g.name == name)


# ---------------------------------------------------------------- bounds, not points


def test_a_lucky_point_estimate_fails_on_its_lower_bound():
    lucky = wilson(8, 14)  # 0.57 [0.33, 0.79]
    gains = Gate("gain", "golden/gain", ">", 0.5, "low")
    metrics = golden(gain=lucky)
    [judged] = check_gates(metrics, [gains], min_rows=1)
    assert lucky.value > 0.5  # the point would pass...
    assert not judged.passed and judged.outcome == "failed"  # ...but the bound does not
    assert judged.decisive == pytest.approx(lucky.low)
    assert "lower bound needs > 0.5" in judged.describe()
    # the same share on ten times the rows clears the bar
    [sure] = check_gates(golden(gain=wilson(800, 1400)), [gains], min_rows=1)
    assert sure.passed and sure.outcome == "passed"


def test_task_accuracy_gain_with_a_point_above_zero_and_a_bound_below_fails():
    metrics = FIRST_POLICY | golden(task_accuracy_gain=estimate(0.1, -0.05, 0.25))
    decision = decide("p", "1", metrics, CONFIG, "policy", None, ["champion_reward"])
    assert not decision.promoted
    assert [r.name for r in decision.failed] == ["task_accuracy_gain"]
    assert result(decision.results, "task_accuracy_gain").decisive == -0.05


def test_upper_bound_gates_read_the_high_end():
    growth = gate("length_growth_vs_champion", role="policy", has_champion=True)
    assert (growth.metric, growth.op, growth.bound) == ("golden/length_growth_vs_champion", "<=", "high")
    assert gate("length_growth", role="policy", has_champion=False).bound == "high"
    # the point is well within 1.5, but the upper bound is not
    [judged] = check_gates(golden(length_growth_vs_champion=estimate(1.3, 1.1, 1.6)), [growth], 30)
    assert not judged.passed and judged.decisive == 1.6
    assert "upper bound needs <= 1.5" in judged.describe()
    [judged] = check_gates(golden(length_growth_vs_champion=estimate(1.3, 1.1, 1.45)), [growth], 30)
    assert judged.passed


def test_a_policy_that_says_much_less_than_its_reference_fails_the_length_floor():
    assert "length_shrink" not in names(gates_for(CONFIG, "policy", has_champion=False, judges=["llm"]))
    floor = CONFIG.model_copy(update={"min_length_ratio": 0.67})
    shrink = gate("length_shrink", floor, role="policy", has_champion=False, judges=["llm"])
    assert (shrink.metric, shrink.op, shrink.bound) == ("golden/length_growth_ratio", ">=", "low")
    # declines everything: the point is near the floor, the lower bound under it
    [judged] = check_gates(golden(length_growth_ratio=estimate(0.7, 0.64, 0.76)), [shrink], 30)
    assert not judged.passed and judged.decisive == 0.64
    assert "lower bound needs >= 0.67" in judged.describe()
    [judged] = check_gates(golden(length_growth_ratio=estimate(0.75, 0.72, 0.78)), [shrink], 30)
    assert judged.passed


def test_too_few_rows_fail_as_insufficient_evidence_even_when_the_bound_passes():
    gain = gate("task_accuracy_gain", role="policy", has_champion=False)
    few = golden(task_accuracy_gain=estimate(0.9, 0.8, 1.0, n=29))
    [judged] = check_gates(few, [gain], min_rows=CONFIG.min_judged_rows)
    assert judged.decisive > gain.threshold
    assert not judged.passed
    assert judged.outcome == INSUFFICIENT_EVIDENCE
    assert judged.describe().startswith(f"task_accuracy_gain: {INSUFFICIENT_EVIDENCE}")
    assert "n=29" in judged.describe()
    [enough] = check_gates(golden(task_accuracy_gain=estimate(0.9, 0.8, 1.0, n=30)), [gain], 30)
    assert enough.passed


def test_a_bound_without_its_row_count_is_insufficient_evidence():
    gain = gate("task_accuracy_gain", role="policy", has_champion=False)
    metrics = {"golden/task_accuracy_gain": 0.9, "golden/task_accuracy_gain/low": 0.8}
    [judged] = check_gates(metrics, [gain], min_rows=1)
    assert judged.outcome == INSUFFICIENT_EVIDENCE and judged.n is None


def test_a_missing_metric_or_bound_fails_as_missing():
    gain = gate("task_accuracy_gain", role="policy", has_champion=False)
    [absent] = check_gates({}, [gain])
    assert (absent.passed, absent.outcome, absent.value) == (False, "missing", None)
    assert absent.describe() == "task_accuracy_gain: missing (needs > 0)"
    [no_bound] = check_gates({"golden/task_accuracy_gain": 0.9, "golden/task_accuracy_gain/n": 100}, [gain])
    assert no_bound.outcome == "missing"


def test_value_gates_need_no_row_count_and_reject_non_finite_values():
    kl = gate("kl", PromotionConfig(max_kl=1.0), role="policy", has_champion=False)
    assert kl.bound == "value"
    assert check_gates({"eval/kl_to_reference": 0.5}, [kl], min_rows=30)[0].passed
    assert not check_gates({"eval/kl_to_reference": 1.5}, [kl])[0].passed
    assert not check_gates({"eval/kl_to_reference": float("nan")}, [kl])[0].passed


# ---------------------------------------------------------------- which gates apply


def names(gates) -> list[str]:
    return [g.name for g in gates]


def test_first_policy_is_judged_against_its_reference():
    gates = gates_for(CONFIG, "policy", has_champion=False, judges=["champion_reward", "llm"])
    assert names(gates) == [
        "independent_judge",
        "task_accuracy_gain",
        "champion_reward_beats_reference",
        "llm_beats_reference",
        "length_growth",
        "loop_rate_vs_reference",
    ]
    beats = gate("llm_beats_reference", role="policy", has_champion=False, judges=["llm"])
    assert (beats.metric, beats.op, beats.threshold, beats.bound) == (
        "golden/llm/win_rate_vs_reference",
        ">",
        0.5,
        "low",
    )


def test_a_challenger_is_also_judged_against_the_champion():
    gates = gates_for(CONFIG, "policy", has_champion=True, judges=["champion_reward"])
    assert names(gates) == [
        "independent_judge",
        "task_accuracy_gain",
        "task_accuracy_vs_champion",
        "champion_reward_win_rate_vs_champion",
        "length_growth",
        "length_growth_vs_champion",
        "loop_rate_vs_reference",
        "slice_regression",
    ]
    slices = result(gates, "slice_regression")
    # the worst slice fails only when even its interval's top is below -0.1; a handful of items will do
    assert (slices.metric, slices.op, slices.threshold, slices.bound, slices.min_rows) == (
        "golden/worst_slice_task_accuracy_vs_champion",
        ">=",
        -0.1,
        "high",
        1,
    )
    vs_champion = result(gates, "task_accuracy_vs_champion")
    assert (vs_champion.op, vs_champion.threshold, vs_champion.bound) == (">=", -0.05, "low")
    win = result(gates, "champion_reward_win_rate_vs_champion")
    assert (win.metric, win.op, win.threshold, win.bound) == (
        "golden/champion_reward/win_rate_vs_champion",
        ">=",
        0.4,
        "low",
    )


def test_without_answers_there_are_no_task_accuracy_gates():
    gates = gates_for(CONFIG, "policy", has_champion=True, judges=["llm"], has_answers=False)
    assert not any(g.name.startswith("task_accuracy") for g in gates)
    assert "llm_win_rate_vs_champion" in names(gates)


def test_a_threshold_of_none_switches_its_gate_off():
    config = PromotionConfig(
        max_task_accuracy_regression=None, max_length_growth_vs_champion=None, max_kl=0.5
    )
    gates = names(gates_for(config, "policy", has_champion=True))
    assert "task_accuracy_vs_champion" not in gates
    assert "length_growth_vs_champion" not in gates
    assert "kl" in gates
    assert "kl" not in names(gates_for(CONFIG, "policy", has_champion=True))


def test_reward_model_gates_read_the_lower_bound_and_compare_only_with_a_champion():
    first = gates_for(CONFIG, "reward", has_champion=False)
    assert names(first) == ["reward_accuracy"]
    accuracy = first[0]
    assert (accuracy.metric, accuracy.op, accuracy.threshold, accuracy.bound) == (
        "golden/reward_accuracy",
        ">=",
        0.6,
        "low",
    )
    later = gates_for(CONFIG, "reward", has_champion=True)
    assert names(later) == ["reward_accuracy", "reward_accuracy_vs_champion", "slice_regression"]
    assert later[2].metric == "golden/worst_slice_reward_accuracy_vs_champion"
    assert (later[1].op, later[1].threshold, later[1].bound) == (">=", -0.05, "low")


def test_an_unknown_role_is_refused():
    with pytest.raises(ValueError, match="role must be"):
        gates_for(CONFIG, "critic", has_champion=False)


# ---------------------------------------------------------------- trusted judges


def test_independent_judge_gate_fails_without_answers_or_trusted_judges():
    no_answers = {k: v for k, v in FIRST_POLICY.items() if not k.startswith("golden/task_accuracy")}
    no_answers["golden/answers"] = 0.0
    decision = decide("p", "1", no_answers, CONFIG, "policy", None, judges=[])
    assert not decision.promoted
    independent = result(decision.results, "independent_judge")
    assert not independent.passed and independent.value == 0.0
    assert independent.metric == INDEPENDENT_JUDGES
    # a trusted preference judge is an independent judge
    judged = decide("p", "1", no_answers, CONFIG, "policy", None, judges=["champion_reward"])
    assert judged.promoted, judged.reason
    # so are verifiable answers
    assert result(
        decide("p", "1", FIRST_POLICY, CONFIG, "policy", None, []).results, "independent_judge"
    ).passed


def test_the_challengers_own_reward_model_counts_only_once_trusted():
    metrics = AUDITED | golden(reward__win_rate_vs_reference=estimate(0.9, 0.8, 0.95))
    assert trusted_judges(metrics, own_reward_trusted=False) == []
    assert trusted_judges(metrics, own_reward_trusted=True) == ["reward"]


def test_outside_judges_count_whenever_they_judged_and_passed_their_audit():
    metrics = AUDITED | golden(
        reward__win_rate_vs_champion=estimate(0.9, 0.8, 0.95),
        champion_reward__win_rate_vs_champion=estimate(0.5, 0.4, 0.6),
        llm__win_rate_vs_reference=estimate(0.6, 0.5, 0.7),
        answer__win_rate_vs_reference=estimate(0.6, 0.5, 0.7),  # not a preference judge that counts
    )
    assert trusted_judges(metrics, own_reward_trusted=False) == ["champion_reward", "llm"]
    assert trusted_judges(metrics, own_reward_trusted=True) == ["champion_reward", "llm", "reward"]
    assert trusted_judges(golden(task_accuracy_gain=estimate(0.5, 0.4, 0.6)), True) == []


# ---------------------------------------------------------------- decide


def test_decide_promotes_a_clearly_good_challenger():
    decision = decide("p", "2", GOOD_CHALLENGER, CONFIG, "policy", "1", ["champion_reward"])
    assert decision.promoted, decision.reason
    assert decision.failed == []
    assert decision.reason == "all gates passed"
    assert decision.previous_champion == "1"
    assert decision.judges == ("champion_reward",)
    assert "champion_reward_win_rate_vs_champion" in names(decision.results)


def test_decide_rejects_a_regression_and_names_the_failed_gates():
    regression = GOOD_CHALLENGER | golden(
        task_accuracy_vs_champion=estimate(-0.2, -0.3, -0.1),
        champion_reward__win_rate_vs_champion=estimate(0.3, 0.2, 0.38),
    )
    decision = decide("p", "2", regression, CONFIG, "policy", "1", ["champion_reward"])
    assert not decision.promoted
    assert names(decision.failed) == ["task_accuracy_vs_champion", "champion_reward_win_rate_vs_champion"]
    assert all(r.outcome == "failed" for r in decision.failed)
    assert "task_accuracy_vs_champion: -0.2 [-0.3, -0.1] n=120, lower bound needs >= -0.05" in decision.reason


@pytest.mark.parametrize(
    ("role", "good", "champion", "judges"),
    [
        ("policy", GOOD_CHALLENGER, "1", ["champion_reward"]),
        ("reward", golden(reward_accuracy=estimate(0.9, 0.85, 0.95)), None, []),
    ],
)
def test_a_model_grown_from_random_weights_is_never_promoted(role, good, champion, judges):
    assert decide("p", "2", good, CONFIG, role, champion, judges).promoted
    decision = decide("p", "2", good | {RANDOM_WEIGHTS: 1.0}, CONFIG, role, champion, judges)
    assert not decision.promoted
    assert names(decision.failed) == ["trained_weights"]
    assert "model.weights: random" in decision.reason
    # a run that started from trained weights logs no such metric, or 0
    assert decide("p", "2", good | {RANDOM_WEIGHTS: 0.0}, CONFIG, role, champion, judges).promoted


def test_a_not_clearly_worse_gate_states_its_power_and_says_when_the_pinned_set_is_too_small():
    # challenger and champion differ on 3% of items: telling a 0.05 drop from a tie needs ~95 items
    slip = estimate(-0.03, -0.06, -0.008, n=130)
    enough = (
        GOOD_CHALLENGER
        | golden(task_accuracy_vs_champion=slip)
        | {"golden/task_disagreement_vs_champion": 0.03}
    )
    decision = decide("p", "2", enough, CONFIG, "policy", "1", ["champion_reward"])
    assert names(decision.failed) == ["task_accuracy_vs_champion"]
    assert "differ on 3.0% of 130 items" in decision.reason
    assert "needs 95 (enough)" in decision.reason
    few = enough | golden(task_accuracy_vs_champion=estimate(-0.03, -0.12, 0.05, n=40))
    decision = decide("p", "2", few, CONFIG, "policy", "1", ["champion_reward"])
    assert "needs 95 (too few: a tie can fail by chance; grow the pinned set)" in decision.reason
    noisy = enough | {"golden/task_disagreement_vs_champion": 0.2}  # more disagreement, more items
    assert "needs 628 (too few" in decide("p", "2", noisy, CONFIG, "policy", "1", ["champion_reward"]).reason


def test_decide_uses_first_policy_gates_when_the_champion_is_the_version_itself():
    decision = decide("p", "1", FIRST_POLICY, CONFIG, "policy", "1", ["champion_reward"])
    assert decision.promoted, decision.reason
    assert "champion_reward_beats_reference" in names(decision.results)
    assert "length_growth_vs_champion" not in names(decision.results)


def test_decide_fails_a_trusted_judge_that_did_not_judge_against_the_champion():
    decision = decide("p", "2", FIRST_POLICY, CONFIG, "policy", "1", ["champion_reward"])
    outcomes = {r.name: r.outcome for r in decision.failed}
    assert outcomes == {
        "task_accuracy_vs_champion": "missing",
        "champion_reward_win_rate_vs_champion": "missing",
        "length_growth_vs_champion": "missing",
        "slice_regression": "missing",
    }


def test_decide_on_a_reward_model():
    pairs = [
        {"prompt": make_prompt(a, 1), "chosen": format_answer(a + 1), "rejected": "I think 0"}
        for a in range(40)
    ]
    prefers_format, prefers_nothing = formatted_scorer, indifferent_scorer
    first = judge_reward_model(pairs, prefers_format).gate_metrics()
    assert first["golden/reward_accuracy"] == 1.0 and first["golden/reward_accuracy/n"] == 40
    assert decide("rm", "1", first, CONFIG, "reward", None).promoted
    # the first reward model's accuracy gate is all there is; with a champion it must not regress
    assert names(decide("rm", "1", first, CONFIG, "reward", None).results) == ["reward_accuracy"]
    no_comparison = decide("rm", "2", first, CONFIG, "reward", "1")
    assert {r.name: r.outcome for r in no_comparison.failed} == {
        "reward_accuracy_vs_champion": "missing",
        "slice_regression": "missing",
    }
    worse = judge_reward_model(pairs, prefers_nothing, champion=prefers_format).gate_metrics()
    rejected = decide("rm", "2", worse, CONFIG, "reward", "1")
    # all 40 pairs are asked in one phrasing: that slice broke too
    assert names(rejected.failed) == ["reward_accuracy", "reward_accuracy_vs_champion", "slice_regression"]
    better = judge_reward_model(pairs, prefers_format, champion=prefers_nothing).gate_metrics()
    assert decide("rm", "2", better, CONFIG, "reward", "1").promoted


# ---------------------------------------------------------------- end to end on completions


@pytest.fixture(scope="module")
def pinned():
    problems = [(a, b) for a in range(8) for b in range(5)]  # 40 prompts
    prompts = [make_prompt(a, b) for a, b in problems]
    answers = [a + b for a, b in problems]
    return prompts, answers


def judged_metrics(pinned, challenger: list[str]) -> dict[str, float]:
    prompts, answers = pinned
    report = judge_policy_completions(
        prompts,
        answers,
        policy=challenger,
        reference=[f"I think {n}" for n in answers],
        champion=[format_answer(n) for n in answers],
        judges={"champion_reward": RewardModelJudge(formatted_scorer), "answer": AnswerJudge()},
    )
    return report.gate_metrics()


def decide_on(metrics):
    judges = trusted_judges(metrics, own_reward_trusted=False)
    assert set(judges) <= {"champion_reward"}  # the answer judge is no preference judge that counts
    return decide("p", "2", metrics, CONFIG, "policy", champion="1", judges=judges)


def test_completions_of_a_good_challenger_pass_every_gate(pinned):
    _, answers = pinned
    metrics = judged_metrics(pinned, [format_answer(n) for n in answers])
    assert metrics["golden/task_accuracy"] == 1.0
    assert metrics["golden/reference_task_accuracy"] == 0.0
    assert metrics["golden/task_accuracy_gain/low"] == 1.0
    assert metrics["golden/champion_reward/win_rate_vs_reference"] == 1.0
    assert metrics["golden/champion_reward/win_rate_vs_champion"] == 0.5  # ties with its equal
    assert metrics["golden/champion_reward/win_rate_vs_champion/n"] == 40
    decision = decide_on(metrics)
    assert decision.promoted, decision.reason
    assert decision.judges == ("champion_reward",)
    assert metrics["golden/champion_reward/verifier_agreement"] == 1.0  # it picks what the answers pick


def test_completions_padded_with_filler_fail_the_length_gate_against_the_champion(pinned):
    _, answers = pinned
    metrics = judged_metrics(pinned, [format_answer(n) + " filler" * 20 for n in answers])
    decision = decide_on(metrics)
    assert not decision.promoted
    failed = names(decision.failed)
    assert "length_growth_vs_champion" in failed
    assert not {"task_accuracy_gain", "task_accuracy_vs_champion"} & set(failed)
    # the formatted-answer reward model cannot tell the padding apart: only the length gate sees it
    assert "champion_reward_win_rate_vs_champion" not in failed
    assert result(decision.results, "length_growth_vs_champion").high > 5


def test_completions_that_loop_fail_the_degeneration_gate_though_the_reward_model_likes_them(pinned):
    _, answers = pinned
    looping = [" ".join([format_answer(n)] * 3) for n in answers]
    metrics = judged_metrics(pinned, looping)
    assert metrics["golden/loop_rate"] == 1.0 and metrics["golden/reference_loop_rate"] == 0.0
    assert metrics["golden/champion_loop_rate"] == 0.0
    assert metrics["golden/loop_rate_vs_reference/low"] > 0.8
    # the formatted-answer reward model and the answers find it as good as the champion
    assert metrics["golden/champion_reward/win_rate_vs_champion"] == 0.5
    assert metrics["golden/task_accuracy"] == 1.0
    decision = decide_on(metrics)
    assert "loop_rate_vs_reference" in names(decision.failed)
    assert not {"task_accuracy_vs_champion", "champion_reward_win_rate_vs_champion"} & set(
        names(decision.failed)
    )
    detail = result(decision.results, "loop_rate_vs_reference").detail
    assert "loops in 100.0%" in detail and "the reference in 0.0%" in detail
    assert "decoding settings not recorded" in detail  # judged from completions alone


def test_a_policy_that_loops_no_more_than_its_reference_passes_the_degeneration_gate(pinned):
    prompts, answers = pinned
    loop = "I think I think I think I think"
    # half the prompts loop, the same half on both sides: the policy loops no more than it did
    policy = [loop if i % 2 else format_answer(n) for i, n in enumerate(answers)]
    reference = [loop if i % 2 else f"I think {n}" for i, n in enumerate(answers)]
    report = judge_policy_completions(prompts, answers, policy=policy, reference=reference)
    metrics = report.gate_metrics()
    assert metrics["golden/loop_rate"] == metrics["golden/reference_loop_rate"] == 0.5
    [loop_gate] = [g for g in gates_for(CONFIG, "policy", False) if g.name == "loop_rate_vs_reference"]
    [judged] = check_gates(metrics, [loop_gate], CONFIG.min_judged_rows)
    assert judged.passed and judged.value == 0.0
    # looping on every prompt, where the reference looped on half: clearly worse
    worse = judge_policy_completions(prompts, answers, policy=[loop] * len(answers), reference=reference)
    [judged] = check_gates(worse.gate_metrics(), [loop_gate], CONFIG.min_judged_rows)
    assert not judged.passed and judged.low > 0.3
    # each pinned row says whether each side looped
    assert [row["loops/policy"] for row in report.samples[:2]] == [False, True]
    assert [row["loops/reference"] for row in report.samples[:2]] == [False, True]


def test_a_few_prompts_where_neither_side_loops_pass_the_degeneration_gate(pinned):
    prompts, answers = pinned
    few = judge_policy_completions(
        prompts[:12], answers[:12], policy=[format_answer(n) for n in answers[:12]],
        reference=[f"I think {n}" for n in answers[:12]],
    ).gate_metrics()  # fmt: skip
    [loop_gate] = [g for g in gates_for(CONFIG, "policy", False) if g.name == "loop_rate_vs_reference"]
    [judged] = check_gates(few, [loop_gate], CONFIG.min_judged_rows)
    # 12 prompts cannot bound "never loops" tightly (the interval reaches +0.24), yet nothing looped
    assert judged.passed and judged.high > 0.2 and judged.n == 12


def test_the_degeneration_gate_can_be_switched_off():
    names_on = [g.name for g in gates_for(CONFIG, "policy", False)]
    off = CONFIG.model_copy(update={"max_loop_rate_increase": None})
    assert "loop_rate_vs_reference" in names_on
    assert "loop_rate_vs_reference" not in [g.name for g in gates_for(off, "policy", False)]
    assert "loop_rate_vs_reference" not in [g.name for g in gates_for(CONFIG, "reward", False)]


def test_completions_with_wrong_answers_fail_task_accuracy_against_the_champion(pinned):
    _, answers = pinned
    metrics = judged_metrics(pinned, [format_answer(n + 1) for n in answers])
    assert metrics["golden/answer/win_rate_vs_champion"] == 0.0
    # the formatted-answer reward model calls every wrong answer a tie with the right one: where the
    # answers decide it never agrees with them, so it does not count
    assert metrics["golden/champion_reward/verifier_agreement/high"] < CONFIG.min_judge_agreement
    assert trusted_judges(metrics, own_reward_trusted=False) == []
    decision = decide_on(metrics)
    assert not decision.promoted
    failed = result(decision.results, "task_accuracy_vs_champion")
    assert not failed.passed and failed.value == -1.0
    assert "task_accuracy_vs_champion" in names(decision.failed)
    assert "length_growth_vs_champion" not in names(decision.failed)


def test_the_human_gate_decides_on_the_lower_bound_of_the_rating_gain_alone():
    from alignflow.service.ab import human_metrics

    rng = __import__("random").Random(1)
    better = [min(1, max(0, rng.gauss(0.75, 0.1))) for _ in range(60)]
    worse = [min(1, max(0, rng.gauss(0.55, 0.1))) for _ in range(60)]
    same = list(reversed(worse))  # the same ratings: no gain at all

    def verdict(challenger, champion, config=CONFIG):
        metrics = human_metrics({"2": challenger, "1": champion}, challenger="2", champion="1")
        return decide("p", "2", metrics, config, "policy", "1", ["human"], human=True)

    assert verdict(better, worse).promoted
    assert [r.name for r in verdict(better, worse).results] == ["human_score_gain"]  # nothing else
    assert not verdict(worse, better).promoted
    assert not verdict(same, worse).promoted, "no clear gain: the lower bound is not above zero"
    few = verdict(better[:10], worse[:10])
    assert not few.promoted and few.results[0].outcome == "insufficient_evidence"
    demanding = PromotionConfig(min_human_score_gain=0.3)
    assert not verdict(better, worse, demanding).promoted  # a gain of ~0.2 is not the 0.3 asked for


def test_a_reward_model_that_outputs_nan_fails_the_calibration_gate():
    from alignflow.evaluation.metrics import reward_model_metrics

    nan = float("nan")
    metrics = reward_model_metrics([nan] * 40, [nan] * 40)
    ece = gate("reward_ece", PromotionConfig(max_reward_ece=0.2), role="reward", has_champion=False)
    [judged] = check_gates(metrics, [ece])
    assert not judged.passed
    margin = math.log(3.0)  # says 0.75 and is right on 3 pairs in 4: calibrated
    calibrated = reward_model_metrics([margin] * 30 + [0.0] * 10, [0.0] * 30 + [margin] * 10)
    assert check_gates(calibrated, [ece])[0].passed  # the gate can pass: it is the NaN that fails it


# ---------------------------------------------------------------- the RL stage against its start

RL_GAIN = PromotionConfig(min_rl_gain=0.01)


def rl_judged(pinned, policy: list[str], rl_start: list[str], answers: bool = True) -> dict[str, float]:
    """The pinned-set figures of a first policy whose RL stage started from ``rl_start``,
    judged against a reference (the base model) that answers nothing right."""
    prompts, known = pinned
    report = judge_policy_completions(
        prompts,
        known if answers else [None] * len(known),
        policy=policy,
        reference=[f"I think {n}" for n in known],
        judges={"champion_reward": RewardModelJudge(formatted_scorer)},
        rl_start=rl_start,
    )
    return report.gate_metrics()


def decide_first(metrics, config: PromotionConfig = RL_GAIN):
    return decide("p", "1", metrics, config, "policy", champion=None, judges=["champion_reward"])


def test_the_rl_gain_gate_is_off_unless_a_config_asks_for_it():
    for has_answers in (True, False):
        names_made = names(gates_for(CONFIG, "policy", False, ["champion_reward"], has_answers))
        assert not [n for n in names_made if "rl_gain" in n]


def test_a_policy_that_rl_made_better_than_its_sft_start_passes_the_rl_gain_gate(pinned):
    _, answers = pinned
    # SFT got every other sum right; RL got them all
    start = [format_answer(n if i % 2 else n + 1) for i, n in enumerate(answers)]
    metrics = rl_judged(pinned, [format_answer(n) for n in answers], start)
    assert metrics["golden/rl_start_task_accuracy"] == 0.5
    assert metrics["golden/rl_gain"] == 0.5 and metrics["golden/rl_gain/low"] > 0.3
    assert metrics["golden/task_accuracy_gain"] == 1.0, "the gain over the base model, beside it"
    gate_result = result(decide_first(metrics).results, "rl_gain")
    assert gate_result.passed and gate_result.n == 40
    line = gate_result.describe()
    assert line.startswith("rl_gain: 0.5 [") and "n=40, lower bound needs >= 0.01" in line
    assert "policy vs its RL start" in line and "task accuracy 1.000 vs its start's 0.500" in line


def test_a_policy_identical_to_its_sft_start_is_rejected_by_the_rl_gain_gate(pinned):
    """The adversarial case: all of the gain over the base model is SFT's, RL added nothing."""
    _, answers = pinned
    sft = [format_answer(n) for n in answers]
    metrics = rl_judged(pinned, list(sft), sft)
    assert metrics["golden/task_accuracy_gain/low"] == 1.0, "a perfect gain over the base model"
    assert (metrics["golden/rl_gain"], metrics["golden/rl_gain/low"]) == (0.0, 0.0)
    assert metrics["golden/rl_start_is_reference"] == 0.0
    decision = decide_first(metrics)
    assert not decision.promoted
    assert [r.name for r in decision.failed] == ["rl_gain"]
    assert "rl_gain: 0 [0, 0] n=40, lower bound needs >= 0.01 (policy vs its RL start" in decision.reason
    assert decide_first(metrics, CONFIG).promoted, "without min_rl_gain the same policy is promoted"


def test_without_answers_the_rl_gain_gate_reads_each_trusted_judges_win_rate_against_the_start(pinned):
    _, answers = pinned
    unformatted = [f"I think {n}" for n in answers]
    better = rl_judged(pinned, [format_answer(n) for n in answers], unformatted, answers=False)
    same = rl_judged(pinned, unformatted, list(unformatted), answers=False)
    assert "golden/rl_gain" not in better
    passed = result(decide_first(better).results, "champion_reward_rl_gain")
    assert passed.passed and passed.value == 1.0 and passed.threshold == pytest.approx(0.51)
    tied = result(decide_first(same).results, "champion_reward_rl_gain")
    assert not tied.passed and tied.low == 0.5
    assert "policy vs its RL start" in tied.describe() and "win rate by champion_reward" in tied.describe()


class CountingJudge(AnswerJudge):
    """The verifiable answer judge, counting how often it is asked."""

    name = "j"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def compare(self, prompts, a, b, metadata=None):
        self.calls += 1
        return super().compare(prompts, a, b, metadata)


def test_where_the_rl_start_is_the_reference_its_figures_are_the_references_measured_once(pinned):
    prompts, answers = pinned
    base = [f"I think {n}" for n in answers]
    judge = CountingJudge()
    report = judge_policy_completions(
        prompts, answers, [format_answer(n) for n in answers], base, judges={"j": judge}, rl_start=base
    )
    metrics = report.gate_metrics()
    assert judge.calls == 1, "the reference's completions are judged once"
    assert metrics["golden/rl_start_is_reference"] == 1.0
    for rl_key, reference_key in (
        ("rl_gain", "task_accuracy_gain"),
        ("rl_start_task_accuracy", "reference_task_accuracy"),
        ("j/win_rate_vs_rl_start", "j/win_rate_vs_reference"),
    ):
        for suffix in ("", "/low", "/high", "/n"):
            assert metrics[f"golden/{rl_key}{suffix}"] == metrics[f"golden/{reference_key}{suffix}"]
    assert "reference itself" in report.info["rl_start"]
