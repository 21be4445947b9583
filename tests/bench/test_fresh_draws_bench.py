"""The fresh-draws table counts draws, not the champion, and shows each draw's deciding gate."""

from __future__ import annotations

from bench.fresh_draws_bench import to_markdown
from bench.promotion_bench import Challenger


def row(label: str, decision: str, accuracy: float, gate: str) -> Challenger:
    return Challenger(label, "policy", "promoted", "1", decision, [], [gate], accuracy)


def test_the_table_counts_promoted_draws_and_names_the_gate_of_each():
    gate = "failed: task_accuracy_vs_champion: -0.046 [-0.085, -0.015] n=130, lower bound needs >= -0.05"
    rows = [
        (0, row("champion", "promoted", 1.0, "passed: task_accuracy_gain: 1 [1, 1] n=130")),
        (1, row("draw 1", "rejected", 0.954, gate)),
        (2, row("draw 2", "promoted", 1.0, "passed: task_accuracy_vs_champion: 0 [0, 0] n=130")),
    ]
    table = to_markdown({"plain": rows})
    assert "| plain | 1 | 2 |" in table, "one of two draws promoted; the champion is not a draw"
    assert f"| plain | 1 | 0.954 | rejected | {gate} |" in table
    assert "| plain | 0 | 1.000 | promoted | — (first champion) |" in table
