"""A judge that failed the label check's audit in a run counts nowhere in it, not as a
promotion judge either (#47); the reason an unjudged data version was accepted is on the
version page of every model trained on it."""

from __future__ import annotations

from alignflow.promotion.gates import JudgeAudit, PromotionDecision
from alignflow.registry.decision_card import JudgedOn, version_description
from alignflow.tasks.registry import discredit


def test_a_judge_discredited_by_the_label_check_does_not_count_in_promotion():
    trusted = JudgeAudit("champion_reward", True, "agrees with the verifiable answers on 0.95")
    failed = discredit(trusted, ["champion_reward"])
    assert not failed.counts
    assert "label check" in failed.reason and "0.95" in failed.reason
    assert discredit(trusted, []) is trusted and discredit(trusted, None) is trusted
    llm = JudgeAudit("llm", True, "agrees")
    assert discredit(llm, ["champion_reward"]) is llm


def test_the_version_page_says_the_data_was_accepted_unjudged():
    decision = PromotionDecision("p-policy", "3", False, (), None)
    page = version_description(decision, JudgedOn(data_version="abc", accepted_unjudged="hand-checked"))
    assert "- Trained on pairs no judge could judge, accepted: hand-checked" in page
    assert "accepted" not in version_description(decision, JudgedOn(data_version="abc"))
