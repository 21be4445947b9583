"""The loss base class and composition.

Every loss in this package computes an element-wise (or already scalar) tensor in
``compute_loss``; the base class then applies, in a fixed order, clipping,
normalisation, the mask, the reduction and the weight. Keeping that order in one place
means a researcher can write a new loss in a few lines and still get masking and
reductions that agree with the built-in ones.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

REDUCTIONS = ("mean", "sum", "none")


@dataclass
class CustomLossConfig:
    """How a loss is post-processed: reduction, weight, normalisation and clipping.

    ``temperature`` is read by losses that work on logits (e.g. a full-distribution KL);
    ``epsilon`` guards every division.
    """

    name: str = "custom"
    weight: float = 1.0
    reduction: str = "mean"
    normalize: bool = False
    clip_value: float | None = None
    temperature: float = 1.0
    epsilon: float = 1e-8

    def __post_init__(self) -> None:
        if self.reduction not in REDUCTIONS:
            raise ValueError(
                f"CustomLossConfig.reduction must be one of {REDUCTIONS}, got {self.reduction!r}"
            )
        if self.clip_value is not None and self.clip_value <= 0:
            raise ValueError(f"CustomLossConfig.clip_value must be positive, got {self.clip_value}")
        if self.temperature <= 0:
            raise ValueError(f"CustomLossConfig.temperature must be positive, got {self.temperature}")


def masked_reduce(values: torch.Tensor, mask: torch.Tensor | None, reduction: str, eps: float = 1e-8):
    """Reduce ``values`` over the positions where ``mask`` is true (all positions without a mask)."""
    if values.dim() == 0:
        return values
    if mask is not None:
        mask = mask.to(values.dtype)
        if mask.shape != values.shape:
            mask = mask.expand_as(values)
        values = values * mask
    if reduction == "none":
        return values
    if reduction == "sum":
        return values.sum()
    count = mask.sum() if mask is not None else torch.tensor(values.numel(), dtype=values.dtype)
    return values.sum() / count.clamp_min(eps)


class CustomLoss(nn.Module, ABC):
    """Base class: subclasses implement ``compute_loss``; ``forward`` post-processes it."""

    def __init__(self, config: CustomLossConfig | None = None):
        super().__init__()
        self.config = config or CustomLossConfig(name=type(self).__name__)
        self.last_metrics: dict[str, float] = {}

    @abstractmethod
    def compute_loss(
        self,
        predictions: torch.Tensor,
        targets: torch.Tensor | None,
        mask: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """The unreduced loss: element-wise (same shape as ``mask``) or a scalar."""

    def record(self, **metrics: Any) -> None:
        """Remember detached diagnostics of the latest call (returned with ``return_dict=True``)."""
        for key, value in metrics.items():
            self.last_metrics[key] = (
                float(value.detach().float().mean()) if torch.is_tensor(value) else float(value)
            )

    def forward(
        self,
        predictions: torch.Tensor,
        targets: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        return_dict: bool = False,
        **kwargs,
    ):
        self.last_metrics = {}
        raw = self.compute_loss(predictions, targets, mask=mask, **kwargs)
        loss = raw
        cfg = self.config
        if cfg.clip_value is not None:
            loss = loss.clamp(-cfg.clip_value, cfg.clip_value)
        if cfg.normalize:
            # Scale to unit mean magnitude (scale treated as a constant) so that losses of
            # very different sizes can be combined without one swamping the others.
            scale = masked_reduce(loss.detach().abs(), mask, "mean", cfg.epsilon)
            loss = loss / (scale + cfg.epsilon)
        loss = masked_reduce(loss, mask, cfg.reduction, cfg.epsilon) * cfg.weight
        if not return_dict:
            return loss
        unweighted = masked_reduce(raw.detach(), mask, "mean", cfg.epsilon)
        return {"loss": loss, "raw_loss": float(unweighted), **self.last_metrics}


class CompositeLoss(CustomLoss):
    """A weighted sum of losses, each called with the same inputs.

    Each component keeps its own config (weight, reduction, ...); the composite's
    ``weights`` multiply the components' reduced values. Per-component values are
    reported under ``<name>/loss`` with ``return_dict=True``.
    """

    def __init__(
        self,
        losses: Sequence[CustomLoss],
        weights: Sequence[float] | None = None,
        config: CustomLossConfig | None = None,
    ):
        super().__init__(config or CustomLossConfig(name="composite"))
        if not losses:
            raise ValueError("CompositeLoss needs at least one loss")
        weights = [1.0] * len(losses) if weights is None else list(weights)
        if len(weights) != len(losses):
            raise ValueError(f"CompositeLoss got {len(losses)} losses but {len(weights)} weights")
        self.losses = nn.ModuleList(losses)
        self.weights = weights

    def component_names(self) -> list[str]:
        names: list[str] = []
        seen: dict[str, int] = {}
        for loss in self.losses:
            base = cast(CustomLoss, loss).config.name  # ModuleList is not generic: it yields Modules
            seen[base] = seen.get(base, 0) + 1
            names.append(base if seen[base] == 1 else f"{base}_{seen[base]}")
        return names

    def compute_loss(self, predictions, targets=None, mask=None, **kwargs):
        total = None
        for name, loss_fn, weight in zip(self.component_names(), self.losses, self.weights, strict=True):
            out = loss_fn(predictions, targets, mask=mask, return_dict=True, **kwargs)
            value = out["loss"]
            if value.dim() != 0:
                raise ValueError(
                    f"CompositeLoss: component {name!r} must reduce to a scalar (reduction='none')"
                )
            self.record(**{f"{name}/loss": value})
            self.record(**{f"{name}/{k}": v for k, v in out.items() if k not in {"loss"}})
            total = weight * value if total is None else total + weight * value
        return total
