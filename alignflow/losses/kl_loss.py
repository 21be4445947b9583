"""KL penalty between the policy and a reference (or the behaviour policy).

The reference is the ``ref_log_probs`` keyword when given (``ref_logits`` for the full
form), else ``targets``. Two input forms:

- sampled-token log-probs (``estimator`` "k1", "k2" or "k3"): ``predictions`` are the
  policy's log-probs of the tokens actually sampled and ``targets`` the reference's.
  k3, ``(r - 1) - log r`` with ``r = p_ref / p``, is unbiased for KL(policy || ref) and
  never negative, which is why it is the default;
- full distributions (``estimator="full"``): ``predictions`` and ``targets`` are logits
  over the vocabulary and the exact KL(policy || ref) is summed over the last axis,
  after dividing by ``config.temperature``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from alignflow.losses.custom_loss import CustomLoss, CustomLossConfig, masked_reduce

ESTIMATORS = ("k1", "k2", "k3", "full")


def kl_from_logprobs(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str = "k3"):
    """Per-token KL(policy || ref) estimate from the sampled tokens' log-probs."""
    log_ratio = log_probs - ref_log_probs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {ESTIMATORS[:3]}")


def kl_from_logits(logits: torch.Tensor, ref_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Exact KL(softmax(logits) || softmax(ref_logits)) at every position."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    logq = F.log_softmax(ref_logits.float() / temperature, dim=-1)
    return (logp.exp() * (logp - logq)).sum(dim=-1)


class KLDivergenceLoss(CustomLoss):
    """``kl_coef * KL``, with the adaptive coefficient rule of Schulman et al. (2017, sec. 4)."""

    def __init__(
        self,
        config: CustomLossConfig | None = None,
        target_kl: float = 0.01,
        kl_coef: float = 0.1,
        estimator: str = "k3",
    ):
        super().__init__(config or CustomLossConfig(name="kl"))
        if estimator not in ESTIMATORS:
            raise ValueError(f"KLDivergenceLoss.estimator must be one of {ESTIMATORS}, got {estimator!r}")
        self.target_kl = target_kl
        self.kl_coef = kl_coef
        self.estimator = estimator

    def compute_loss(self, predictions, targets=None, mask=None, **kwargs):
        # inside a composite the positional targets are the behaviour policy's log-probs (what
        # PPO's ratio needs); a KL penalty is against the reference, which comes by keyword
        reference = kwargs.get("ref_logits" if self.estimator == "full" else "ref_log_probs")
        targets = reference if reference is not None else targets
        if targets is None:
            raise ValueError("KLDivergenceLoss needs the reference: ref_log_probs (or ref_logits) or targets")
        targets = targets.detach()
        if self.estimator == "full":
            kl = kl_from_logits(predictions, targets, self.config.temperature)
        else:
            kl = kl_from_logprobs(predictions, targets, self.estimator)
        self.record(kl=masked_reduce(kl.detach(), mask, "mean"), kl_coef=self.kl_coef)
        return self.kl_coef * kl

    def update(self, observed_kl: float) -> float:
        """Double the coefficient when KL overshoots 1.5x target, halve it below target/1.5."""
        if observed_kl > 1.5 * self.target_kl:
            self.kl_coef *= 2.0
        elif observed_kl < self.target_kl / 1.5:
            self.kl_coef /= 2.0
        return self.kl_coef

    # the adapted coefficient is training state: it travels in state_dict (and so in any
    # checkpoint of a module holding this loss), or a resumed run would restart from the initial one
    def get_extra_state(self) -> dict[str, float]:
        return {"kl_coef": self.kl_coef, "target_kl": self.target_kl}

    def set_extra_state(self, state: dict[str, float]) -> None:
        self.kl_coef = float(state["kl_coef"])
        self.target_kl = float(state["target_kl"])
