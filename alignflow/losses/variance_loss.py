"""Keep the spread of a quantity (rewards, values, log-probs) near a target.

``beta * (Var[x] - target_variance)^2`` over the masked entries of ``predictions``:
useful to stop a reward or value head from collapsing to a constant or blowing up.
``targets`` is accepted for a uniform call signature and ignored.
"""

from __future__ import annotations

from alignflow.losses.custom_loss import CustomLoss, CustomLossConfig
from alignflow.losses.functional import masked_var


class VarianceLoss(CustomLoss):
    def __init__(
        self, config: CustomLossConfig | None = None, target_variance: float = 1.0, beta: float = 0.1
    ):
        super().__init__(config or CustomLossConfig(name="variance"))
        if target_variance < 0:
            raise ValueError(f"VarianceLoss.target_variance must be >= 0, got {target_variance}")
        self.target_variance = target_variance
        self.beta = beta

    def compute_loss(self, predictions, targets=None, mask=None, **kwargs):
        variance = masked_var(predictions.float(), mask, unbiased=False)
        self.record(variance=variance)
        return self.beta * (variance - self.target_variance) ** 2
