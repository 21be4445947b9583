"""The built-in launcher: trains a reward model and a policy with the library, no orchestrator.

It lets the service work on its own (and in tests): feedback export -> snapshot -> the
training chain (:class:`alignflow.plan.RunPlan`, the plan the retraining flow runs, here
without its gates) -> the policy's reward on held-out prompts -> one MLflow run with both
models registered under the agent's names. A deployment that runs the Prefect flow (and
its promotion gates) injects :class:`alignflow.flows.feedback_launcher.RetrainFlowLauncher` instead.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from alignflow.data.feedback import write_feedback_snapshot
from alignflow.service.jobs import TrainingOutcome, TrainingRequest
from alignflow.service.policies import job_metrics, record_training

if TYPE_CHECKING:  # torch and every stage's config load only when a job trains
    from alignflow.config import PipelineConfig
    from alignflow.training.stage import StageResult


def run_library_stage(
    stage: str, config: PipelineConfig, data_dir: Path, output_dir: Path, model_path: str | None = None
) -> StageResult:
    """The registered stage's runner, in this process: ``run(config, data_dir, output_dir, model_path)``."""
    from alignflow.training.registry import stage_spec

    return stage_spec(stage).load_runner()(config, data_dir, output_dir, model_path)


STEP_FOLDERS = {"sft": "sft", "reward": "reward_model", "policy": "policy"}


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

    def pipeline_config(self, request: TrainingRequest) -> PipelineConfig:
        from alignflow.config import load_config

        return load_config(self.config_path, [*self.config_overrides, *request.overrides])

    def launch(self, request: TrainingRequest) -> TrainingOutcome:
        from alignflow.evaluation.policy_reward import policy_reward
        from alignflow.plan import PlannedStep, RunPlan
        from alignflow.training.chain import held_out_prompts

        started = time.perf_counter()
        out = Path(request.output_dir)
        data_dir = out / "data"
        data_version = write_feedback_snapshot(Path(request.dataset_path), data_dir)
        config = self.pipeline_config(request)

        seconds: dict[str, float] = {}

        def run_step(step: PlannedStep) -> StageResult:
            began = time.perf_counter()
            result = run_library_stage(
                step.stage, step.config(), data_dir, out / STEP_FOLDERS[step.role], step.start
            )
            seconds[step.role] = time.perf_counter() - began
            return result

        trained = RunPlan(config, out).run_chain(run_step)
        reward, policy = trained["reward"], trained["policy"]
        prompts = [row["prompt"] for row in held_out_prompts(data_dir, config.evaluation.max_prompts)]
        stats = policy_reward(policy.model_dir, reward.model_dir, prompts, config.evaluation.max_new_tokens)
        steps = int(policy.metrics["global_step"])
        metrics = job_metrics(
            request.feedback_count,
            steps,
            stats.mean,
            stats.std,
            seconds["policy"],
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
