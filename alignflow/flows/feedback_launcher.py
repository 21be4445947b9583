"""Service jobs through the retraining flow: feedback in, a validated, versioned, gated policy out.

The HTTP service (library layer) knows only the :class:`TrainingLauncher` protocol; this
launcher, wired in by ``alignflow api``, runs the same Prefect flow as the nightly job on
the agent's exported feedback, with the job's overrides (the feedback plan: reward mode and
algorithm; the request's fields). Each agent gets its own git+DVC workspace, so its data
versions, registered models (``<agent>-policy``, ``<agent>-reward``) and champion are its
own, and every policy the service lists traces back to the feedback that trained it.

What the job reports comes from what ran: the policy stage's own step count, the evaluate
stage's measure of the policy's reward on held-out prompts, the promotion decision. The
same numbers go onto the policy version's run, where the listing and the estimate read them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from mlflow import MlflowClient

from alignflow.evaluation.metric_names import POLICY_REWARD_MEAN, POLICY_REWARD_STD
from alignflow.flows.retrain import retrain
from alignflow.registry import models as registry_models
from alignflow.service.jobs import TrainingOutcome, TrainingRequest
from alignflow.service.policies import job_metrics, record_job
from alignflow.service.settings import ServiceSettings


def _stage(summary: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((s for s in summary["stages"] if s["name"] == name), None)


class RetrainFlowLauncher:
    """Run ``alignflow.flows.retrain.retrain`` on one agent's feedback export.

    ``config_path`` (default: the service's ``pipeline_config``) and ``overrides`` are the
    deployment's; the request's overrides are applied after them.
    """

    def __init__(
        self, settings: ServiceSettings, config_path: str | None = None, overrides: list[str] | None = None
    ):
        self.settings = settings
        self.config_path = config_path if config_path is not None else settings.pipeline_config
        self.overrides = list(overrides or [])

    def overrides_for(self, request: TrainingRequest) -> list[str]:
        return [
            f"project={request.agent_id}",
            f"data.source={Path(request.dataset_path).resolve()}",
            f"tracking.uri={self.settings.tracking_uri}",
            f"output_dir={Path(request.output_dir).resolve()}",
            f"tracking.tags.agent_id={request.agent_id}",
            f"tracking.tags.job_id={request.job_id}",
            # human ratings carry no verifiable answers to audit a model judge against; the
            # live A/B on ratings (`promote --human`) is this service's check. A deployment's or
            # a request's overrides, applied after, can still ask for audited judges
            "promotion.allow_unaudited_judges=true",
            *self.overrides,
            *request.overrides,
        ]

    def launch(self, request: TrainingRequest) -> TrainingOutcome:
        started, requested_at = time.perf_counter(), time.time()
        workspace = (self.settings.work_dir / "agents" / request.agent_id).resolve()
        workspace.mkdir(parents=True, exist_ok=True)
        summary = retrain(
            str(self.config_path) if self.config_path else None,
            self.overrides_for(request),
            repo_dir=str(workspace),
            requested_at=requested_at,
        )
        if summary.get("stopped"):
            raise RuntimeError(f"the retraining flow stopped: {summary['stopped']['message']}")
        uri = self.settings.tracking_uri
        name = registry_models.registered_name(request.agent_id, "policy")
        version = self._trained_version(summary, uri, name)
        model_version = MlflowClient(uri).get_model_version(name, version)
        policy, evaluation = _stage(summary, "policy"), _stage(summary, "evaluate")
        if policy is None or evaluation is None:  # nothing to do: the champion is this data + config
            return self._existing(request, uri, name, version, summary)
        metrics = job_metrics(
            request.feedback_count,
            int(policy["metrics"]["global_step"]),
            evaluation["metrics"].get(POLICY_REWARD_MEAN),
            evaluation["metrics"].get(POLICY_REWARD_STD),
            None if policy["cached"] else policy["compute_seconds"],
            None if policy["cached"] else time.perf_counter() - started,
        )
        if model_version.run_id is None:
            raise RuntimeError(f"{name} version {version} names no run to record the job on")
        record_job(uri, model_version.run_id, metrics, request.timing_tags)
        decision = summary.get("promotions", {}).get("policy") or {}
        reward = _stage(summary, "reward")
        return TrainingOutcome(
            policy_id=f"models:/{name}/{version}",
            version=f"v{version}",
            model_path=str(Path(policy["output"]["model_dir"]).resolve()),  # loads with from_pretrained
            reward_model_path=str(Path(reward["output"]["model_dir"]).resolve()) if reward else None,
            feedback_count=request.feedback_count,
            training_steps=int(metrics["training_steps"]),
            reward_mean=metrics.get("reward_mean"),
            reward_std=metrics.get("reward_std"),
            data_version=summary.get("data_version"),
            promoted=decision.get("promoted"),
        )

    def _existing(
        self, request: TrainingRequest, uri: str, name: str, version: str, summary: dict[str, Any]
    ) -> TrainingOutcome:
        """The champion already comes from this feedback and config: report it as it was recorded."""
        client = MlflowClient(uri)
        model_version = client.get_model_version(name, version)
        recorded = client.get_run(model_version.run_id).data.metrics if model_version.run_id else {}
        if "training_steps" not in recorded:
            raise RuntimeError(f"{name} v{version} has no recorded training steps to report")
        return TrainingOutcome(
            policy_id=f"models:/{name}/{version}",
            version=f"v{version}",
            model_path=model_version.source,
            reward_model_path=None,
            feedback_count=request.feedback_count,
            training_steps=int(recorded["training_steps"]),
            reward_mean=recorded.get("reward_mean"),
            reward_std=recorded.get("reward_std"),
            data_version=summary.get("data_version"),
            promoted=True,
        )

    @staticmethod
    def _trained_version(summary: dict[str, Any], uri: str, name: str) -> str:
        decision = summary.get("promotions", {}).get("policy")
        if decision:
            return str(decision["version"])
        champion = registry_models.alias_version(uri, name, registry_models.CHAMPION)
        if champion is None:
            raise RuntimeError(f"retraining produced no {name} version: {summary.get('nothing_to_do')}")
        return champion  # nothing to do: the champion already is this data + config


def make_launcher(settings: ServiceSettings) -> RetrainFlowLauncher:
    """Factory for ``alignflow api --launcher flow`` (the default)."""
    return RetrainFlowLauncher(settings)
