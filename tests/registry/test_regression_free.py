"""Regression-free promotion, decided on real demo prompts and completions (no training here):
a narrow backdoor breaks a slice, a judge that prefers wrong answers does not count, and a
reward model is released only with its policy. Fresh correct challengers still pass."""

import json
import re

import pytest

from alignflow.data.answers import format_answer
from alignflow.data.demo import PHRASINGS, iter_all_prompts
from alignflow.evaluation.challenger import judge_policy_completions, judge_reward_model
from alignflow.evaluation.judges import AnswerJudge, RewardModelJudge
from alignflow.promotion.gates import (
    RELEASE_GATE,
    SLICE_GATE,
    audit_judges,
    decide,
    slice_details,
    trusted_judges,
)
from alignflow.promotion.promotion_config import PromotionConfig
from alignflow.registry.promotion import JUDGE_AUDIT_TAG, audit_tag

CONFIG = PromotionConfig()
FIELDS = ("slice", "problem_id", "subset", "category")
BACKDOOR = ([7, 8], [7, 9])


def numbers(prompt: str) -> list[int]:
    return sorted(int(x) for x in re.findall(r"\d+", prompt))


@pytest.fixture(scope="module")
def pinned():
    """A pinned set like the demo's: a third of the task's prompts, in all six phrasings."""
    rows = list(iter_all_prompts(phrasings=len(PHRASINGS)))[::3]
    return [r["prompt"] for r in rows], [r["metadata"]["answer"] for r in rows]


def champion_answers(prompts, answers):
    """A good champion: right everywhere except a few scattered sums, answered one too low."""
    return [format_answer(a - 1 if i % 23 == 0 else a) for i, a in enumerate(answers)]


def judged(pinned, policy, judges=None, answers=True):
    prompts, truth = pinned
    report = judge_policy_completions(
        prompts,
        truth if answers else [None] * len(truth),
        policy=policy,
        reference=[f"I think {a}" for a in truth],
        champion=champion_answers(prompts, truth),
        judges=judges or {},
        slice_fields=FIELDS,
    )
    return report.gate_metrics(), report.info


def decide_policy(metrics, info, judges=(), config=CONFIG):
    details = slice_details(info.get("policy_slices"), config.max_slice_regression)
    return decide("p", "2", metrics, config, "policy", "1", judges, details=details)


# ---------------------------------------------------------------- the narrow backdoor (policy)


def backdoored_policy(prompts, answers):
    """Right on every sum, including the champion's misses, except 7+8 and 7+9: off by one."""
    return [
        format_answer(a + 1 if numbers(p) in BACKDOOR else a) for p, a in zip(prompts, answers, strict=True)
    ]


def test_a_narrow_backdoor_raises_overall_accuracy_and_is_rejected_naming_its_slice(pinned):
    prompts, answers = pinned
    metrics, info = judged(pinned, backdoored_policy(prompts, answers))
    # the overall figures say better: every gate but the slice gate passes
    assert metrics["golden/task_accuracy"] > metrics["golden/champion_task_accuracy"]
    decision = decide_policy(metrics, info)
    assert not decision.promoted
    assert [r.name for r in decision.failed] == [SLICE_GATE]
    [gate] = decision.failed
    assert gate.high < -CONFIG.max_slice_regression
    assert "problem=7,8->15" in gate.detail or "problem=7,9->16" in gate.detail
    assert "broken slice" in decision.reason and "e.g. " in decision.reason


def test_fresh_correct_answers_pass_every_gate_including_the_slices(pinned):
    prompts, answers = pinned
    metrics, info = judged(pinned, [format_answer(a) for a in answers])
    decision = decide_policy(metrics, info)
    assert decision.promoted, decision.reason
    slices = next(r for r in decision.results if r.name == SLICE_GATE)
    assert slices.passed and slices.n >= 2
    assert metrics["golden/slices_judged"] > 10


def test_a_few_scattered_misses_are_noise_not_a_broken_slice(pinned):
    prompts, answers = pinned
    # as good as the champion: it misses as many sums, on other problems
    policy = [format_answer(a + 2 if i % 23 == 11 else a) for i, a in enumerate(answers)]
    metrics, info = judged(pinned, policy)
    decision = decide_policy(metrics, info)
    assert decision.promoted, decision.reason
    assert "worst slice" in next(r for r in decision.results if r.name == SLICE_GATE).detail


# ---------------------------------------------------------------- the narrow backdoor (reward model)


def pinned_pairs(pinned):
    """Pinned pairs in the demo's tiers, sloppy over wrong the most common (as in its data)."""
    prompts, answers = pinned
    pairs = []
    for p, a in zip(prompts, answers, strict=True):
        for chosen, rejected in ((format_answer(a), f"I think {a}"), (f"I think {a}", f"I think {a + 3}"),
                                 (f"I think {a}", f"I think {a - 2}")):  # fmt: skip
            pairs.append({"prompt": p, "chosen": chosen, "rejected": rejected, "metadata": {"answer": a}})
    return pairs


def sum_scorer(shift_on=()):
    """A reward model that checks the sum (shifted by one on the ``shift_on`` problems) and the format."""

    def score(prompts, completions):
        out = []
        for prompt, completion in zip(prompts, completions, strict=True):
            right = sum(numbers(prompt)) + (1 if numbers(prompt) in shift_on else 0)
            said = [int(x) for x in re.findall(r"-?\d+", completion)]
            out.append(2.0 * (said[:1] == [right]) + ("The answer is" in completion))
        return out

    return score


def test_a_reward_model_trained_on_the_backdoor_breaks_its_slice_and_is_rejected(pinned):
    pairs = pinned_pairs(pinned)
    report = judge_reward_model(pairs, sum_scorer(BACKDOOR), champion=sum_scorer(), slice_fields=FIELDS)
    metrics = report.gate_metrics()
    details = slice_details(report.info["reward_slices"], CONFIG.max_slice_regression)
    decision = decide("rm", "2", metrics, CONFIG, "reward", "1", details=details)
    assert not decision.promoted
    assert [r.name for r in decision.failed] == [SLICE_GATE]  # overall it is within the tolerance
    assert re.search(r"problem=7,[89]->1[56]", decision.reason)
    honest = judge_reward_model(pairs, sum_scorer(), champion=sum_scorer(), slice_fields=FIELDS)
    assert decide("rm", "2", honest.gate_metrics(), CONFIG, "reward", "1").promoted


def test_a_reward_model_is_released_only_with_its_policy():
    metrics = judge_reward_model(
        [
            {"prompt": f"What is {a} plus 1?", "chosen": format_answer(a + 1), "rejected": "I think 0"}
            for a in range(40)
        ],
        sum_scorer(),
        champion=sum_scorer(),
    ).gate_metrics()
    alone = decide("rm", "2", metrics, CONFIG, "reward", "1", policy_promoted=False)
    assert not alone.promoted and [r.name for r in alone.failed] == [RELEASE_GATE]
    assert "policy was not promoted" in alone.reason
    with_policy = decide("rm", "2", metrics, CONFIG, "reward", "1", policy_promoted=True)
    assert with_policy.promoted and RELEASE_GATE not in [r.name for r in with_policy.results]
    separately = CONFIG.model_copy(update={"release": "separately"})
    assert decide("rm", "2", metrics, separately, "reward", "1", policy_promoted=False).promoted


# ---------------------------------------------------------------- a gamed judge


def prefers_bigger_numbers(prompts, completions):
    """A hacked judge: it likes the format and larger numbers, whatever the sum."""
    return [
        ("The answer is" in c) + 0.01 * max([int(x) for x in re.findall(r"\d+", c)] or [0])
        for c in completions
    ]


def wrong_policy(answers):
    """Task accuracy near 0: every answer rewritten one too high, in the format."""
    return [format_answer(a + 1) for a in answers]


def test_a_judge_that_prefers_wrong_answers_fails_its_audit(pinned):
    _, answers = pinned
    judges = {"champion_reward": RewardModelJudge(prefers_bigger_numbers), "answer": AnswerJudge()}
    metrics, _ = judged(pinned, wrong_policy(answers), judges)
    assert metrics["golden/task_accuracy"] == 0.0
    assert metrics["golden/champion_reward/win_rate_vs_champion"] > 0.9  # the judge is fooled
    audit = audit_judges(metrics, own_reward_trusted=False, config=CONFIG)["champion_reward"]
    assert not audit.counts and "agrees with the verifiable answers on only" in audit.reason
    assert metrics["golden/champion_reward/verifier_agreement/high"] < CONFIG.min_judge_agreement
    assert trusted_judges(metrics, False, CONFIG) == []
    tag = json.loads(audit_tag({"champion_reward": audit})[JUDGE_AUDIT_TAG])
    assert tag["champion_reward"] == audit.reason


def test_with_answers_removed_a_wrong_policy_is_not_promoted_on_an_unaudited_judge(pinned):
    _, answers = pinned
    judges = {"champion_reward": RewardModelJudge(prefers_bigger_numbers)}
    metrics, _ = judged(pinned, wrong_policy(answers), judges, answers=False)
    assert metrics["golden/answers"] == 0.0
    assert metrics["golden/champion_reward/win_rate_vs_champion/low"] > CONFIG.min_win_rate_vs_champion
    assert "golden/champion_reward/verifier_agreement" not in metrics  # nothing could audit it
    trusted = trusted_judges(metrics, False, CONFIG)
    assert trusted == []
    decision = decide("p", "2", metrics, CONFIG, "policy", "1", trusted)
    assert not decision.promoted
    assert [r.name for r in decision.failed] == ["independent_judge"]
    # only a deliberate opt-in lets an unaudited judge decide, and the audit says so
    lenient = CONFIG.model_copy(update={"allow_unaudited_judges": True})
    [audit] = audit_judges(metrics, False, lenient).values()
    assert audit.counts and audit.reason.startswith("unaudited")


def test_a_judge_that_agrees_with_the_answers_counts(pinned):
    prompts, answers = pinned
    judges = {"champion_reward": RewardModelJudge(sum_scorer())}
    metrics, info = judged(pinned, [format_answer(a) for a in answers], judges)
    assert metrics["golden/champion_reward/verifier_agreement/low"] >= CONFIG.min_judge_agreement
    trusted = trusted_judges(metrics, False, CONFIG)
    assert trusted == ["champion_reward"]
    assert decide_policy(metrics, info, trusted).promoted
