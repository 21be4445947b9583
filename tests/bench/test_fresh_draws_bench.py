"""The fresh-draws table counts draws, not the champion, and states the margin of each draw."""

from __future__ import annotations

import pytest

from alignflow.promotion.gates import GateResult
from bench.fresh_draws_bench import answer_margins, smallest_margins, to_markdown
from bench.promotion_bench import Challenger, gate_margins


def row(label: str, decision: str, accuracy: float, gate: str, margins: dict[str, float]) -> Challenger:
    return Challenger(label, "policy", "promoted", "1", decision, [], [gate], accuracy, margins)


def test_the_table_counts_promoted_draws_and_states_each_margin():
    gate = "failed: task_accuracy_vs_champion: -0.046 [-0.085, -0.015] n=130, lower bound needs >= -0.05"
    rows = [
        (0, row("champion", "promoted", 1.0, "passed: task_accuracy_gain: 1 [1, 1] n=130", {})),
        (1, row("draw 1", "rejected", 0.954, gate, {"task_accuracy_vs_champion": -0.035})),
        (2, row("draw 2", "promoted", 1.0, "passed: task_accuracy_vs_champion: 0 [0, 0] n=130",
                {"task_accuracy_vs_champion": 0.05, "slice_regression": 0.1})),
    ]  # fmt: skip
    table = to_markdown(rows, {0: 1.5, 1: -0.25, 2: 0.75})
    assert "**1 of 2 draws promoted.**" in table, "one of two draws promoted; the champion is not a draw"
    assert "answer margin -0.25 nats" in table, "the smallest answer margin over all policies"
    assert f"| 1 | 0.954 | rejected | -0.25 | -0.035 | — | {gate} |" in table
    assert "| 0 | 1.000 | promoted | +1.50 | — | — | — (first champion) |" in table
    assert smallest_margins(rows) == {"task_accuracy_vs_champion": -0.035, "slice_regression": 0.1}


def gate(op: str, threshold: float, low: float, high: float, outcome: str, bound: str = "low") -> GateResult:
    return GateResult(
        "g", "m", op, threshold, bound, (low + high) / 2, low, high, 130, outcome == "passed", outcome
    )


def test_a_margin_is_the_deciding_bound_on_the_passing_side_of_its_threshold():
    assert gate_margins([gate(">=", -0.05, -0.02, 0.0, "passed")]) == {"g": 0.03}
    assert gate_margins([gate(">=", -0.05, -0.08, 0.0, "failed")]) == {"g": -0.03}
    assert gate_margins([gate("<=", 1.5, 1.0, 1.2, "passed", "high")]) == {"g": 0.3}
    assert gate_margins([gate(">=", 0.0, 0.1, 0.2, "insufficient_evidence")]) == {}, "not decided on a bound"


def test_an_answer_margin_is_the_right_answers_lead_over_the_best_wrong_one(tiny_model_dir):
    """Asked with every answer as the right one, only the model's own favourite leads, by
    exactly what the runner-up trails by."""
    margins = answer_margins(tiny_model_dir, [("What is 2 plus 3?", answer) for answer in range(19)])
    favourite = max(range(19), key=margins.__getitem__)
    runner_up = max((a for a in range(19) if a != favourite), key=margins.__getitem__)
    assert margins[favourite] > 0
    assert all(m < 0 for a, m in enumerate(margins) if a != favourite)
    assert margins[runner_up] == pytest.approx(-margins[favourite], abs=1e-4)
