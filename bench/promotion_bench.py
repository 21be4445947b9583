"""Red-teaming the promotion gates: bad challengers against a good champion.

A good champion comes from the embedded default (the demo). Then each challenger is judged
on the pinned set against it, registered, and promoted or rejected by the real gates in a
real MLflow registry:

- label-flipped data: the whole flow on the demo rows with chosen and rejected swapped, the
  poisoned-data check switched off so that the gates alone must catch it. The same run
  trains a **reward model on the flipped labels**, judged too;
- a randomly initialised policy, a copy of the SFT reference, a length-hacked policy (right
  answers padded with filler) and a degenerate policy (one token repeated), built here and
  judged through the same evaluation and gates;
- good challengers: the whole flow, with the demo's own settings, on fresh correct data
  (other draws of the demo rows, ``FRESH_DRAWS``; same split, so no pinned prompt in
  training). Each must be promoted: the gates stop regressions, not ties. The second draw
  meets the first as its champion, as scheduled retraining would.

``run_suite`` returns one row per challenger; ``tests/flows/test_adversarial_promotion.py``
asserts on it and ``python -m bench promotion`` writes ``bench/results/promotion.md``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# seeds of the demo rows for the good challengers (the champion's rows are seed 0); 3 was the
# draw furthest below the champion before the demo's DPO kept the chosen answers' likelihood
FRESH_DRAWS = (1, 3)


def fresh_label(seed: int) -> str:
    return f"good challenger: fresh correct data (draw {seed})"


FILLER = " I hope this helps, and let me know if you would like to add any other numbers together!"


@dataclass
class Challenger:
    """One challenger's outcome, read back from the registry."""

    label: str
    role: str
    expected: str  # promoted or rejected
    version: str
    decision: str  # from the version's promotion.decision tag
    failed_gates: list[str]
    gates: list[str]  # every gate: value, 95% interval, n, the bound that decides
    accuracy: float | None = None  # pinned set: task accuracy (policy) or pair accuracy (reward)
    # per decided gate: how far its deciding bound cleared the threshold (negative: it failed)
    margins: dict[str, float] = field(default_factory=dict)

    @property
    def as_expected(self) -> bool:
        return self.decision == self.expected


def tracking_uri(workspace: Path) -> str:
    """The red team's MLflow store: a sqlite file in its workspace."""
    return f"sqlite:///{workspace / 'mlflow.db'}"


def _base(workspace: Path) -> list[str]:
    return ["project=redteam", f"tracking.uri={tracking_uri(workspace)}"]


def _stage_dirs(summary: dict[str, Any]) -> dict[str, str]:
    return {
        s["name"]: s["output"].get("model_dir") for s in summary["stages"] if s["output"].get("model_dir")
    }


def _outcome(uri: str, label: str, role: str, expected: str, name: str, version: str) -> Challenger:
    from mlflow import MlflowClient

    from alignflow.promotion.gates import GateResult
    from alignflow.registry.promotion import DECISION_TAG, FAILED_GATES_TAG, GATES_TAG, recorded_metrics

    tags = MlflowClient(uri).get_model_version(name, version).tags
    gates = json.loads(tags.get(GATES_TAG, "[]"))
    metrics = recorded_metrics(uri, name, version)
    return Challenger(
        label=label,
        role=role,
        expected=expected,
        version=str(version),
        decision=tags.get(DECISION_TAG, "none"),
        failed_gates=sorted(json.loads(tags.get(FAILED_GATES_TAG, "{}"))),
        gates=[f"{g['outcome']}: {GateResult(**g).describe()}" for g in gates],
        accuracy=metrics.get("golden/task_accuracy" if role == "policy" else "golden/reward_accuracy"),
        margins=gate_margins([GateResult(**g) for g in gates]),
    )


def gate_margins(gates: list[Any]) -> dict[str, float]:
    """How far each decided gate's bound lies on the passing side of its threshold."""
    margins = {}
    for gate in gates:
        if gate.decisive is None or gate.outcome not in ("passed", "failed"):
            continue
        above = gate.decisive - gate.threshold
        margins[gate.name] = round(above if gate.op in (">=", ">") else -above, 4)
    return margins


def _retrain(workspace: Path, *overrides: str, force: bool = False) -> dict[str, Any]:
    from alignflow.flows.retrain import retrain

    return retrain(None, [*_base(workspace), *overrides], repo_dir=str(workspace), force=force)


def swapped_copy(source: Path, target: Path) -> Path:
    """The same rows with chosen and rejected swapped: a poisoned data version."""
    with source.open(encoding="utf-8") as src, target.open("w", encoding="utf-8") as out:
        for line in src:
            row = json.loads(line)
            if "chosen" in row and "rejected" in row:
                row["chosen"], row["rejected"] = row["rejected"], row["chosen"]
            out.write(json.dumps(row) + "\n")
    return target


def random_policy(like: str, out: Path, seed: int = 1234) -> Path:
    """Fresh random weights in the reference's architecture, with its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(like))
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(like).save_pretrained(out)
    return out


def taught_policy(config: Any, start: str, data_dir: Path, say, out: Path) -> Path:
    """``start`` fine-tuned to answer every training prompt with ``say(answer)``."""
    from alignflow.data.snapshot import load_split, write_split
    from alignflow.training.sft import run_sft

    rows = [
        r
        for r in load_split(data_dir, "train", kind="pair")
        if (r.get("metadata") or {}).get("answer") is not None
    ]
    taught = [{**r, "chosen": say(r["metadata"]["answer"])} for r in rows]
    snapshot = out / "snapshot"
    write_split(snapshot, "train", taught)
    write_split(snapshot, "eval", [])
    sft = config.model_copy(
        update={"sft": config.sft.model_copy(update={"max_steps": 120, "save_steps": 1000})}
    )
    result = run_sft(sft, snapshot, out / "run", model_path=start)
    return Path(result.model_dir)


def judge_built_policy(
    config: Any, workspace: Path, label: str, model_dir: str, champion: dict[str, Any]
) -> Challenger:
    """Register a hand-built policy and let the pipeline's evaluation and gates decide on it."""
    from alignflow.evaluation.evaluate import evaluate_paths
    from alignflow.flows.retrain import golden_tags
    from alignflow.promotion.gates import trusted_judges
    from alignflow.registry.lineage import champion_copy
    from alignflow.registry.models import log_model, registered_name
    from alignflow.registry.promotion import promote
    from alignflow.registry.runs import pipeline_run

    uri = config.tracking.resolved_uri()
    name = registered_name(config.project, "policy")
    dirs = _stage_dirs(champion)
    out_root = workspace / "redteam"
    champ_dir, _ = champion_copy(uri, config.project, out_root)
    judge_dir, _ = champion_copy(uri, config.project, out_root, "reward")
    report = evaluate_paths(
        workspace / config.data.data_dir,
        model_dir,
        dirs["sft"],
        None,  # a hand-built policy has no reward model of its own: only outside judges count
        champ_dir,
        config.evaluation,
        golden_path=champion["golden"]["path"],
        champion_reward_dir=judge_dir,
    )
    metrics = report.gate_metrics()
    with pipeline_run(uri, config.project, run_name=f"redteam: {label}"):
        logged = log_model(model_dir, uri, registered_model_name=name, name="policy")
    judges = trusted_judges(metrics, own_reward_trusted=False)
    promote(
        uri,
        name,
        logged.version,
        metrics,
        config.promotion,
        "policy",
        judges,
        golden_tags(champion["golden"]),
    )
    return _outcome(uri, label, "policy", "rejected", name, logged.version)


def run_suite(workspace: Path) -> list[Challenger]:
    """Champion first, then every challenger; rows in the order they were judged."""
    from alignflow.config import load_config
    from alignflow.data.demo import write_configured_demo

    config = load_config(None, _base(workspace))
    uri = config.tracking.resolved_uri()
    champion = _retrain(workspace)
    rows = [
        _outcome(uri, "champion: the demo", role, "promoted", d["name"], d["version"])
        for role, d in sorted(champion["promotions"].items())
    ]
    dirs = _stage_dirs(champion)
    data_dir = workspace / config.data.data_dir
    built = workspace / "built"
    rows.append(
        judge_built_policy(
            config,
            workspace,
            "randomly initialised policy",
            str(random_policy(dirs["sft"], built / "random")),
            champion,
        )
    )
    rows.append(judge_built_policy(config, workspace, "copy of the SFT reference", dirs["sft"], champion))
    padded = taught_policy(
        config, dirs["policy"], data_dir, lambda a: f"The answer is {a}.{FILLER}", built / "padded"
    )
    rows.append(
        judge_built_policy(
            config, workspace, "length-hacked policy (answers padded with filler)", str(padded), champion
        )
    )
    repeats = taught_policy(
        config, dirs["policy"], data_dir, lambda a: " ".join(["the"] * 12), built / "degenerate"
    )
    rows.append(
        judge_built_policy(config, workspace, "degenerate policy (repeats one token)", str(repeats), champion)
    )

    source = Path(workspace / ".alignflow" / "demo-input" / "demo.jsonl")
    swapped = swapped_copy(source, workspace / "swapped.jsonl")
    flipped = _retrain(workspace, f"data.source={swapped}", "data.label_check_max_gap=null")
    labels = {
        "policy": "policy trained on label-flipped data",
        "reward": "reward model trained on flipped labels",
    }
    for role in ("policy", "reward"):
        d = flipped["promotions"][role]
        rows.append(_outcome(uri, labels[role], role, "rejected", d["name"], d["version"]))

    for seed in FRESH_DRAWS:
        fresh = write_configured_demo(config.data, workspace / f"fresh-{seed}", seed=seed)
        d = _retrain(workspace, f"data.source={fresh}")["promotions"]["policy"]
        rows.append(_outcome(uri, fresh_label(seed), "policy", "promoted", d["name"], d["version"]))
    return rows


def to_markdown(rows: list[Challenger]) -> str:
    lines = [
        "# Promotion under attack",
        "",
        "Generated by `python -m bench promotion` (`bench/promotion_bench.py`); the same suite runs in",
        "`make test` (`tests/flows/test_adversarial_promotion.py`). Champion: the embedded default (the",
        "demo). Every gate decides on the bound of its 95% interval on the pinned set (n = judged rows).",
        "Pinned accuracy: task accuracy for a policy, pair-ranking accuracy for a reward model.",
        "",
        "| challenger | role | version | decision | as expected | pinned accuracy | failed gates |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        accuracy = "" if r.accuracy is None else f"{r.accuracy:.3f}"
        lines.append(
            f"| {r.label} | {r.role} | v{r.version} | {r.decision} | {'yes' if r.as_expected else '**no**'} "
            f"| {accuracy} | {', '.join(r.failed_gates) or '—'} |"
        )
    lines += ["", "## Every gate, with its interval", ""]
    for r in rows:
        lines += [f"### {r.label} ({r.role} v{r.version}: {r.decision})", ""]
        lines += [f"- {g}" for g in r.gates] + [""]
    return "\n".join(lines)


def run() -> dict:
    from alignflow.flows.environment import apply_defaults, local_flow_settings

    workspace = Path(tempfile.mkdtemp(prefix="alignflow-redteam-"))
    apply_defaults(workspace)  # the CLI's Prefect settings, as the fresh-draws bench
    try:
        with local_flow_settings():
            rows = run_suite(workspace)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    (REPO / "bench" / "results" / "promotion.md").write_text(to_markdown(rows), encoding="utf-8")
    bad = [r for r in rows if r.expected == "rejected"]
    return {
        "bad_challengers": len(bad),
        "bad_rejected": sum(r.decision == "rejected" for r in bad),
        "good_promoted": sum(r.decision == "promoted" for r in rows if r.expected == "promoted"),
        "rows": [asdict(r) for r in rows],
    }
