"""The DPO family's per-pair losses, one function per name of :data:`DPO_LOSS_TYPES`.

The pipeline's DPO stage runs TRL's DPOTrainer, whose ``loss_type`` takes those names;
the research :class:`alignflow.rl.dpo.DPOTrainer` computes them here. Each function sees
the summed log-probabilities of both completions under the policy and the reference (0
for reference-free DPO), their token counts, ``beta`` and ``label_smoothing``, and returns
one loss per pair. Sources: DPO (Rafailov et al. 2023), IPO (Azar et al. 2023), EXO (Ji et
al. 2024), NCA (Chen et al. 2024), robust DPO (Chowdhury et al. 2024), BCO (Jung et al.
2024), SPPO (Wu et al. 2024), AOT (Melnyk et al. 2024), APO (D'Oosterlinck et al. 2024),
DiscoPOP (Lu et al. 2024).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from alignflow.losses.dpo_loss_types import DPO_LOSS_TYPES

DISCOPOP_TAU = 0.05  # TRL's default temperature of DiscoPOP's mixing


@dataclass(frozen=True)
class PairLogps:
    """Summed completion log-probs of a batch of pairs under the policy and the reference."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    ref_chosen: torch.Tensor
    ref_rejected: torch.Tensor
    chosen_tokens: torch.Tensor | None = None
    rejected_tokens: torch.Tensor | None = None

    @property
    def chosen_ratio(self) -> torch.Tensor:
        return self.chosen - self.ref_chosen

    @property
    def rejected_ratio(self) -> torch.Tensor:
        return self.rejected - self.ref_rejected

    @property
    def margin(self) -> torch.Tensor:
        return self.chosen_ratio - self.rejected_ratio

    def per_token_margin(self, loss_type: str) -> torch.Tensor:
        if self.chosen_tokens is None or self.rejected_tokens is None:
            raise ValueError(f"DPO loss {loss_type!r} needs the completions' token counts")
        return self.chosen_ratio / self.chosen_tokens.clamp_min(1) - self.rejected_ratio / (
            self.rejected_tokens.clamp_min(1)
        )


LossFn = Callable[[PairLogps, float, float], torch.Tensor]


def _smoothed_logistic(z: torch.Tensor, eps: float) -> torch.Tensor:
    """Bradley-Terry NLL of a margin whose label is flipped with probability ``eps``."""
    return -(1 - eps) * F.logsigmoid(z) - eps * F.logsigmoid(-z)


def sigmoid(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    return _smoothed_logistic(beta * p.margin, eps)


def hinge(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    return torch.relu(1 - beta * p.margin)


def ipo(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    return (p.per_token_margin("ipo") - 1 / (2 * beta)) ** 2


def sigmoid_norm(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    return -F.logsigmoid(beta * p.per_token_margin("sigmoid_norm"))


def exo_pair(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    """KL from the policy's pair distribution to a label distribution (1 - eps, eps)."""
    if not 0 < eps < 1:
        raise ValueError("DPO loss 'exo_pair' needs 0 < label_smoothing < 1 (e.g. 1e-3)")
    z = beta * p.margin
    win, lose = torch.sigmoid(z), torch.sigmoid(-z)
    return win * (F.logsigmoid(z) - math.log1p(-eps)) + lose * (F.logsigmoid(-z) - math.log(eps))


def nca_pair(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    chosen, rejected = beta * p.chosen_ratio, beta * p.rejected_ratio
    return -F.logsigmoid(chosen) - 0.5 * (F.logsigmoid(-chosen) + F.logsigmoid(-rejected))


def robust(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    """Unbiased under label noise ``eps``: the flipped term is subtracted, then rescaled."""
    z = beta * p.margin
    return (-(1 - eps) * F.logsigmoid(z) + eps * F.logsigmoid(-z)) / (1 - 2 * eps)


def bco_pair(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    return -F.logsigmoid(beta * p.chosen_ratio) - F.logsigmoid(-beta * p.rejected_ratio)


def sppo_hard(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    return (p.chosen_ratio - 0.5 / beta) ** 2 + (p.rejected_ratio + 0.5 / beta) ** 2


def aot(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    """Distributional alignment: sorted policy log-odds against sorted reference log-odds."""
    policy = torch.sort(p.chosen - p.rejected, dim=0).values
    reference = torch.sort(p.ref_chosen - p.ref_rejected, dim=0).values
    return _smoothed_logistic(beta * (policy - reference), eps)


def aot_unpaired(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    chosen = torch.sort(p.chosen_ratio, dim=0).values
    rejected = torch.sort(p.rejected_ratio, dim=0).values
    return _smoothed_logistic(beta * (chosen - rejected), eps)


def apo_zero(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    return (1 - torch.sigmoid(beta * p.chosen_ratio)) + torch.sigmoid(beta * p.rejected_ratio)


def apo_down(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    return torch.sigmoid(beta * p.chosen_ratio) + (1 - torch.sigmoid(beta * p.margin))


def discopop(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    """A blend of the logistic and exponential losses, weighted by the margin itself."""
    z = beta * p.margin
    blend = torch.sigmoid(z / DISCOPOP_TAU)
    return -F.logsigmoid(z) * (1 - blend) + torch.exp(-z) * blend


def sft(p: PairLogps, beta: float, eps: float) -> torch.Tensor:
    """Negative log-likelihood of the chosen completions per token of the batch (a regulariser to
    mix in); spread over the pairs so that their mean is the batch's token mean."""
    if p.chosen_tokens is None:
        raise ValueError("DPO loss 'sft' needs the chosen completions' token counts")
    return -p.chosen * len(p.chosen) / p.chosen_tokens.sum().clamp_min(1)


DPO_LOSSES: dict[str, LossFn] = {
    fn.__name__: fn
    for fn in (sigmoid, hinge, ipo, exo_pair, nca_pair, robust, bco_pair, sppo_hard, aot, aot_unpaired)
    + (apo_zero, apo_down, discopop, sft, sigmoid_norm)
}
if set(DPO_LOSSES) != set(DPO_LOSS_TYPES):  # the names list is what configs validate against
    raise ImportError(f"DPO losses {sorted(DPO_LOSSES)} differ from DPO_LOSS_TYPES {sorted(DPO_LOSS_TYPES)}")


def dpo_family_loss(name: str, pairs: PairLogps, beta: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """One loss per pair of the named DPO-family loss."""
    if name not in DPO_LOSSES:
        raise ValueError(f"unknown DPO loss_type {name!r}; expected one of {list(DPO_LOSS_TYPES)}")
    return DPO_LOSSES[name](pairs, beta, label_smoothing)
