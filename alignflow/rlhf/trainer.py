"""Spec 002's Step 2: ``RLHFTrainer(config).train(feedbacks, output_dir)``, on the pipeline's stages.

One call runs the training chain (:mod:`alignflow.training.chain`, the plan the retraining
flow runs) in this process and without an orchestrator: feedback -> snapshot (split by
prompt, every row kept) -> reward stage (regression on ratings, Bradley-Terry on comparisons,
both when both are there; or the reward model given) -> PPO stage on the training prompts ->
the policy's reward on the chain's held-out prompts.

``output_dir`` ends up holding ``policy/`` (a plain transformers model + tokenizer),
``reward_model/``, ``training_results.json``, and the stages' own folders (``data/``,
``reward_model_stage/``, ``ppo_stage/``) with their checkpoints: a second call on the
same folder resumes where an interrupted one stopped.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from alignflow.rlhf.feedback import feedback_records, write_snapshot
from alignflow.rlhf.pipeline import pipeline_config, ppo_settings, reward_settings
from alignflow.rlhf.result import RESULTS_FILE, TrainingResult
from alignflow.rlhf.reward_model import RewardModel
from alignflow.rlhf.training_config import TrainingConfig, check_precision, resolve_device

POLICY = "policy"
REWARD_MODEL = "reward_model"
REWARD_STAGE = "reward_model_stage"
PPO_STAGE = "ppo_stage"


def link_tree(source: str | Path, target: str | Path) -> Path:
    """``target`` as a copy of ``source`` made of hard links (no second copy of the weights).

    A stage that later rewrites its folder replaces its files, so the links keep this copy;
    the two share their files until then (save a changed model to a new folder).
    """
    target = Path(target)
    if target.exists():
        shutil.rmtree(target)

    def link(src: str, dst: str) -> None:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(source, target, copy_function=link)
    return target


def check_loadable(field: str, name: str) -> None:
    """Offline (``HF_HUB_OFFLINE``), a model that is neither built here nor cached is an error
    naming the setting, raised before anything is written or trained."""
    from huggingface_hub import constants

    from alignflow.models.factory import model_unavailable

    reason = model_unavailable(name) if constants.HF_HUB_OFFLINE else None
    if reason:
        raise ValueError(f"{field}={name!r} cannot be loaded offline: {reason}")


def check_reward_source(reward_model_path: str | Path | None, reward_model: Any) -> None:
    """At most one reward source, and one that exists, before anything is written."""
    if reward_model_path is not None and reward_model is not None:
        raise ValueError("give reward_model_path or reward_model, not both")
    if reward_model is not None and not isinstance(reward_model, RewardModel):
        raise TypeError(f"reward_model must be a RewardModel, got {type(reward_model).__name__}")
    if reward_model_path is not None and not (Path(reward_model_path) / "config.json").exists():
        raise FileNotFoundError(
            f"reward_model_path {reward_model_path}: not a saved reward model (no config.json)"
        )


def _reward_rows(data_dir: Path, mode: str) -> int:
    """How many training rows the reward stage sees in ``mode`` (ratings, pairs, or both)."""
    from alignflow.data.pairing import load_pairs
    from alignflow.data.snapshot import load_split

    ratings = len(load_split(data_dir, "train", kind="scored"))
    pairs = len(load_pairs(data_dir, "train"))
    return {"regression": ratings, "pairwise": pairs}.get(mode, ratings + pairs)


def _series(history: list[dict[str, float]], key: str) -> list[float]:
    return [float(step[key]) for step in history if key in step]


class RLHFTrainer:
    """Trains a reward model on feedback, then a policy against it with PPO."""

    def __init__(self, config: TrainingConfig | None = None):
        self.config = config or TrainingConfig()

    def train(
        self,
        feedbacks: Iterable[Any],
        output_dir: str | Path,
        reward_model_path: str | Path | None = None,
        reward_model: RewardModel | None = None,
    ) -> TrainingResult:
        """Train on ``feedbacks`` (ratings and/or comparisons) into ``output_dir``.

        ``reward_model_path`` reuses a saved reward model instead of training one;
        ``reward_model`` (a :class:`RewardModel`, e.g. a subclass with its own ``forward``)
        scores the rollouts itself, on its own scale.
        """
        config = self.config
        check_reward_source(reward_model_path, reward_model)
        device = resolve_device(config.device)
        check_precision(config.mixed_precision, device)
        check_loadable("TrainingConfig.base_model", config.base_model)
        if reward_model is None and reward_model_path is None:
            check_loadable("RewardModelConfig.base_model", config.reward_config().base_model)
        records = feedback_records(feedbacks)
        if len(records) < config.min_feedback:
            raise ValueError(
                f"{len(records)} feedback rows; training needs at least {config.min_feedback} "
                "(TrainingConfig.min_feedback)"
            )
        plan = self.plan(records)
        out = Path(output_dir)
        data_dir, data_version = write_snapshot(records, out, config.eval_fraction)

        from alignflow.training.chain import ChainStep, chain_steps, run_chain
        from alignflow.training.ppo import load_history, run_ppo

        def execute(step: ChainStep, start: str | None, done: Mapping[str, Any]) -> Any:
            if step.role == "reward":  # (its folder, a scorer to use in its place or None)
                return self._reward_model(plan, data_dir, out, device, reward_model_path, reward_model)
            reward_dir, scorer = done["reward"]
            ppo_config = pipeline_config(plan.overrides(), ppo_settings(config, reward_dir, device))
            return run_ppo(ppo_config, data_dir, out / PPO_STAGE, reward_scorer=scorer)

        trained = run_chain(chain_steps(run_sft=False, algorithm="ppo"), execute)
        (reward_dir, _), stage = trained["reward"], trained["policy"]
        policy_dir = link_tree(stage.model_dir, out / POLICY)
        history = load_history(out / PPO_STAGE)
        steps = int(stage.metrics["global_step"])
        if len(history) != steps:
            raise RuntimeError(f"{out / PPO_STAGE}: {len(history)} history lines for {steps} iterations")

        stats = self._final_reward(policy_dir, reward_dir, data_dir, reward_model, device)
        result = TrainingResult(
            model_path=str(policy_dir),
            reward_model_path=str(reward_dir),
            feedback_count=len(records),
            final_reward_mean=stats.mean,
            final_reward_std=stats.std,
            training_steps=steps,
            reward_history=_series(history, "reward/mean"),
            kl_history=_series(history, "objective/kl"),
            loss_history=_series(history, "loss/total"),
            value_loss_history=_series(history, "ppo/value_loss"),
            final_reward_n=stats.n,
            reward_mode=plan.reward_mode,
            data_version=data_version,
            resumed_from=stage.resumed_from,
        )
        result.save(out / RESULTS_FILE)
        return result

    @staticmethod
    def plan(records: list[dict[str, Any]]) -> Any:
        """The reward model's mode follows the feedback; the policy trains with PPO (spec 002)."""
        from alignflow.training.feedback_plan import FeedbackCounts, plan_for

        return plan_for(FeedbackCounts.of(records), "ppo")

    def _reward_model(
        self,
        plan: Any,
        data_dir: Path,
        out: Path,
        device: str,
        reward_model_path: str | Path | None,
        reward_model: RewardModel | None,
    ) -> tuple[Path, Any]:
        """(the reward model's folder, a scorer to use in its place or None)."""
        if reward_model is not None:
            reward_model.to(device)
            shutil.rmtree(out / REWARD_MODEL, ignore_errors=True)  # unlink, never write through links
            return reward_model.save_pretrained(out / REWARD_MODEL), reward_model.score
        if reward_model_path is not None:
            return Path(reward_model_path), None
        from alignflow.training.reward import run_reward

        reward = self.config.reward_config()
        settings = reward_settings(
            reward,
            plan.reward_mode,
            _reward_rows(data_dir, plan.reward_mode),
            device,
            self.config.mixed_precision,
        )
        stage = run_reward(pipeline_config([], settings), data_dir, out / REWARD_STAGE)
        return link_tree(stage.model_dir, out / REWARD_MODEL), None

    def _final_reward(
        self, policy_dir: Path, reward_dir: Path, data_dir: Path, reward_model: Any, device: str
    ) -> Any:
        from alignflow.evaluation.policy_reward import policy_reward
        from alignflow.training.chain import held_out_prompts

        scorer = reward_model.score if reward_model is not None else None
        prompts = [row["prompt"] for row in held_out_prompts(data_dir)]
        return policy_reward(
            policy_dir,
            reward_dir,
            prompts,
            max_new_tokens=self.config.max_new_tokens,
            scorer=scorer,
            device=device,
        )
