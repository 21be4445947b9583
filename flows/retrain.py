"""The retraining flow: validate → version → sft → reward → policy → evaluate → register → promote.

Every stage is cached on (data version, the config sections it reads, code version,
upstream models), so a run with unchanged inputs retrains nothing; a run whose data
version and config are those the current champion was trained on ends early. One parent
MLflow run holds a nested run per stage; stages named in ``orchestration.work_pools`` run
as deployments on that pool (``run_deployment``), the rest in-process. The parent run is
what the MLflow UI compares (:mod:`flows.parent_run`): config as params, data version as
its dataset, headline results as metrics, a child run for each cache hit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import mlflow
from prefect import flow
from prefect import tags as prefect_tags
from prefect.context import FlowRunContext, TagsContext
from prefect.deployments import run_deployment

from alignflow import progress
from alignflow.config import PipelineConfig, config_hash, load_config, with_reward_model
from alignflow.errors import DataCheckStop
from alignflow.evaluation.rl_stage import rl_gain_line
from alignflow.registry import models as registry_models
from alignflow.registry.lineage import champion_copy, link_reused_version, trained_on
from alignflow.registry.pipeline_record import run_name
from alignflow.registry.runs import ACCEPTED_UNJUDGED_TAG, DATA_VERSION_TAG, GOLDEN_VERSION_TAG
from alignflow.training.chain import ChainStep, model_dir, run_chain, steps_for
from alignflow.training.registry import stage_spec
from flows.artifacts import publish_run_artifacts
from flows.parent_run import parent_run, record_data_version, record_results, show_cache_hit
from flows.run_log import (
    config_tags,
    data_tag,
    label_flow_run,
    log_decisions,
    logs_to_the_run,
    outcome_tags,
    retrain_run_name,
    stage_line,
)
from flows.stages import STAGE_FLOWS
from flows.summary import RunSummary, StageOutcome
from flows.sync_calls import resolved
from flows.unchanged import (
    OUTCOME_TAG,
    current_champion,
    data_source,
    mark_nothing_to_do,
    show_champion_stages,
)
from tasks.data import pin_golden, version_data
from tasks.registry import promote_models, register_models
from tasks.stage_inputs import EvaluateInputs, StageInputs

logger = logging.getLogger(__name__)

GOLDEN_SOURCE_TAG = "golden.source"
STOP_REASON_TAG = "pipeline.reason"
# the flow's own steps; the training stages' sections come from the stage registry
FLOW_STEP_SECTIONS = {"evaluate": ("evaluation",), "register": ("project",), "promote": ("promotion",)}


def stage_sections(config: PipelineConfig, stage: str) -> tuple[str, ...]:
    """The config sections one step reads: ``policy`` adds its algorithm's (and only its) sections."""
    if stage in FLOW_STEP_SECTIONS:
        return FLOW_STEP_SECTIONS[stage]
    if stage == "policy":
        return ("policy", *stage_spec(config.policy.algorithm).cache_sections)
    return stage_spec(stage).cache_sections


def section_hash(config: PipelineConfig, stage: str) -> str:
    """Hash of the config sections one stage reads (a change elsewhere does not retrain it)."""
    data = config.model_dump(mode="json")
    picked = {name: data.get(name) for name in stage_sections(config, stage)}
    return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


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


def start_model(stage_result: dict[str, Any], config: PipelineConfig) -> str:
    """The model a stage without SFT started from: the tiny model it built, or the named one."""
    from alignflow.models.factory import BASE_MODEL_DIR, resolve_model_source

    built = Path(stage_result["output_dir"]) / BASE_MODEL_DIR
    return str(built) if (built / "config.json").exists() else resolve_model_source(config.model.name)


def rl_start(config: PipelineConfig, sft: dict[str, Any] | None, policy: dict[str, Any]) -> str:
    """The model the RL stage started from: its SFT model, else the model the chain began with."""
    return sft["model_dir"] if sft is not None else start_model(policy, config)


def evaluation_reference(config: PipelineConfig, sft: dict[str, Any] | None, policy: dict[str, Any]) -> str:
    """What the policy is judged against: where its RL stage started (``evaluation.reference:
    sft``), or the model the chain started from (``base``)."""
    if config.evaluation.reference == "sft":
        return rl_start(config, sft, policy)
    return start_model(sft or policy, config)


class Stages:
    """Runs stages in order, timing each and recording it in the summary."""

    def __init__(
        self,
        config: PipelineConfig,
        summary: RunSummary,
        parent_run_id: str,
        repo_dir: str | Path = ".",
    ):
        self.config, self.summary, self.parent = config, summary, parent_run_id
        self.data: dict[str, Any] = {}  # the data stage's result, once it has run
        self.config_json = config.model_dump(mode="json")
        # a relative output_dir lives in the repo the run works on, like its data snapshot
        self.out_root = (Path(repo_dir) / config.output_dir).resolve() / config.project

    def inputs(
        self, stage: str, upstream: str, model: type[StageInputs] = StageInputs, **fields: Any
    ) -> StageInputs:
        """A stage's inputs; its output folder is named by the same things as its cache key."""
        stage_hash = section_hash(self.config, stage)
        key = fingerprint(stage, self.data["version"], stage_hash, upstream)
        return model(
            **{
                "config_json": self.config_json,
                "data_dir": self.data["data_dir"],
                "output_dir": str(self.out_root / f"{stage}-{key}"),
                "data_version": self.data["version"],
                "config_hash": stage_hash,
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
            call = partial(call_stage, self.config, stage, inputs)
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


def _train_and_promote(stages: Stages, config: PipelineConfig, summary: RunSummary, cfg_hash: str) -> None:
    uri = config.tracking.resolved_uri()
    # which train rows SFT and the reward model read is an input of theirs (their own config
    # sections do not hold `policy.reward_data`): it goes into their cache keys
    rows = "|rows=disjoint-halves" if config.policy.reward_data == "disjoint" else ""

    def execute(step: ChainStep, start: str | None, done: Mapping[str, Any]) -> dict[str, Any]:
        if step.role == "sft":
            return stages.run("sft", stages.inputs("sft", rows))
        if step.role == "reward":
            return stages.run(
                "reward", stages.inputs("reward", f"init={start or ''}{rows}", model_path=start)
            )
        # the policy's key names the reward step's output folder (itself named by that step's key)
        upstream = f"sft={start or ''}|reward={done['reward']['output_dir']}"
        config_json = with_reward_model(stages.config_json, model_dir(done["reward"]))
        return stages.run(
            "policy", stages.inputs("policy", upstream, config_json=config_json, model_path=start)
        )

    trained_chain = run_chain(steps_for(config), execute)
    sft, reward, policy = trained_chain.get("sft"), trained_chain["reward"], trained_chain["policy"]

    reference = evaluation_reference(config, sft, policy)
    champ_dir, champ_version = champion_copy(uri, config.project, stages.out_root)
    judge_dir, judge_version = champion_copy(uri, config.project, stages.out_root, "reward")
    golden = summary.golden or {}
    upstream = (
        f"policy={policy['model_dir']}|reward={reward['model_dir']}|champion={champ_version}"
        f"|champion_reward={judge_version}|golden={golden.get('version', '')}"
    )
    eval_inputs = stages.inputs(
        "evaluate",
        upstream,
        EvaluateInputs,
        policy_dir=policy["model_dir"],
        reference_dir=reference,
        rl_start_dir=rl_start(config, sft, policy),
        reward_dir=reward["model_dir"],
        champion_dir=champ_dir,
        champion_reward_dir=judge_dir,
        golden_path=golden.get("path"),
    )
    evaluation = stages.run("evaluate", eval_inputs)
    summary.rl_stage = rl_gain_line(evaluation["metrics"])

    trained = {"reward": reward, "policy": policy}
    model_dirs = {role: result["model_dir"] for role, result in trained.items()}
    trained_by = {role: result.get("run_id") or "" for role, result in trained.items()}
    data_version = stages.data["version"]
    registered = stages.run(
        "register",
        call=lambda: _task_with_cache_flag(
            register_models,
            config_json=stages.config_json,
            model_dirs=model_dirs,
            data_version=data_version,
            config_hash=cfg_hash,
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
            config_json=stages.config_json,
            versions=versions,
            metrics=evaluation["metrics"],
            data_version=data_version,
            config_hash=section_hash(config, "promote"),
            upstream=json.dumps(versions, sort_keys=True),
            parent_run_id=stages.parent,
            tags=golden_tags(golden),
            slices=evaluation.get("slices"),
            discredited_judges=stages.data.get("discredited_judges") or [],
        ),
    )
    summary.promotions = promoted["decisions"]


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


def label_judge(config: PipelineConfig, out_root: Path) -> dict[str, Any] | None:
    """The champion reward model and its pinned-set accuracy, for the poisoned-data check."""
    from alignflow.evaluation.metric_names import REWARD_ACCURACY, REWARD_ACCURACY_EVAL
    from alignflow.registry.promotion import recorded_metrics

    if config.data.label_check_max_gap is None:
        return None
    uri = config.tracking.resolved_uri()
    model_dir, version = champion_copy(uri, config.project, out_root, "reward")
    if model_dir is None:
        return None
    name = registry_models.registered_name(config.project, "reward")
    metrics = recorded_metrics(uri, name, version)
    accuracy = metrics.get(REWARD_ACCURACY, metrics.get(REWARD_ACCURACY_EVAL))
    return None if accuracy is None else {"model_dir": model_dir, "accuracy": accuracy}


def stop_run(summary: RunSummary, error: DataCheckStop) -> None:
    """Record a run stopped by a data check: reason and report on the parent run, nothing registered."""
    summary.stopped = {"reason": error.reason, "message": str(error), "report": error.report_path}
    mlflow.set_tags({OUTCOME_TAG: "stopped", STOP_REASON_TAG: error.reason})
    if error.report_path:
        mlflow.log_artifact(error.report_path, "data")


def _task_with_cache_flag(task_fn, **params) -> dict[str, Any]:
    state = task_fn(**params, return_state=True)
    return {**state.result(), "cached": state.name == "Cached"}


def _run_pipeline(
    stages: Stages, config: PipelineConfig, summary: RunSummary, repo_dir: str, cfg_hash: str, force: bool
) -> None:
    """Data, then training and promotion; or nothing to do; or a stop by the poisoned-data check."""
    source = data_source(config, repo_dir)
    judge = label_judge(config, stages.out_root)
    try:
        data = stages.run(
            "data", call=lambda: version_data(stages.config_json, source, repo_dir, stages.parent, judge)
        )
    except DataCheckStop as error:  # poisoned labels, pinned prompts in training
        stop_run(summary, error)
        return
    stages.data = data
    summary.golden = pin_golden(stages.config_json, data["data_dir"], repo_dir)
    mlflow.set_tags({GOLDEN_VERSION_TAG: summary.golden["version"]})
    summary.data_version = data["version"]
    mlflow.set_tags({DATA_VERSION_TAG: data["version"], **accepted_tags(data)})
    record_data_version(config, stages.parent, data["version"], data["data_dir"])
    name = run_name(config.project, config.policy.algorithm, data["version"])
    label_flow_run(name, [data_tag(data["version"])])  # as the MLflow parent run is named
    mlflow.log_artifact(data["report_path"], "data")
    mlflow.log_artifact(data["manifest_path"], "data")
    champion = None if force else current_champion(config)
    if champion is not None and trained_on(champion, data["version"], cfg_hash):
        mark_nothing_to_do(summary, config, champion)
        show_champion_stages(summary)
        mlflow.set_tag(OUTCOME_TAG, "nothing_to_do")
    else:
        _train_and_promote(stages, config, summary, cfg_hash)
        mlflow.set_tag(OUTCOME_TAG, summary.outcome)


@flow(name="retrain", log_prints=False, flow_run_name=retrain_run_name)
def retrain(
    config_path: str | None = None,
    overrides: list[str] | None = None,
    repo_dir: str = ".",
    force: bool = False,
) -> dict:
    """The main job. Returns a JSON-able summary (stages, times, cache hits, metrics, promotions).

    ``force`` trains even when the champion already comes from this data and config (the
    stages themselves still answer from their caches when their inputs are unchanged).
    """
    started = time.perf_counter()
    config = load_config(config_path, overrides or [])
    cfg_hash = config_hash(config)
    uri = config.tracking.resolved_uri()
    summary = RunSummary(project=config.project, config_hash=cfg_hash, tracking_uri=uri)
    labels = config_tags(config.project, config.policy.algorithm)
    label_flow_run(tags=labels)
    with logs_to_the_run(), prefect_tags(*labels), parent_run(config, repo_dir) as parent:
        summary.parent_run_id, summary.flow_run_id = parent.info.run_id, _flow_run_id()
        stages = Stages(config, summary, parent.info.run_id, repo_dir)
        _run_pipeline(stages, config, summary, repo_dir, cfg_hash, force)
        record_results(summary)
        summary.wall_seconds = time.perf_counter() - started
        mlflow.log_metrics(
            {
                "pipeline/wall_seconds": summary.wall_seconds,
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
