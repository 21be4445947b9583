"""Service jobs through the retraining flow: feedback in, a validated, versioned, gated policy out.

The HTTP service (library layer) knows only the :class:`TrainingLauncher` protocol; this
launcher, wired in by ``alignflow api``, runs the same Prefect flow as the nightly job on
the agent's exported feedback. Each agent gets its own git+DVC workspace, so its data
versions, registered models (``<agent>-policy``, ``<agent>-reward``) and champion are
its own, and every policy the service lists traces back to the feedback that trained it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlflow import MlflowClient

from alignflow.registry import models as registry_models
from alignflow.service.jobs import TrainingOutcome, TrainingRequest
from alignflow.service.settings import ServiceSettings
from flows.retrain import retrain


def _reward_metric(summary: dict[str, Any], name: str) -> float | None:
    stage = next((s for s in summary["stages"] if s["name"] == "reward"), None)
    metrics = stage["metrics"] if stage else {}
    return metrics.get(f"train/{name}", metrics.get(f"eval/{name}"))


class RetrainFlowLauncher:
    """Run ``flows.retrain.retrain`` on one agent's feedback export."""

    def __init__(
        self, settings: ServiceSettings, config_path: str | None = None, overrides: list[str] | None = None
    ):
        self.settings = settings
        self.config_path = config_path
        self.overrides = list(overrides or [])

    def overrides_for(self, request: TrainingRequest) -> list[str]:
        return [
            f"project={request.agent_id}",
            f"data.source={Path(request.dataset_path).resolve()}",
            f"tracking.uri={self.settings.tracking_uri}",
            f"output_dir={Path(request.output_dir).resolve()}",
            f"tracking.tags.agent_id={request.agent_id}",
            f"tracking.tags.job_id={request.job_id}",
            *self.overrides,
        ]

    def launch(self, request: TrainingRequest) -> TrainingOutcome:
        workspace = (self.settings.work_dir / "agents" / request.agent_id).resolve()
        workspace.mkdir(parents=True, exist_ok=True)
        summary = retrain(self.config_path, self.overrides_for(request), repo_dir=str(workspace))
        uri = self.settings.tracking_uri
        name = registry_models.registered_name(request.agent_id, "policy")
        version = self._trained_version(summary, uri, name)
        model_version = MlflowClient(uri).get_model_version(name, version)
        steps = self._record_job_metrics(uri, model_version.run_id, request)
        reward = registry_models.registered_name(request.agent_id, "reward")
        return TrainingOutcome(
            policy_id=f"models:/{name}/{version}",
            version=f"v{version}",
            model_path=model_version.source,
            reward_model_path=self._source_of(uri, reward, summary),
            feedback_count=request.feedback_count,
            training_steps=steps,
            reward_mean=_reward_metric(summary, "reward_mean"),
            reward_std=_reward_metric(summary, "reward_std"),
            data_version=summary.get("data_version"),
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

    @staticmethod
    def _source_of(uri: str, name: str, summary: dict[str, Any]) -> str | None:
        decision = summary.get("promotions", {}).get("reward")
        if not decision:
            return None
        return MlflowClient(uri).get_model_version(name, str(decision["version"])).source

    def _record_job_metrics(self, uri: str, run_id: str | None, request: TrainingRequest) -> int:
        """The service lists these from the version's run: feedback count and training steps."""
        config_steps = request.max_steps
        if run_id:
            client = MlflowClient(uri)
            client.log_metric(run_id, "feedback_count", float(request.feedback_count))
            client.log_metric(run_id, "training_steps", float(config_steps))
        return config_steps


def make_launcher(settings: ServiceSettings) -> RetrainFlowLauncher:
    """Factory for ``alignflow api --launcher flows.feedback_launcher:make_launcher``."""
    return RetrainFlowLauncher(settings)
