"""The PPO clipped surrogate with optional clipped value loss and entropy bonus.

Per token: ``max(-A * r, -A * clip(r, 1-eps, 1+eps))`` with ``r = exp(logp - logp_old)``,
plus ``value_loss_coef * 0.5 * max((V - R)^2, (V_clip - R)^2)`` when values are given,
minus ``entropy_coef * H`` when per-token entropy (or logits) are given.
"""

from __future__ import annotations

import torch

from alignflow.losses.custom_loss import CustomLoss, CustomLossConfig, masked_reduce
from alignflow.losses.functional import entropy_from_logits


def _as_token_tensor(name: str, value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-sequence tensor ``[B]`` to per-token ``[B, T]``; reject other shapes."""
    value = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if value.shape == like.shape:
        return value
    if like.dim() == 2 and value.shape == like.shape[:1]:
        return value.unsqueeze(-1).expand_as(like)
    raise ValueError(
        f"PPOLoss: {name} has shape {tuple(value.shape)}, expected {tuple(like.shape)} or [batch]"
    )


class PPOLoss(CustomLoss):
    """Clipped-ratio policy loss (Schulman et al. 2017) with value and entropy terms."""

    def __init__(
        self,
        config: CustomLossConfig | None = None,
        clip_param: float = 0.2,
        value_clip: float | None = None,
        entropy_coef: float = 0.01,
        value_loss_coef: float = 0.5,
    ):
        super().__init__(config or CustomLossConfig(name="ppo"))
        if clip_param <= 0:
            raise ValueError(f"PPOLoss.clip_param must be positive, got {clip_param}")
        self.clip_param = clip_param
        self.value_clip = value_clip
        self.entropy_coef = entropy_coef
        self.value_loss_coef = value_loss_coef

    def policy_loss(self, log_probs, old_log_probs, advantages):
        """Per-token clipped surrogate (to minimise) and the ratio."""
        ratio = torch.exp(log_probs - old_log_probs)
        unclipped = -advantages * ratio
        clipped = -advantages * ratio.clamp(1.0 - self.clip_param, 1.0 + self.clip_param)
        return torch.maximum(unclipped, clipped), ratio

    def value_loss(self, values, returns, old_values=None):
        """Per-token squared error, pessimistically clipped around ``old_values`` if configured."""
        loss = (values - returns) ** 2
        if self.value_clip is not None and old_values is not None:
            clipped_values = old_values + (values - old_values).clamp(-self.value_clip, self.value_clip)
            loss = torch.maximum(loss, (clipped_values - returns) ** 2)
        return 0.5 * loss

    def compute_loss(  # type: ignore[override]  # spec 001 names its inputs
        self,
        log_probs,
        old_log_probs=None,
        advantages=None,
        values=None,
        old_values=None,
        returns=None,
        mask=None,
        entropy=None,
        logits=None,
        **kwargs,
    ):
        if old_log_probs is None or advantages is None:
            raise ValueError("PPOLoss needs old_log_probs and advantages")
        old_log_probs = old_log_probs.detach()
        advantages = _as_token_tensor("advantages", advantages, log_probs).detach()
        per_token, ratio = self.policy_loss(log_probs, old_log_probs, advantages)
        clipped = ((ratio - 1.0).abs() > self.clip_param).to(log_probs.dtype)
        log_ratio = (log_probs - old_log_probs).detach()
        self.record(
            policy_loss=masked_reduce(per_token.detach(), mask, "mean"),
            ratio_mean=masked_reduce(ratio.detach(), mask, "mean"),
            clip_fraction=masked_reduce(clipped, mask, "mean"),
            approx_kl=masked_reduce((log_ratio.exp() - 1) - log_ratio, mask, "mean"),
        )
        total = per_token
        if values is not None:
            if returns is None:
                raise ValueError("PPOLoss: values were given without returns")
            values = _as_token_tensor("values", values, log_probs)
            returns = _as_token_tensor("returns", returns, log_probs).detach()
            if old_values is not None:
                old_values = _as_token_tensor("old_values", old_values, log_probs).detach()
            vf = self.value_loss(values, returns, old_values)
            self.record(value_loss=masked_reduce(vf.detach(), mask, "mean"))
            total = total + self.value_loss_coef * vf
        if entropy is None and logits is not None:
            entropy = entropy_from_logits(logits)
        if entropy is not None:
            entropy = _as_token_tensor("entropy", entropy, log_probs)
            self.record(entropy=masked_reduce(entropy.detach(), mask, "mean"))
            total = total - self.entropy_coef * entropy
        return total

    def forward(  # type: ignore[override]  # spec 001 names its inputs
        self,
        log_probs,
        old_log_probs=None,
        advantages=None,
        values=None,
        old_values=None,
        returns=None,
        mask=None,
        return_dict=False,
        **kwargs,
    ):
        """Reduced PPO loss; same argument order as ``compute_loss``."""
        return super().forward(
            log_probs,
            old_log_probs,
            mask=mask,
            return_dict=return_dict,
            advantages=advantages,
            values=values,
            old_values=old_values,
            returns=returns,
            **kwargs,
        )
