"""Spec 002's Python API: configure, train a reward model, train a policy with PPO, read results.

A thin face over the pipeline's stages (:mod:`alignflow.training`): the same snapshot,
reward stage and PPO stage the retraining flow runs, called in-process with no
orchestrator. Names load lazily, so ``from alignflow.rlhf import TrainingConfig`` does not
import torch.
"""

from __future__ import annotations

from alignflow.lazy import lazy_exports

_EXPORTS = {
    "alignflow.rlhf.training_config": ["TrainingConfig", "RewardModelConfig"],
    "alignflow.rlhf.dataset": ["FeedbackDataset", "PPODataset", "ScoreScale"],
    "alignflow.rlhf.tokenizer": ["build_tokenizer"],
    "alignflow.rlhf.reward_model": ["RewardModel", "train_reward_model"],
    "alignflow.rlhf.trainer": ["RLHFTrainer"],
    "alignflow.rlhf.result": ["TrainingResult"],
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
