"""Off-policy policy gradient with truncated importance weights.

Samples drawn by an older (behaviour) policy are reweighted by
``r = exp(logp - logp_old)``; the weight is capped at ``clip_is_ratio`` so that a few
tokens the new policy likes much more cannot dominate the gradient. Per token the loss
is ``-min(r, clip_is_ratio) * A``.
"""

from __future__ import annotations

import torch

from alignflow.losses.custom_loss import CustomLoss, CustomLossConfig, masked_reduce
from alignflow.losses.functional import whiten


class ImportanceSamplingLoss(CustomLoss):
    def __init__(
        self,
        config: CustomLossConfig | None = None,
        clip_is_ratio: float = 5.0,
        normalize_advantages: bool = True,
    ):
        super().__init__(config or CustomLossConfig(name="importance_sampling"))
        if clip_is_ratio <= 0:
            raise ValueError(f"ImportanceSamplingLoss.clip_is_ratio must be positive, got {clip_is_ratio}")
        self.clip_is_ratio = clip_is_ratio
        self.normalize_advantages = normalize_advantages

    def compute_loss(  # type: ignore[override]  # spec 001 names its inputs
        self, log_probs, old_log_probs=None, mask=None, advantages=None, **kwargs
    ):
        if old_log_probs is None or advantages is None:
            raise ValueError("ImportanceSamplingLoss needs old_log_probs and advantages")
        advantages = torch.as_tensor(advantages, dtype=log_probs.dtype, device=log_probs.device).detach()
        if advantages.shape != log_probs.shape:
            if log_probs.dim() == 2 and advantages.shape == log_probs.shape[:1]:
                advantages = advantages.unsqueeze(-1).expand_as(log_probs)
            else:
                raise ValueError(
                    f"ImportanceSamplingLoss: advantages have shape {tuple(advantages.shape)}, "
                    f"expected {tuple(log_probs.shape)} or [batch]"
                )
        if self.normalize_advantages and advantages.numel() > 1:
            advantages = whiten(advantages, mask)
        ratio = torch.exp(log_probs - old_log_probs.detach())
        weight = ratio.clamp(max=self.clip_is_ratio)
        self.record(
            ratio_mean=masked_reduce(ratio.detach(), mask, "mean"),
            clipped_fraction=masked_reduce((ratio.detach() > self.clip_is_ratio).float(), mask, "mean"),
        )
        return -weight * advantages
