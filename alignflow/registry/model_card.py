"""A Hugging Face style model card (``README.md``) in each registered version's model artifacts.

Whoever downloads or serves a version from the registry gets its card beside the weights:
base model and licence, data version, the training stages and their settings, the
evaluation's figures with their intervals, and the promotion decision. Every figure is read
back from MLflow (the evaluation stage run's metrics, the stage runs' params, the version's
tags), never from the request or the config that asked for the run: the card says what the
store recorded, and a version with no recorded evaluation says so.

The card is written once the decision is known (:func:`write_model_card` from
:mod:`alignflow.registry.promotion`) and rewritten when a later decision (by hand, a rollback)
changes it. Writing it at registration would have meant a card without the one fact a
reader opens it for, or a card claiming a decision not yet made.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Run

from alignflow.registry.decision_tags import GATE_TAG_PREFIX, OUTCOME_REASON_TAG, OUTCOME_TAG, SYSTEM_METRICS

CARD_FILE = "README.md"
TRAINING_STAGES_SKIPPED = ("data", "evaluate", "register", "promote")
SETTING_KEYS = (
    "max_steps",
    "learning_rate",
    "per_device_train_batch_size",
    "beta",
    "loss_type",
    "mode",
    "pooling",
    "num_generations",
)
MODEL_SETTINGS = ("model.name", "model.dtype", "model.lora.enabled")
# upstream ids and licences of the models alignflow names; tiny is built here, from nothing
KNOWN_BASES = {
    "smollm2-135m-instruct": ("HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0"),
    "minilm": ("sentence-transformers/all-MiniLM-L6-v2", "apache-2.0"),
}
TINY = "tiny"


@dataclass(frozen=True)
class Evidence:
    """What the store holds about one version: its tags, the evaluation run's metrics, the
    training stage runs (name -> run), and the runs' ids."""

    name: str
    version: str
    tags: Mapping[str, str]
    metrics: Mapping[str, float] = field(default_factory=dict)
    evaluation_run: str | None = None
    stages: Mapping[str, Run] = field(default_factory=dict)
    pipeline_run: str | None = None


def stage_runs(tracking_uri: str, pipeline_run: str | None) -> dict[str, Run]:
    """The pipeline run's stage runs, by stage name."""
    from alignflow.registry.runs import STAGE_TAG, child_runs

    if pipeline_run is None:
        return {}
    runs = child_runs(tracking_uri, pipeline_run)
    return {run.data.tags[STAGE_TAG]: run for run in runs if STAGE_TAG in run.data.tags}


def gather(tracking_uri: str, name: str, version: str) -> Evidence:
    """A version's tags, and the evaluation and training runs of the pipeline run that made it."""
    from alignflow.registry.lineage import producing_pipeline_run

    client = MlflowClient(tracking_uri)
    registered = client.get_model_version(name, version)
    pipeline = producing_pipeline_run(tracking_uri, registered)
    stages = stage_runs(tracking_uri, pipeline)
    evaluation = stages.pop("evaluate", None)
    metrics = {} if evaluation is None else evaluation.data.metrics
    return Evidence(
        name=name,
        version=str(version),
        tags=dict(registered.tags),
        metrics={k: v for k, v in metrics.items() if not k.startswith(SYSTEM_METRICS)},
        evaluation_run=None if evaluation is None else evaluation.info.run_id,
        stages={k: v for k, v in stages.items() if k not in TRAINING_STAGES_SKIPPED},
        pipeline_run=pipeline,
    )


def _role(evidence: Evidence) -> str:
    from alignflow.registry.models import MODEL_KIND_TAG

    return "reward" if evidence.tags.get(MODEL_KIND_TAG) == "text-classification" else "policy"


def _own_stages(evidence: Evidence) -> dict[str, Run]:
    """The training stages that made this role's weights: the reward stage for a reward model,
    the others for a policy."""
    reward = _role(evidence) == "reward"
    return {k: v for k, v in evidence.stages.items() if (k == "reward") == reward}


def base_model(evidence: Evidence) -> str | None:
    """The model the weights started from, as the stage runs recorded it (``model.name``; an
    adapter's ``base_model`` tag first)."""
    from alignflow.registry.models import BASE_MODEL_TAG

    if evidence.tags.get(BASE_MODEL_TAG):
        return evidence.tags[BASE_MODEL_TAG]
    for run in _own_stages(evidence).values():
        backbone = run.data.params.get("reward.backbone")
        if backbone and backbone != "policy":
            return backbone
        if run.data.params.get("model.name"):
            return run.data.params["model.name"]
    return None


def licence(base: str | None) -> tuple[str, str]:
    """The front matter's ``license`` and a sentence on where it comes from."""
    if base == TINY:
        return "other", "none upstream: the `tiny` preset is built offline, from scratch, on the run's data"
    if base in KNOWN_BASES:
        upstream, spdx = KNOWN_BASES[base]
        return spdx, f"{spdx}, the licence of the base model {upstream}"
    if base is None:
        return "other", "unknown: no base model is recorded for this version"
    return "other", f"unknown to alignflow: see the licence of {base}"


def _fmt(value: float | None) -> str:
    return "" if value is None else format(value, ".4g")


def is_reward_figure(key: str) -> bool:
    """A figure of the reward model itself (``eval/reward_accuracy``), not of a policy judged by
    it (``eval/reward/win_rate_vs_reference``)."""
    scope = key.split("/")
    return len(scope) > 1 and scope[1].startswith("reward_")


def role_figures(evidence: Evidence) -> dict[str, float]:
    """The evaluation's figures about this version's role (and the run's cost)."""
    reward = _role(evidence) == "reward"
    return {
        k: v for k, v in evidence.metrics.items() if is_reward_figure(k) == reward or k.startswith("cost/")
    }


def figure_rows(metrics: Mapping[str, float]) -> list[str]:
    """Each figure with an interval (``K``, ``K/low``, ``K/high``, ``K/n``) as a markdown row."""
    rows = []
    for key in sorted(metrics):
        low, high = metrics.get(f"{key}/low"), metrics.get(f"{key}/high")
        if low is None or high is None:
            continue
        n = metrics.get(f"{key}/n")
        interval = f"[{_fmt(low)}, {_fmt(high)}]"
        rows.append(f"| `{key}` | {_fmt(metrics[key])} | {interval} | {'' if n is None else int(n)} |")
    return rows


def point_figures(metrics: Mapping[str, float]) -> list[str]:
    """The evaluation's figures that carry no interval (held-out split means, counts)."""
    parts = ("/low", "/high", "/n")
    with_interval = {k.rsplit("/", 1)[0] for k in metrics if k.endswith(parts)}
    keys = [k for k in sorted(metrics) if not k.endswith(parts) and k not in with_interval]
    return [f"`{k}` {_fmt(metrics[k])}" for k in keys]


def evaluation_section(evidence: Evidence) -> list[str]:
    figures = role_figures(evidence)
    if not figures:
        return ["## Evaluation", "", "No evaluation is recorded for this version: no figures to report.", ""]
    rows = figure_rows(figures)
    points = point_figures(figures)
    return [
        "## Evaluation",
        "",
        f"Read from the evaluation run `{evidence.evaluation_run}` (95% intervals; n judged items).",
        "",
        *(["| figure | value | 95% interval | n |", "|---|---|---|---|", *rows, ""] if rows else []),
        *([f"Without an interval: {', '.join(points)}.", ""] if points else []),
    ]


def training_section(evidence: Evidence) -> list[str]:
    stages = _own_stages(evidence)
    if not stages:
        return ["## Training", "", "No training stage run is recorded for this version.", ""]
    lines = ["## Training", "", "| stage | run | settings |", "|---|---|---|"]
    for stage, run in stages.items():
        params = run.data.params
        keys = [
            k for k in sorted(params) if k.rsplit(".", 1)[-1] in SETTING_KEYS and not k.startswith("model.")
        ]
        settings = ", ".join(f"`{k}={params[k]}`" for k in [*MODEL_SETTINGS, *keys] if k in params)
        lines.append(f"| {stage} | `{run.info.run_id}` | {settings} |")
    return [*lines, ""]


def decision_section(evidence: Evidence) -> list[str]:
    outcome = evidence.tags.get(OUTCOME_TAG)
    if outcome is None:
        return ["## Promotion decision", "", "Not decided yet.", ""]
    gates = sorted(
        (k.removeprefix(GATE_TAG_PREFIX), v)
        for k, v in evidence.tags.items()
        if k.startswith(GATE_TAG_PREFIX)
    )
    return [
        "## Promotion decision",
        "",
        f"**{outcome}**: {evidence.tags.get(OUTCOME_REASON_TAG, '')}",
        "",
        *(f"- `{gate}`: {said}" for gate, said in gates),
        "",
    ]


def front_matter(evidence: Evidence, base: str | None, spdx: str) -> list[str]:
    from alignflow.registry.runs import DATA_VERSION_TAG

    data_version = evidence.tags.get(DATA_VERSION_TAG, "unknown")
    upstream = KNOWN_BASES.get(base or "", (base or "unknown",))[0]
    sections = {k.split(".")[0] for run in _own_stages(evidence).values() for k in run.data.params}
    methods = sorted(sections - {"model", _role(evidence)})
    return [
        "---",
        f"license: {spdx}",
        f"base_model: {upstream}",
        "tags:",
        *(f"  - {tag}" for tag in ("alignflow", "rlhf", _role(evidence), *methods)),
        "datasets:",
        f"  - alignflow-data-{data_version}",
        f"data_version: {data_version}",
        "---",
    ]


def render(evidence: Evidence) -> str:
    """The card's text, from what :func:`gather` read."""
    from alignflow.registry.runs import DATA_VERSION_TAG, GOLDEN_VERSION_TAG

    base = base_model(evidence)
    spdx, licence_said = licence(base)
    lines = [
        *front_matter(evidence, base, spdx),
        "",
        f"# {evidence.name} version {evidence.version}",
        "",
        f"A {_role(evidence)} trained by alignflow. Every figure below is read from the MLflow store.",
        "",
        "## Base model and licence",
        "",
        f"- Base model: `{base or 'unknown'}`" + (" (built offline)" if base == TINY else ""),
        f"- Licence: {licence_said}",
        f"- Data version (DVC md5): `{evidence.tags.get(DATA_VERSION_TAG, 'unknown')}`",
        f"- Pinned evaluation set: `{evidence.tags.get(GOLDEN_VERSION_TAG, 'unknown')}`",
        f"- Pipeline run: `{evidence.pipeline_run or 'none (registered outside a pipeline run)'}`",
        "",
        *training_section(evidence),
        *evaluation_section(evidence),
        *decision_section(evidence),
    ]
    return "\n".join(lines).rstrip() + "\n"


def write_model_card(tracking_uri: str, name: str, version: str) -> str:
    """Write (or rewrite) ``README.md`` into the version's logged model artifacts; returns it.

    A version registered from a plain artifact URI (no logged model) keeps no card there.
    """
    text = render(gather(tracking_uri, name, version))
    from alignflow.registry.models import logged_model_id

    registered = MlflowClient(tracking_uri).get_model_version(name, version)
    model_id = registered.model_id or logged_model_id(
        registered.source or ""
    )  # a SQL store keeps only the source
    if model_id:
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / CARD_FILE
            path.write_text(text, encoding="utf-8")
            MlflowClient(tracking_uri).log_model_artifact(model_id, str(path))
    return text
