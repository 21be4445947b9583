"""The retraining flow end to end, stage by stage, one run per kind of machine kept side by side
(issue #50: the smollm2-math flow on a GPU, its wall time per stage beside the CPU's).

``alignflow run --config CONFIG --set model.weights=random`` in a scratch workspace. Random
weights on every machine, so that every machine does the same work (a random model never
stops early: each completion runs to its length limit) and a GPU machine, which cannot
receive the real weights, needs only the config-only copies ``tools/gpu_flow_payload.py``
carries. Per stage: its wall seconds as the flow timed them, CPU and GPU seconds, tokens
trained and MFU (the stage's ``cost/*`` figures), and where its run says it ran (the
``cost.device`` tag: a trainer's device, the evaluation's inference device).

Knobs (environment): ``ALIGNFLOW_BENCH_FLOW_CONFIG`` (``configs/smollm2-math.yaml``),
``ALIGNFLOW_BENCH_FLOW_SET`` (more ``--set`` overrides, comma-separated: a shortened check;
kept in the result, and a run with overrides is not the config's).

``python -m bench flow_stages`` merges this machine's run into ``bench/results/flow_stages.json``
(the other machines' runs stay) and writes ``flow_stages.md``. On the GPU machine it also writes
``$OUT/flow_stages.json``; here ``python -m bench.flow_stages_bench --merge FILE`` merges it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.provenance import code_commit
from bench.training_bench import REPO, RESULTS, cpu_name

CONFIG = os.environ.get("ALIGNFLOW_BENCH_FLOW_CONFIG", "configs/smollm2-math.yaml")
EXTRA = [s for s in os.environ.get("ALIGNFLOW_BENCH_FLOW_SET", "").split(",") if s]
RESULT = RESULTS / "flow_stages.json"
# the flow's order (python -m bench writes the result with its keys sorted); others follow
FLOW_ORDER = ("data", "sft", "reward", "policy", "evaluate", "register", "promote")
COST_KEYS = {
    "cpu_s": "cost/cpu_seconds",
    "gpu_s": "cost/gpu_seconds",
    "tokens": "cost/tokens_trained",
    "mfu": "cost/mfu",
    "peak_gflops": "cost/peak_gflops",
}


def machine_kind() -> str:
    """The GPU by name where there is one, else the CPU with its family and matrix units."""
    import torch

    return f"GPU: {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else f"CPU: {cpu_name()}"


def run_flow(workspace: Path, config: Path, overrides: list[str]) -> dict[str, Any]:
    """The flow as a user starts it, in ``workspace``; its summary."""
    command = [sys.executable, "-m", "alignflow.cli", "run", "--config", str(config), "-q"]
    for setting in ["model.weights=random", f"tracking.uri=sqlite:///{workspace / 'mlflow.db'}", *overrides]:
        command += ["--set", setting]
    command += ["--summary-json", str(workspace / "summary.json")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
           os.environ.get("PYTHONPATH")]))}  # fmt: skip
    subprocess.run(command, cwd=workspace, check=True, env=env)
    return json.loads((workspace / "summary.json").read_text())


def stage_rows(summary: dict[str, Any], devices: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Per stage: wall seconds, its cost figures and the device its run recorded."""
    rows = {}
    for stage in summary["stages"]:
        cost = stage.get("cost") or {}
        row: dict[str, Any] = {"wall_s": round(stage["seconds"], 2), "cached": stage["cached"]}
        row |= {name: cost[key] for name, key in COST_KEYS.items() if key in cost}
        row["device"] = devices.get(stage["name"])
        rows[stage["name"]] = row
    return rows


def recorded_devices(uri: str, parent_run_id: str) -> dict[str, str]:
    from alignflow.evaluation.cost import DEVICE_TAG
    from alignflow.registry.runs import child_runs

    return {
        run.info.run_name: run.data.tags[DEVICE_TAG]
        for run in child_runs(uri, parent_run_id)
        if DEVICE_TAG in run.data.tags
    }


def measure(config: str = CONFIG, overrides: list[str] | None = None) -> dict[str, Any]:
    """One run of the flow on this machine, as a result entry."""
    import torch

    overrides = EXTRA if overrides is None else overrides
    commit = code_commit(REPO)
    with tempfile.TemporaryDirectory(prefix="alignflow-flow-stages-") as tmp:
        workspace = Path(tmp)
        started = time.perf_counter()
        summary = run_flow(workspace, REPO / config, overrides)
        command_s = time.perf_counter() - started
        devices = recorded_devices(f"sqlite:///{workspace / 'mlflow.db'}", summary["parent_run_id"])
    return {
        "machine": machine_kind(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "config": config,
        "overrides": ["model.weights=random", *overrides],
        "commit": commit,
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "command_s": round(command_s, 1),
        "flow_wall_s": round(summary["wall_seconds"], 1),
        "random_weights": summary.get("random_weights"),
        "decisions": {role: d["promoted"] for role, d in summary["promotions"].items()},
        "stages": stage_rows(summary, devices),
    }


def merged(earlier: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The result file with ``run`` in place of its machine's earlier run; the others kept."""
    runs = {**earlier.get("runs", {}), run["machine"]: run}
    return {"name": "flow_stages", "machines": len(runs), "runs": runs}


def _cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "–"
    mfu = f", MFU {row['mfu']:.1%}" if row.get("mfu") is not None else ""
    return f"{row['wall_s']:.1f} s{mfu}"


def markdown(result: dict[str, Any]) -> str:
    runs = list(result["runs"].values())
    named = dict.fromkeys(name for run in runs for name in run["stages"])
    stages = sorted(named, key=lambda n: FLOW_ORDER.index(n) if n in FLOW_ORDER else len(FLOW_ORDER))
    first = runs[0]
    lines = [
        "# The retraining flow, stage by stage, per kind of machine",
        "",
        "`python -m bench flow_stages`: the config's whole flow with `model.weights: random` (the same work "
        "on every machine; a GPU machine cannot receive the weights). Wall seconds per stage as the flow "
        "timed them, MFU of the training stages against the peak measured in the same run.",
        "",
        "| machine | config | commit | date | flow wall s | device each stage recorded |",
        "|---|---|---|---|---|---|",
    ]
    for run in runs:
        devices = sorted({str(row.get("device")) for row in run["stages"].values() if row.get("device")})
        settings = " ".join([run["config"], *run["overrides"][1:]])
        lines.append(
            f"| {run['machine']} ({run['cpus']} CPUs, torch {run['torch']}) | {settings} | {run['commit']} | "
            f"{run['date']} | {run['flow_wall_s']:.0f} | {', '.join(devices)} |"
        )
    names = [run["machine"] for run in runs]
    lines += ["", "| stage | " + " | ".join(names) + " |", "|---|" + "---|" * len(runs)]
    for stage in stages:
        lines.append(f"| {stage} | " + " | ".join(_cell(run["stages"].get(stage)) for run in runs) + " |")
    if len(runs) > 1:
        lines += ["", f"Speed-up against {names[0]} (its wall s / the machine's):", ""]
        for name, run in zip(names[1:], runs[1:], strict=True):
            ratios = [
                f"{stage} {first['stages'][stage]['wall_s'] / run['stages'][stage]['wall_s']:.1f}x"
                for stage in stages
                if stage in first["stages"] and stage in run["stages"] and run["stages"][stage]["wall_s"] > 0
            ]
            lines.append(f"- {name}: {', '.join(ratios)}; whole flow "
                         f"{first['flow_wall_s'] / run['flow_wall_s']:.1f}x")  # fmt: skip
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any]) -> None:
    RESULTS.mkdir(exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    RESULT.with_suffix(".md").write_text(markdown(result), encoding="utf-8")


def earlier_result() -> dict[str, Any]:
    return json.loads(RESULT.read_text()) if RESULT.exists() else {}


def run() -> dict[str, Any]:
    entry = measure()
    out = os.environ.get("OUT")
    if out:
        Path(out, "flow_stages.json").write_text(json.dumps(entry, indent=2) + "\n", encoding="utf-8")
    result = merged(earlier_result(), entry)
    RESULT.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    return result  # python -m bench writes it to RESULT


if __name__ == "__main__":
    if sys.argv[1:2] == ["--merge"]:
        result = merged(earlier_result(), json.loads(Path(sys.argv[2]).read_text()))
    else:
        result = run()
    write(result)
    print(RESULT.with_suffix(".md").read_text())
