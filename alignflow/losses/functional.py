"""Tensor math shared by every RL loss and trainer: log-probs, entropy, whitening, masked stats.

TRL 1.x removed ``trl.core``; these are the project's own versions, tested against
torch's direct computations so that losses built on them can be trusted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Log-probability of each label under ``logits`` (shape ``labels.shape``)."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return torch.gather(logp, -1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution at each position."""
    logits = logits.float()
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def masked_mean(
    values: torch.Tensor, mask: torch.Tensor | None = None, dim: int | None = None
) -> torch.Tensor:
    if mask is None:
        return values.mean() if dim is None else values.mean(dim=dim)
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp_min(1.0)
    return (values * mask).sum(dim=dim) / mask.sum(dim=dim).clamp_min(1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor | None = None, unbiased: bool = True) -> torch.Tensor:
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = values.numel() if mask is None else mask.sum()
        count = torch.as_tensor(count, dtype=values.dtype)
        var = var * count / (count - 1).clamp_min(1.0)
    return var


def whiten(
    values: torch.Tensor, mask: torch.Tensor | None = None, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise to unit variance (and zero mean unless ``shift_mean`` is False)."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    return whitened if shift_mean else whitened + mean


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    return_logits: bool = False,
):
    """Per-token log-probs of ``input_ids[:, 1:]`` under a causal LM (shape ``[B, T-1]``)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    logprobs = logprobs_from_logits(logits, input_ids[:, 1:])
    return (logprobs, logits) if return_logits else logprobs
