"""A new pinned-set judge is its own class plus one registration line: this file is a throwaway
judge's file. Evaluation builds it, its win rates are recorded, promotion audits and gates it."""

from __future__ import annotations

import pytest

from alignflow.data.answers import format_answer
from alignflow.data.demo import make_prompt
from alignflow.evaluation.challenger import judge_policy_completions
from alignflow.evaluation.config import EvaluationConfig
from alignflow.evaluation.judge_registry import (
    JudgeInputs,
    JudgeSpec,
    build_pinned_set_judges,
    outside_judges,
    register_judge,
    unregister_judge,
)
from alignflow.promotion.gates import decide, trusted_judges
from alignflow.promotion.promotion_config import PromotionConfig


class BrevityJudge:
    """A throwaway judge: the shorter completion wins (a tie within two characters)."""

    name = "brevity"

    def compare(self, prompts, a, b, metadata=None):
        return [
            0.5 if abs(len(x) - len(y)) <= 2 else float(len(x) < len(y)) for x, y in zip(a, b, strict=True)
        ]


@pytest.fixture
def brevity_registered():
    register_judge(JudgeSpec("brevity", lambda inputs: BrevityJudge()))  # the one registration line
    yield
    unregister_judge("brevity")


def test_the_built_in_judges_are_built_only_where_they_can_judge():
    config = EvaluationConfig()
    assert build_pinned_set_judges(JudgeInputs(config)) == {}
    scorer = lambda prompts, completions: [0.0] * len(completions)  # noqa: E731
    built = build_pinned_set_judges(JudgeInputs(config, scorer=scorer, champion_scorer=scorer))
    assert list(built) == ["champion_reward", "reward"]
    assert "reward" not in outside_judges() and "champion_reward" in outside_judges()


def pinned_metrics(policy_answer) -> dict[str, float]:
    problems = [(a, b) for a in range(8) for b in range(5)]
    answers = [a + b for a, b in problems]
    judges = build_pinned_set_judges(JudgeInputs(EvaluationConfig()))
    report = judge_policy_completions(
        [make_prompt(a, b) for a, b in problems],
        answers,
        policy=[policy_answer(n) for n in answers],
        reference=[f"Well, let me think about it: I would say that it is {n}." for n in answers],
        judges=judges,
    )
    return report.gate_metrics()


def test_a_registered_judge_is_evaluated_audited_and_gated(brevity_registered):
    assert "brevity" in build_pinned_set_judges(JudgeInputs(EvaluationConfig()))
    short_and_right = pinned_metrics(format_answer)
    assert short_and_right["golden/brevity/win_rate_vs_reference"] == 1.0
    assert trusted_judges(short_and_right, own_reward_trusted=False) == ["brevity"], "agrees with the answers"
    decision = decide("p", "1", short_and_right, PromotionConfig(), "policy", None, ["brevity"])
    assert "brevity_beats_reference" in [r.name for r in decision.results] and decision.promoted
    # short and wrong: the judge prefers what the answers call wrong, so it is not trusted
    short_and_wrong = pinned_metrics(lambda n: format_answer(n + 1))
    assert trusted_judges(short_and_wrong, own_reward_trusted=False) == []


def test_an_unregistered_judge_is_neither_built_nor_trusted(brevity_registered):
    metrics = pinned_metrics(format_answer)
    unregister_judge("brevity")
    assert "brevity" not in build_pinned_set_judges(JudgeInputs(EvaluationConfig()))
    assert trusted_judges(metrics, own_reward_trusted=False) == []
