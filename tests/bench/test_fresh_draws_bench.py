"""The fresh-draws table counts draws, not the champion, and states the margin of each draw."""

from __future__ import annotations

from alignflow.registry.promotion import GateResult
from bench.fresh_draws_bench import smallest_margins, to_markdown
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
    table = to_markdown(rows)
    assert "**1 of 2 draws promoted.**" in table, "one of two draws promoted; the champion is not a draw"
    assert f"| 1 | 0.954 | rejected | -0.035 | — | {gate} |" in table
    assert "| 0 | 1.000 | promoted | — | — | — (first champion) |" in table
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
