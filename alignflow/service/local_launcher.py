"""The built-in launcher: trains a reward model and a policy with the library, no orchestrator.

It lets the service work on its own (and in tests). The chain mirrors the retraining flow
without its gates: feedback export -> snapshot -> (SFT) -> reward stage -> policy stage (the
job's algorithm) -> the policy's reward on held-out prompts -> one MLflow run with both
models registered under the agent's names. A deployment that runs the Prefect flow (and
its promotion gates) injects :class:`flows.feedback_launcher.RetrainFlowLauncher` instead.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

from alignflow.data.feedback import write_feedback_snapshot
from alignflow.service.jobs import TrainingOutcome, TrainingRequest
from alignflow.service.policies import job_metrics, record_training


def run_library_stage(
    stage: str, config: Any, data_dir: Path, output_dir: Path, model_path: str | None = None
) -> Any:
    """``alignflow.training.<stage>.run_<stage>(config, data_dir, output_dir, model_path)``."""
    module = importlib.import_module(f"alignflow.training.{stage}")
    return getattr(module, f"run_{stage}")(config, data_dir, output_dir, model_path)


def held_out_prompts(data_dir: Path, limit: int) -> list[Any]:
    from alignflow.data.snapshot import load_split
    from alignflow.evaluation.evaluate import held_out_prompts as distinct

    return [row["prompt"] for row in distinct(load_split(data_dir, "eval"), limit)]


class LocalTrainingLauncher:
    """Train with ``alignflow.training`` in this process and register the result in MLflow.

    The job's config is ``config_path`` (None: the embedded default) with
    ``config_overrides`` and then the request's own overrides (feedback plan and request
    fields) applied, so the request always has the last word.
    """

    def __init__(
        self,
        tracking_uri: str,
        config_overrides: list[str] | None = None,
        config_path: str | Path | None = None,
    ):
        self.tracking_uri = tracking_uri
        self.config_overrides = list(config_overrides or [])
        self.config_path = config_path

    def pipeline_config(self, request: TrainingRequest) -> Any:
        from alignflow.config import load_config

        return load_config(self.config_path, [*self.config_overrides, *request.overrides])

    def launch(self, request: TrainingRequest) -> TrainingOutcome:
        from alignflow.config import PipelineConfig, with_reward_model
        from alignflow.evaluation.policy_reward import policy_reward

        started = time.perf_counter()
        out = Path(request.output_dir)
        data_dir = out / "data"
        data_version = write_feedback_snapshot(Path(request.dataset_path), data_dir)
        config = self.pipeline_config(request)
        sft_dir = None
        if config.policy.run_sft:
            sft_dir = run_library_stage("sft", config, data_dir, out / "sft").model_dir
        reward_init = sft_dir if config.reward.backbone == "policy" else None
        reward = run_library_stage("reward", config, data_dir, out / "reward_model", reward_init)
        policy_config = PipelineConfig.model_validate(
            with_reward_model(config.model_dump(mode="json"), reward.model_dir)
        )
        policy_started = time.perf_counter()
        policy = run_library_stage(config.policy.algorithm, policy_config, data_dir, out / "policy", sft_dir)
        policy_seconds = time.perf_counter() - policy_started
        prompts = held_out_prompts(data_dir, config.evaluation.max_prompts)
        stats = policy_reward(policy.model_dir, reward.model_dir, prompts, config.evaluation.max_new_tokens)
        steps = int(policy.metrics["global_step"])
        metrics = job_metrics(
            request.feedback_count,
            steps,
            stats.mean,
            stats.std,
            policy_seconds,
            time.perf_counter() - started,
        )
        policy_dir, reward_dir = Path(policy.model_dir), Path(reward.model_dir)
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
                "stage": request.algorithm,
            },
            artifact_root=out / "mlflow-artifacts",
            data_version=data_version,
            tags=request.timing_tags,
        )
        return TrainingOutcome(
            policy_id=f"models:/{request.agent_id}-policy/{version}",
            version=f"v{version}",
            model_path=str(policy_dir.resolve()),
            reward_model_path=str(reward_dir.resolve()),
            feedback_count=request.feedback_count,
            training_steps=steps,
            reward_mean=stats.mean,
            reward_std=stats.std,
            data_version=data_version,
        )
