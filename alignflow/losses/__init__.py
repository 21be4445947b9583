"""Composable losses for RL fine-tuning: a base class with shared post-processing, the PPO, KL,
importance-sampling and variance losses built on it, the DPO family's losses by name, and the
log-prob/entropy/whitening math they all share.

Names load lazily (PEP 562): reading :data:`DPO_LOSS_TYPES` (a config does) imports no torch.
The research API (:mod:`alignflow.rl`) builds on this package, never the other way round.
"""

from __future__ import annotations

from alignflow.lazy import lazy_exports

_EXPORTS = {
    "alignflow.losses.custom_loss": ["CompositeLoss", "CustomLoss", "CustomLossConfig", "masked_reduce"],
    "alignflow.losses.importance_sampling": ["ImportanceSamplingLoss"],
    "alignflow.losses.kl_loss": ["KLDivergenceLoss", "kl_from_logits", "kl_from_logprobs"],
    "alignflow.losses.ppo_loss": ["PPOLoss"],
    "alignflow.losses.variance_loss": ["VarianceLoss"],
    "alignflow.losses.dpo_loss_types": ["DPO_LOSS_TYPES"],
    "alignflow.losses.dpo_losses": ["DPO_LOSSES", "PairLogps", "dpo_family_loss"],
    "alignflow.losses.functional": [
        "logprobs_from_logits",
        "entropy_from_logits",
        "masked_mean",
        "masked_var",
        "whiten",
        "sequence_logprobs",
    ],
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
