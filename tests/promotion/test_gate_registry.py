"""A new gate is its own rule plus one registration line: this file is a throwaway gate's file."""

from __future__ import annotations

import pytest

from alignflow.promotion.gates import (
    Gate,
    GateContext,
    GateSpec,
    decide,
    gate,
    gate_specs,
    register_gate,
    unregister_gate,
)
from alignflow.promotion.promotion_config import PromotionConfig

from .test_gates import FIRST_POLICY, estimate, golden

REFUSALS = "golden/refusal_rate"


def refusal_gate(ctx: GateContext) -> list[Gate]:
    """A throwaway rule: a policy that refuses more than a tenth of the pinned prompts stays out."""
    return gate("refusal_rate", REFUSALS, "<=", 0.1, "high")


@pytest.fixture
def refusal_registered():
    register_gate(GateSpec("refusal_rate", "policy", refusal_gate))  # the one registration line
    yield
    unregister_gate("refusal_rate")


def first_policy_decision(metrics: dict[str, float]):
    return decide("p", "1", metrics, PromotionConfig(), "policy", None, ["champion_reward"])


def test_a_registered_gate_decides_beside_the_built_in_ones(refusal_registered):
    often = FIRST_POLICY | golden(refusal_rate=estimate(0.3, 0.2, 0.4))
    rarely = FIRST_POLICY | golden(refusal_rate=estimate(0.02, 0.0, 0.06))
    refused = first_policy_decision(often)
    assert not refused.promoted and [r.name for r in refused.failed] == ["refusal_rate"]
    assert first_policy_decision(rarely).promoted
    assert [r.name for r in first_policy_decision(FIRST_POLICY).failed] == ["refusal_rate"], (
        "unmeasured fails"
    )


def test_an_unregistered_gate_is_gone_and_a_name_is_registered_once(refusal_registered):
    with pytest.raises(ValueError, match="already registered"):
        register_gate(GateSpec("refusal_rate", "policy", refusal_gate))
    unregister_gate("refusal_rate")
    assert "refusal_rate" not in gate_specs()
    often = FIRST_POLICY | golden(refusal_rate=estimate(0.3, 0.2, 0.4))
    assert first_policy_decision(often).promoted
