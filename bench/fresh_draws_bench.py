"""Fresh correct data against the demo's champion: is it promoted, draw after draw?

The promotion gates must stop regressions, not ties. This measures the demo recipe on that
promise: a champion from the demo rows (data seed 0, training seed 0), then, for each of
``DRAWS``, a copy of its workspace where the whole flow runs on another draw of correct demo
rows *and* another training seed (same split, so no pinned prompt in training), and the gates
decide against that champion. A draw and a seed move a run at least as much as another CPU's
rounding does, so a recipe that passes here does not depend on the machine it was tuned on.

Besides each decision it reports the margin the promise relies on: how far the deciding
bound of ``task_accuracy_vs_champion`` and of ``slice_regression`` lay on the passing side of
its threshold, and the smallest of those over the draws.

Writes ``bench/results/fresh_draws.md``; every figure is read back from the registry.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench.promotion_bench import Challenger, _base, _outcome, _retrain, tracking_uri

DRAWS = (1, 2, 3, 4, 5, 6, 7, 8)
# the demo's answers: sums of two digits
ANSWERS = range(19)
# the gates a fresh draw of a recipe at the ceiling can fail by chance: the others compare with
# the reference (far below) or measure length, which a correct draw does not change
MARGIN_GATES = ("task_accuracy_vs_champion", "slice_regression")


def _policy_outcome(workspace: Path, summary: dict[str, Any], label: str) -> Challenger:
    decision = summary["promotions"]["policy"]
    return _outcome(
        tracking_uri(workspace), label, "policy", "promoted", decision["name"], decision["version"]
    )


def answer_margins(model_dir: str | Path, prompts: list[tuple[str, int]], answers=ANSWERS) -> list[float]:
    """Per prompt, how far the right answer in the required format out-scores the best wrong one
    (log-probability of the whole answer, in nats): what greedy decoding turns into a right or a
    wrong answer, so the room a policy leaves for another CPU's rounding or another draw."""
    from alignflow.models.factory import load_causal_lm
    from alignflow.models.prompting import format_prompt

    model, tokenizer = load_causal_lm(model_dir)
    model.eval()
    margins = []
    for prompt, right in prompts:
        context = format_prompt(tokenizer, prompt)
        start = len(tokenizer(context, add_special_tokens=False)["input_ids"])
        scores = dict(zip(answers, _answer_logps(model, tokenizer, context, start, answers), strict=True))
        margins.append(scores[right] - max(v for a, v in scores.items() if a != right))
    return margins


def _answer_logps(model: Any, tokenizer: Any, context: str, start: int, answers) -> list[float]:
    """Log-probability of each formatted answer after ``context``, in one right-padded batch."""
    import torch

    from alignflow.data.answers import format_answer

    rows = [tokenizer(context + format_answer(a), add_special_tokens=False)["input_ids"] for a in answers]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
    with torch.no_grad():
        logps = model(input_ids=ids, attention_mask=mask).logits.float().log_softmax(-1)
    return [
        logps[i, start - 1 : len(row) - 1].gather(-1, ids[i, start : len(row), None]).sum().item()
        for i, row in enumerate(rows)
    ]


def pinned_answers(workspace: Path) -> list[tuple[str, int]]:
    """The pinned prompts with a reference answer, once each."""
    from alignflow.evaluation.golden import load_golden_records

    found: dict[str, int] = {}
    for record in load_golden_records(workspace / "golden"):
        answer = (record.get("metadata") or {}).get("answer")
        if answer is not None:
            found.setdefault(record["prompt"], int(answer))
    return list(found.items())


def run_draws(
    root: Path, draws: tuple[int, ...] = DRAWS
) -> tuple[list[tuple[int, Challenger]], dict[int, float]]:
    """The demo's champion (draw 0), then each fresh draw, with its own seed, judged against it;
    and each policy's smallest answer margin over the pinned prompts."""
    from alignflow.config import load_config
    from alignflow.data.demo import write_configured_demo

    home = root / "champion"
    summary = _retrain(home)
    rows = [(0, _policy_outcome(home, summary, "champion"))]
    prompts = pinned_answers(home)
    smallest = {0: min(answer_margins(_policy_dir(summary), prompts))}
    data = load_config(None, _base(home)).data
    for seed in draws:
        workspace = root / f"draw-{seed}"
        shutil.copytree(home, workspace)
        fresh = write_configured_demo(data, workspace / "fresh", seed=seed)
        summary = _retrain(workspace, f"data.source={fresh}", f"seed={seed}")
        rows.append((seed, _policy_outcome(workspace, summary, f"draw {seed}")))
        smallest[seed] = min(answer_margins(_policy_dir(summary), prompts))
    return rows, smallest


def _policy_dir(summary: dict[str, Any]) -> str:
    return next(s["output"]["model_dir"] for s in summary["stages"] if s["name"] == "policy")


def promoted_draws(rows: list[tuple[int, Challenger]]) -> int:
    """Draws promoted against the champion (draw 0 is the champion itself)."""
    return sum(row.decision == "promoted" for seed, row in rows if seed)


def smallest_margins(rows: list[tuple[int, Challenger]]) -> dict[str, float | None]:
    """Per margin gate, the least room any draw left (None: no draw was decided on it)."""
    smallest: dict[str, float | None] = {}
    for gate in MARGIN_GATES:
        found = [row.margins[gate] for seed, row in rows if seed and gate in row.margins]
        smallest[gate] = min(found) if found else None
    return smallest


def _margin(row: Challenger, gate: str) -> str:
    return f"{row.margins[gate]:+.3f}" if gate in row.margins else "—"


def _gate_line(row: Challenger, gate: str) -> str:
    return next((g for g in row.gates if f" {gate}: " in g), "—")


def to_markdown(
    rows: list[tuple[int, Challenger]], answer_margin: dict[int, float] | None = None, machine: str = ""
) -> str:
    answer_margin = answer_margin or {}
    draws = len(rows) - 1
    smallest = smallest_margins(rows)
    lines = [
        "# Fresh correct data against the demo's champion",
        "",
        "Generated by `python -m bench fresh_draws` (`bench/fresh_draws_bench.py`). A champion from",
        "the demo rows (draw 0, training seed 0), then each fresh draw of correct demo rows, trained",
        "by the whole flow with the demo recipe and its own training seed in a copy of that workspace",
        "and judged by the gates against that champion on the same pinned set. Pinned accuracy: task",
        "accuracy on the pinned prompts. Margin: how far the gate's deciding bound lay on the passing",
        "side of its threshold (task_accuracy_vs_champion: lower bound >= -0.05; slice_regression:",
        "upper bound of the worst slice's change >= -0.1); negative means the gate failed.",
        "Answer margin: the policy's smallest, over the pinned prompts, log-probability lead (nats) of",
        "the right answer in the required format over the best wrong sum: below 0 a prompt is answered",
        "wrong; near 0 another CPU's rounding can flip it.",
        *([f"Machine: {machine}.", ""] if machine else [""]),
        f"**{promoted_draws(rows)} of {draws} draws promoted.** Smallest margins over the draws: "
        + ", ".join(f"{gate} {'—' if m is None else f'{m:+.3f}'}" for gate, m in smallest.items())
        + (f", answer margin {min(answer_margin.values()):+.2f} nats" if answer_margin else "")
        + ".",
        "",
        "| draw (= training seed) | pinned accuracy | decision | answer margin | "
        + " | ".join(f"{gate} margin" for gate in MARGIN_GATES)
        + f" | {MARGIN_GATES[0]} |",
        "|---|---|---|---|" + "---|" * (len(MARGIN_GATES) + 1),
    ]
    for seed, row in rows:
        accuracy = "" if row.accuracy is None else f"{row.accuracy:.3f}"
        lead = f"{answer_margin[seed]:+.2f}" if seed in answer_margin else "—"
        margins = " | ".join(_margin(row, gate) for gate in MARGIN_GATES)
        gate = "— (first champion)" if seed == 0 else _gate_line(row, MARGIN_GATES[0])
        lines.append(f"| {seed} | {accuracy} | {row.decision} | {lead} | {margins} | {gate} |")
    return "\n".join(lines) + "\n"


def run() -> dict:
    from alignflow.flows.environment import apply_defaults, local_flow_settings
    from bench.training_bench import machine

    kept = os.environ.get("ALIGNFLOW_BENCH_KEEP")  # a folder to keep the workspaces in, to study them
    root = Path(kept) if kept else Path(tempfile.mkdtemp(prefix="alignflow-fresh-draws-"))
    root.mkdir(parents=True, exist_ok=True)
    apply_defaults(root)  # the CLI's Prefect settings: its API's start-up allowance on a loaded machine
    try:
        with local_flow_settings():
            rows, answer_margin = run_draws(root)
    finally:
        if not kept:
            shutil.rmtree(root, ignore_errors=True)
    (Path(__file__).parent / "results" / "fresh_draws.md").write_text(
        to_markdown(rows, answer_margin, machine()), encoding="utf-8"
    )
    smallest = smallest_margins(rows)
    return {
        "draws": len(rows) - 1,
        "promoted": promoted_draws(rows),
        **{f"smallest_margin_{gate}": margin for gate, margin in smallest.items()},
        "smallest_answer_margin_nats": round(min(answer_margin.values()), 3),
    }
