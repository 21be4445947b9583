"""The retraining flow: validate → version → sft → reward → policy → evaluate → register → promote.

Every stage is cached on (data version, the config sections it reads, code version,
upstream models), so a run with unchanged inputs retrains nothing; a run whose data
version and config are those the current champion was trained on ends early. One parent
MLflow run holds a nested run per stage; stages named in ``orchestration.work_pools`` run
as deployments on that pool (``run_deployment``), the rest in-process. The parent run is
what the MLflow UI compares (:mod:`alignflow.flows.parent_run`): config as params, data version as
its dataset, headline results as metrics, a child run for each cache hit.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import mlflow
from prefect import flow
from prefect import tags as prefect_tags
from prefect.context import FlowRunContext, TagsContext
from prefect.deployments import run_deployment

from alignflow import progress
from alignflow.config import PipelineConfig, load_config
from alignflow.errors import DataCheckStop
from alignflow.evaluation.metric_names import RANDOM_WEIGHTS
from alignflow.evaluation.rl_stage import rl_gain_line
from alignflow.flows.artifacts import publish_run_artifacts
from alignflow.flows.killed_runs import mark_killed_runs_crashed, owner_label
from alignflow.flows.parent_run import parent_run, record_data_version, record_results, show_cache_hit
from alignflow.flows.run_log import (
    config_tags,
    data_tag,
    label_flow_run,
    log_decisions,
    logs_to_the_run,
    outcome_tags,
    retrain_run_name,
    stage_line,
)
from alignflow.flows.stages import STAGE_FLOWS
from alignflow.flows.summary import RunSummary, StageOutcome
from alignflow.flows.sync_calls import resolved
from alignflow.flows.unchanged import OUTCOME_TAG, mark_nothing_to_do, show_champion_stages
from alignflow.models.random_weights import random_weights_note
from alignflow.plan import PlannedStep, RunPlan
from alignflow.registry.lineage import (
    champion_copy,
    champion_version,
    link_reused_version,
    run_finished,
    trained_on,
)
from alignflow.registry.pipeline_record import run_name
from alignflow.registry.promotion import champion_judge
from alignflow.registry.runs import ACCEPTED_UNJUDGED_TAG, DATA_VERSION_TAG, GOLDEN_VERSION_TAG
from alignflow.tasks.data import pin_golden, version_data
from alignflow.tasks.registry import promote_models, register_models
from alignflow.tasks.stage_inputs import EvaluateInputs, StageInputs

logger = logging.getLogger(__name__)

GOLDEN_SOURCE_TAG = "golden.source"
STOP_REASON_TAG = "pipeline.reason"


def call_stage(config: PipelineConfig, stage: str, inputs: StageInputs) -> dict[str, Any]:
    """In-process subflow, or a deployment on the work pool the config names for this stage."""
    stage_flow = STAGE_FLOWS[stage]
    pool = config.orchestration.work_pools.get(stage)
    if pool is None:
        return stage_flow(inputs)
    flow_run = resolved(
        run_deployment(
            name=f"{stage_flow.name}/{config.orchestration.deployment_name}",
            parameters={"inputs": inputs.model_dump(mode="json")},
            timeout=config.orchestration.stage_timeout_s,
            tags=sorted(TagsContext.get().current_tags),
        )
    )
    if not flow_run.state or not flow_run.state.is_completed():
        state = flow_run.state.name if flow_run.state else "unknown"
        raise RuntimeError(f"stage {stage!r} on work pool {pool!r} ended {state} (flow run {flow_run.id})")
    return flow_run.state.result()


class Stages:
    """Runs the plan's steps in order, timing each and recording it in the summary."""

    def __init__(self, plan: RunPlan, summary: RunSummary, parent_run_id: str):
        self.plan, self.summary, self.parent = plan, summary, parent_run_id
        self.data: dict[str, Any] = {}  # the data stage's result, once it has run

    def inputs(
        self, stage: str, upstream: str, model: type[StageInputs] = StageInputs, **fields: Any
    ) -> StageInputs:
        """A stage's inputs; its output folder is named by the same things as its cache key."""
        return model(
            **{
                "config_json": self.plan.config_json,
                "data_dir": self.data["data_dir"],
                "output_dir": str(self.plan.output_dir(stage, self.data["version"], upstream)),
                "data_version": self.data["version"],
                "config_hash": self.plan.section_hash(stage),
                "upstream": upstream,
                "parent_run_id": self.parent,
                **fields,
            }
        )

    def run(
        self, stage: str, inputs: StageInputs | None = None, call: Callable[[], dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """Run one stage (from its inputs, or by ``call``) and record it; a cache hit also shows
        as a child run of the parent."""
        if call is None:
            if inputs is None:
                raise ValueError(f"stage {stage!r}: give its inputs or a call that runs it")
            call = partial(call_stage, self.plan.config, stage, inputs)
        started = time.perf_counter()
        logger.info("%s: started", stage)
        with progress.stage(stage) as shown:  # what the CLI's live view follows
            result = call()
            cached = shown.cached = bool(result.get("cached"))
        outcome = self.summary.add(
            StageOutcome(
                name=stage,
                seconds=time.perf_counter() - started,
                compute_seconds=0.0 if cached else float(result.get("compute_seconds", 0.0)),
                cached=cached,
                metrics={
                    k: v for k, v in (result.get("metrics") or {}).items() if isinstance(v, (int, float))
                },
                output={k: result[k] for k in ("model_dir", "report", "output_dir") if k in result},
                run_id=result.get("run_id"),
                cost={} if cached else dict(result.get("cost") or {}),
            )
        )
        logger.info("%s", stage_line(stage, cached, outcome.seconds, outcome.metrics))
        show_cache_hit(self.summary, outcome)
        return result


def _train_and_promote(stages: Stages, summary: RunSummary) -> None:
    plan = stages.plan
    uri, project = plan.config.tracking.resolved_uri(), plan.config.project

    def run_step(step: PlannedStep) -> dict[str, Any]:
        inputs = stages.inputs(step.role, step.upstream, config_json=step.config_json, model_path=step.start)
        return stages.run(step.role, inputs)

    trained_chain = plan.run_chain(run_step)
    reward, policy = trained_chain["reward"], trained_chain["policy"]
    champ_dir, champ_version = champion_copy(uri, project, plan.out_root, "policy", stages.parent)
    judge_dir, judge_version = champion_copy(uri, project, plan.out_root, "reward", stages.parent)
    golden = summary.golden or {}
    golden_version = golden.get("version", "")
    upstream = plan.evaluation_upstream(trained_chain, champ_version, judge_version, golden_version)
    eval_inputs = stages.inputs(
        "evaluate",
        upstream,
        EvaluateInputs,
        policy_dir=policy["model_dir"],
        reference_dir=plan.evaluation_reference(trained_chain),
        rl_start_dir=plan.rl_start(trained_chain),
        reward_dir=reward["model_dir"],
        champion_dir=champ_dir,
        champion_reward_dir=judge_dir,
        golden_path=golden.get("path"),
    )
    evaluation = stages.run("evaluate", eval_inputs)
    summary.rl_stage = rl_gain_line(evaluation["metrics"])
    random_start = random_weights_note(plan.start_model(trained_chain.get("sft") or policy))
    summary.random_weights = random_weights_said(random_start)
    metrics = {**evaluation["metrics"], **({RANDOM_WEIGHTS: 1.0} if random_start else {})}

    trained = {"reward": reward, "policy": policy}
    model_dirs = {role: result["model_dir"] for role, result in trained.items()}
    trained_by = {role: result.get("run_id") or "" for role, result in trained.items()}
    data_version = stages.data["version"]
    registered = stages.run(
        "register",
        call=lambda: _task_with_cache_flag(
            register_models,
            config_json=plan.config_json,
            model_dirs=model_dirs,
            data_version=data_version,
            config_hash=plan.config_hash,
            upstream=f"{upstream}|trained_by={json.dumps(trained_by, sort_keys=True)}",
            parent_run_id=stages.parent,
            trained_by=trained_by,
            cache_hits=sorted(role for role, result in trained.items() if result.get("cached")),
            data_tags=accepted_tags(stages.data),
        ),
    )
    versions = registered["versions"]
    link_reused_versions(uri, stages.parent, versions)
    promoted = stages.run(
        "promote",
        call=lambda: _task_with_cache_flag(
            promote_models,
            config_json=plan.config_json,
            versions=versions,
            metrics=metrics,
            data_version=data_version,
            config_hash=plan.section_hash("promote"),
            upstream=json.dumps(versions, sort_keys=True),
            parent_run_id=stages.parent,
            tags=golden_tags(golden),
            slices=evaluation.get("slices"),
            discredited_judges=stages.data.get("discredited_judges") or [],
        ),
    )
    summary.promotions = promoted["decisions"]


def random_weights_said(note: dict[str, Any] | None) -> str | None:
    """What the chain started from where it was built with random weights (``note``: its folder's
    marker, not the config), in words; None for trained weights."""
    if note is None:
        return None
    return (
        f"the run started from {note['architecture_of']}'s architecture with random weights (seed "
        f"{note['seed']}, model.weights: random): speed and plumbing are the real model's, its figures are "
        "not, and nothing it trained is promoted"
    )


def link_reused_versions(uri: str, parent_run_id: str, versions: dict[str, dict[str, Any]]) -> None:
    """Point this run at the run that produced each version it reused (set here, not in the
    register task, so a cached register step still links the new run)."""
    for role, info in versions.items():
        if info.get("reused"):
            link_reused_version(uri, parent_run_id, role, info["version"], info["produced_by_run"])


def accepted_tags(data: Mapping[str, Any]) -> dict[str, str]:
    """The reason a data version's unjudged pairs were accepted, for every model trained on it."""
    reason = data.get("accepted_unjudged")
    return {ACCEPTED_UNJUDGED_TAG: str(reason)[:5000]} if reason else {}


def golden_tags(golden: dict[str, Any]) -> dict[str, str]:
    """The pinned set an evaluated version was judged on, as registry tags."""
    if not golden:
        return {}
    return {GOLDEN_VERSION_TAG: golden["version"], GOLDEN_SOURCE_TAG: golden["source"][:500]}


def label_judge(plan: RunPlan, pipeline_run: str | None = None) -> dict[str, Any] | None:
    """The champion that checks new data's labels, with its pinned-set accuracy (None: no check):
    the champion as ``pipeline_run`` first found it, not one a killed attempt of it crowned."""
    role = plan.label_judge_role
    if role is None:
        return None
    uri = plan.config.tracking.resolved_uri()
    return champion_judge(uri, plan.config.project, plan.out_root, role, pipeline_run)


def stop_run(summary: RunSummary, error: DataCheckStop) -> None:
    """Record a run stopped by a data check: reason and report on the parent run, nothing registered."""
    summary.stopped = {"reason": error.reason, "message": str(error), "report": error.report_path}
    mlflow.set_tags({OUTCOME_TAG: "stopped", STOP_REASON_TAG: error.reason})
    if error.report_path:
        mlflow.log_artifact(error.report_path, "data")


def _task_with_cache_flag(task_fn, **params) -> dict[str, Any]:
    state = task_fn(**params, return_state=True)
    return {**state.result(), "cached": state.name == "Cached"}


def _run_pipeline(stages: Stages, summary: RunSummary, repo_dir: str, force: bool) -> None:
    """Data, then training and promotion; or nothing to do; or a stop by the poisoned-data check."""
    plan = stages.plan
    source, judge = plan.data_source(repo_dir), label_judge(plan, stages.parent)
    try:
        data = stages.run(
            "data", call=lambda: version_data(plan.config_json, source, repo_dir, stages.parent, judge)
        )
    except DataCheckStop as error:  # poisoned labels, pinned prompts in training
        stop_run(summary, error)
        return
    stages.data = data
    summary.golden = pin_golden(plan.config_json, data["data_dir"], repo_dir)
    mlflow.set_tags({GOLDEN_VERSION_TAG: summary.golden["version"]})
    summary.data_version = data["version"]
    mlflow.set_tags({DATA_VERSION_TAG: data["version"], **accepted_tags(data)})
    record_data_version(plan.config, stages.parent, data["version"], data["data_dir"])
    name = run_name(plan.config.project, plan.config.policy.algorithm, data["version"])
    label_flow_run(name, [data_tag(data["version"])])  # as the MLflow parent run is named
    mlflow.log_artifact(data["report_path"], "data")
    mlflow.log_artifact(data["manifest_path"], "data")
    uri = plan.config.tracking.resolved_uri()
    champion = None if force else champion_version(uri, plan.config.project)
    # a killed run's rerun finds its own champion, but the run that moved it has work left
    unchanged = champion is not None and trained_on(champion, data["version"], plan.config_hash)
    if unchanged and champion is not None and run_finished(uri, champion):
        mark_nothing_to_do(summary, uri, champion)
        show_champion_stages(summary)
        mlflow.set_tag(OUTCOME_TAG, "nothing_to_do")
    else:
        _train_and_promote(stages, summary)
        mlflow.set_tag(OUTCOME_TAG, summary.outcome)


@flow(name="retrain", log_prints=False, flow_run_name=retrain_run_name)
def retrain(
    config_path: str | None = None,
    overrides: list[str] | None = None,
    repo_dir: str = ".",
    force: bool = False,
    requested_at: float | None = None,
) -> dict:
    """The main job. Returns a JSON-able summary (stages, times, cache hits, metrics, promotions).

    ``force`` trains even when the champion already comes from this data and config (the
    stages themselves still answer from their caches when their inputs are unchanged).
    ``requested_at`` (``time.time()`` when the caller, e.g. the CLI, started) lets the run
    report what it cost before its first line: Prefect's API and the flow run starting.
    """
    started = time.perf_counter()
    startup = max(0.0, time.time() - requested_at) if requested_at is not None else 0.0
    plan = RunPlan(load_config(config_path, overrides or []), repo_dir)
    project, algorithm = plan.config.project, plan.config.policy.algorithm
    summary = RunSummary(
        project=project, config_hash=plan.config_hash, tracking_uri=plan.config.tracking.resolved_uri()
    )
    labels = [*config_tags(project, algorithm), owner_label()]  # the owner tag reaches its subflows and tasks
    label_flow_run(tags=labels)
    with logs_to_the_run(), prefect_tags(*labels), parent_run(plan.config, repo_dir) as parent:
        summary.parent_run_id, summary.flow_run_id = parent.info.run_id, _flow_run_id()
        mark_killed_runs_crashed()  # a killed run's Prefect runs, as its MLflow runs are continued
        _run_pipeline(Stages(plan, summary, parent.info.run_id), summary, repo_dir, force)
        record_results(summary)
        summary.wall_seconds = time.perf_counter() - started
        summary.startup_seconds = startup
        mlflow.log_metrics(
            {
                "pipeline/wall_seconds": summary.wall_seconds,
                "pipeline/startup_seconds": summary.startup_seconds,
                "pipeline/orchestration_overhead": summary.orchestration_overhead,
                **summary.cost,
            }
        )
        mlflow.log_dict(summary.to_dict(), "summary.json")
        publish_run_artifacts(summary)  # Prefect UI summary + gate table on the evaluate run
        log_decisions(summary)
        label_flow_run(tags=outcome_tags(summary))
    return summary.to_dict()


def _flow_run_id() -> str | None:
    context = FlowRunContext.get()
    return str(context.flow_run.id) if context and context.flow_run else None
