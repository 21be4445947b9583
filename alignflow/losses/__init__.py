"""Composable losses for RL fine-tuning: a base class with shared post-processing and the
PPO, KL, importance-sampling and variance losses built on it."""

from alignflow.losses.custom_loss import CompositeLoss, CustomLoss, CustomLossConfig, masked_reduce
from alignflow.losses.importance_sampling import ImportanceSamplingLoss
from alignflow.losses.kl_loss import KLDivergenceLoss, kl_from_logits, kl_from_logprobs
from alignflow.losses.ppo_loss import PPOLoss
from alignflow.losses.variance_loss import VarianceLoss

__all__ = [
    "CompositeLoss",
    "CustomLoss",
    "CustomLossConfig",
    "ImportanceSamplingLoss",
    "KLDivergenceLoss",
    "PPOLoss",
    "VarianceLoss",
    "kl_from_logits",
    "kl_from_logprobs",
    "masked_reduce",
]
