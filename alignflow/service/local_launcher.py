"""The built-in launcher: trains a reward model and a policy with the library, no orchestrator.

It lets the service work on its own (and in tests). The chain mirrors the retraining flow:
feedback export -> validated snapshot -> reward stage -> policy stage -> MLflow run with
both models registered under the agent's names. A deployment that runs the Prefect flow
injects its own :class:`~alignflow.service.jobs.TrainingLauncher` instead.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from alignflow.data.feedback import write_feedback_snapshot
from alignflow.service.jobs import TrainingOutcome, TrainingRequest
from alignflow.service.policies import record_training


def run_library_stage(stage: str, config: Any, data_dir: Path, output_dir: Path) -> Any:
    """``alignflow.training.<stage>.run_<stage>(config, data_dir, output_dir)``."""
    module = importlib.import_module(f"alignflow.training.{stage}")
    return getattr(module, f"run_{stage}")(config, data_dir, output_dir)


def _metric(metrics: dict[str, Any], *names: str) -> float | None:
    for name in names:
        if isinstance(metrics.get(name), (int, float)):
            return float(metrics[name])
    return None


def _model_dir(result: Any) -> Path:
    """Where a stage saved its final model (``StageResult.model_dir``)."""
    return Path(getattr(result, "model_dir", None) or result.output_dir)


class LocalTrainingLauncher:
    """Train with ``alignflow.training`` in this process and register the result in MLflow.

    ``reward_stage`` (None: no reward model) runs first, then ``policy_stage``; both are
    names of stage modules in ``alignflow.training``. ``config_overrides`` are dotted
    ``key=value`` settings applied to the pipeline config (e.g. ``dpo.max_length=64``).
    """

    def __init__(
        self,
        tracking_uri: str,
        config_overrides: list[str] | None = None,
        policy_stage: str = "dpo",
        reward_stage: str | None = "reward",
    ):
        self.tracking_uri = tracking_uri
        self.config_overrides = list(config_overrides or [])
        self.policy_stage = policy_stage
        self.reward_stage = reward_stage

    def pipeline_config(self, request: TrainingRequest) -> Any:
        from alignflow.config import load_config

        overrides = [
            f"{self.policy_stage}.max_steps={request.max_steps}",
            f"{self.policy_stage}.learning_rate={request.learning_rate}",
            *self.config_overrides,
        ]
        return load_config(None, overrides)

    def launch(self, request: TrainingRequest) -> TrainingOutcome:
        out = Path(request.output_dir)
        data_dir = out / "data"
        data_version = write_feedback_snapshot(Path(request.dataset_path), data_dir)
        config = self.pipeline_config(request)
        reward = None
        if self.reward_stage:
            reward = run_library_stage(self.reward_stage, config, data_dir, out / "reward_model")
        policy = run_library_stage(self.policy_stage, config, data_dir, out / "policy")
        reward_metrics = dict(reward.metrics) if reward is not None else {}
        steps = int(
            _metric(dict(policy.metrics), "global_step", "train/global_step", "steps") or request.max_steps
        )
        reward_mean = _metric(reward_metrics, "reward_mean", "eval/reward_mean", "train/reward_mean")
        reward_std = _metric(reward_metrics, "reward_std", "eval/reward_std", "train/reward_std")
        metrics = {"feedback_count": request.feedback_count, "training_steps": steps}
        for key, value in (("reward_mean", reward_mean), ("reward_std", reward_std)):
            if value is not None:
                metrics[key] = value
        policy_dir = _model_dir(policy)
        reward_dir = _model_dir(reward) if reward is not None else None
        _, version = record_training(
            self.tracking_uri,
            request.agent_id,
            request.job_id,
            policy_dir,
            reward_dir,
            metrics,
            {
                "max_steps": request.max_steps,
                "learning_rate": request.learning_rate,
                "stage": self.policy_stage,
            },
            artifact_root=out / "mlflow-artifacts",
            data_version=data_version,
        )
        return TrainingOutcome(
            policy_id=f"models:/{request.agent_id}-policy/{version}",
            version=f"v{version}",
            model_path=str(policy_dir.resolve()),
            reward_model_path=str(reward_dir.resolve()) if reward_dir else None,
            feedback_count=request.feedback_count,
            training_steps=steps,
            reward_mean=reward_mean,
            reward_std=reward_std,
            data_version=data_version,
        )
