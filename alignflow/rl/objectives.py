"""One function for the classic policy-gradient objectives on a causal LM.

``compute_rl_loss`` runs the policy once over prompt+response tokens and turns the
response tokens' log-probs into a loss for one of four objectives, so a research loop
can switch objective by changing a string:

- ``reinforce``: ``-mean(A * logp_seq)`` where ``logp_seq`` is the mean response-token
  log-prob and ``A`` the (whitened) sequence reward;
- ``kl``: the same plus ``kl_coef * mean_t(logp_t - logp_ref_t)`` against a frozen
  reference model;
- ``ppo``: the clipped surrogate on the sequence ratio ``exp(logp_seq - old_logprobs)``;
- ``token``: ``-sum_t(r_t * logp_t) / n_tokens`` with one reward per response token.

``ent_coef > 0`` subtracts ``ent_coef`` times the mean entropy of the policy at the
response positions (the prompt is not the policy's choice, so its entropy is left out).
All math goes through :mod:`alignflow.losses.functional`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from alignflow.losses.functional import entropy_from_logits, logprobs_from_logits, masked_mean, whiten

MODES = ("reinforce", "kl", "ppo", "token")


def _as_float_tensor(name: str, value, device: torch.device) -> torch.Tensor:
    if torch.is_tensor(value):
        return value.detach().to(device=device, dtype=torch.float32)
    if isinstance(value, Sequence) and value and all(torch.is_tensor(v) for v in value):
        return torch.stack([v.detach().reshape(()) for v in value]).to(device=device, dtype=torch.float32)
    try:
        return torch.tensor(value, dtype=torch.float32, device=device)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"compute_rl_loss: {name} must be numbers or a tensor, got {type(value).__name__}"
        ) from exc


def response_mask(
    shape: torch.Size,
    prompt_len: int | Sequence[int] | torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Boolean ``[B, T-1]`` mask of the log-prob positions that score response tokens.

    Log-prob column ``j`` scores token ``j + 1``, so the response (tokens from
    ``prompt_len`` on) starts at column ``prompt_len - 1``. ``prompt_len`` may differ per row.
    """
    batch, width = shape
    starts = torch.as_tensor(prompt_len).reshape(-1).expand(batch) - 1
    if (starts < 0).any() or (starts >= width).any():
        raise ValueError(
            f"compute_rl_loss: prompt_len must be between 1 and {width} (sequence length - 1) "
            f"so that at least one response token follows the prompt; got {prompt_len}"
        )
    columns = torch.arange(width).unsqueeze(0)
    mask = columns >= starts.unsqueeze(1)
    if attention_mask is not None:
        mask = mask & attention_mask[:, 1:].bool().cpu()
    return mask


def _token_rewards(rewards: torch.Tensor, mask: torch.Tensor, prompt_len) -> torch.Tensor:
    """Place ``[B, response_len]`` rewards on the ``[B, T-1]`` log-prob grid (full width accepted too)."""
    if rewards.dim() != 2:
        raise ValueError(
            "compute_rl_loss: mode='token' needs rewards of shape [batch, response_len], "
            f"got {tuple(rewards.shape)}"
        )
    batch, width = mask.shape
    if rewards.shape == (batch, width):
        return rewards
    if not isinstance(prompt_len, int):
        raise ValueError(
            "compute_rl_loss: per-row prompt_len with mode='token' needs full-width [batch, T-1] rewards"
        )
    response_len = width - (prompt_len - 1)
    if rewards.shape != (batch, response_len):
        raise ValueError(
            f"compute_rl_loss: token rewards have shape {tuple(rewards.shape)}, expected "
            f"({batch}, {response_len}) (one per response token) or ({batch}, {width})"
        )
    grid = torch.zeros(batch, width, dtype=rewards.dtype, device=rewards.device)
    grid[:, prompt_len - 1 :] = rewards
    return grid


def compute_rl_loss(
    model,
    enc_input_ids: torch.Tensor,
    prompt_len: int | Sequence[int] | torch.Tensor,
    rewards,
    mode: str = "reinforce",
    ref_model=None,
    old_logprobs=None,
    kl_coef: float = 0.1,
    cliprange: float = 0.2,
    ent_coef: float = 0.0,
    normalize_adv: bool = True,
    attention_mask: torch.Tensor | None = None,
):
    """Return ``(loss, stats)`` for ``mode`` in reinforce | kl | ppo | token.

    ``rewards`` is ``[batch]`` (sequence rewards) or ``[batch, response_len]`` for
    ``token``. With ``normalize_adv`` sequence rewards are whitened over the batch; a
    batch of one has no baseline to subtract, so its raw reward is used.
    ``old_logprobs`` (ppo) are per-sequence mean response log-probs, as returned in
    ``stats["mean_seq_logprob"]`` / by :func:`sequence_response_logprob`.
    """
    if mode not in MODES:
        raise ValueError(f"Unknown mode: {mode!r}; expected one of {MODES}")
    device = enc_input_ids.device
    rewards = _as_float_tensor("rewards", rewards, device)
    logits = model(input_ids=enc_input_ids, attention_mask=attention_mask).logits[:, :-1]
    log_probs = logprobs_from_logits(logits, enc_input_ids[:, 1:])
    mask = response_mask(log_probs.shape, prompt_len, attention_mask).to(device)
    seq_logprob = masked_mean(log_probs, mask, dim=-1)
    stats: dict[str, float] = {"mean_reward": rewards.mean().item()}

    if mode == "token":
        token_rewards = _token_rewards(rewards, mask, prompt_len)
        loss = -(log_probs * token_rewards * mask).sum() / mask.sum()
        stats["mean_resp_logprob"] = seq_logprob.mean().item()
    else:
        if rewards.dim() != 1 or rewards.numel() != enc_input_ids.size(0):
            raise ValueError(
                f"compute_rl_loss: mode={mode!r} needs one reward per sequence "
                f"({enc_input_ids.size(0)}), got shape {tuple(rewards.shape)}"
            )
        adv = whiten(rewards) if normalize_adv and rewards.numel() > 1 else rewards
        stats["mean_seq_logprob"] = seq_logprob.mean().item()
        if mode == "ppo":
            if old_logprobs is None:
                raise ValueError("compute_rl_loss: old_logprobs required for mode='ppo'")
            old = _as_float_tensor("old_logprobs", old_logprobs, device).reshape(-1)
            if old.shape != seq_logprob.shape:
                raise ValueError(
                    f"compute_rl_loss: old_logprobs must have one value per sequence "
                    f"({seq_logprob.numel()}), got shape {tuple(old.shape)}"
                )
            ratio = torch.exp(seq_logprob - old)
            surrogate = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - cliprange, 1 + cliprange))
            loss = surrogate.mean()
            stats["ratio_mean"] = ratio.mean().item()
            stats["clip_fraction"] = ((ratio - 1).abs() > cliprange).float().mean().item()
        else:
            loss = -(adv * seq_logprob).mean()
            if mode == "kl":
                if ref_model is None:
                    raise ValueError("compute_rl_loss: ref_model required for mode='kl'")
                with torch.no_grad():
                    ref_logits = ref_model(input_ids=enc_input_ids, attention_mask=attention_mask).logits[
                        :, :-1
                    ]
                ref_log_probs = logprobs_from_logits(ref_logits, enc_input_ids[:, 1:])
                kl_mean = masked_mean(log_probs - ref_log_probs, mask)
                loss = loss + kl_coef * kl_mean
                stats["kl_mean"] = kl_mean.item()

    if ent_coef > 0.0:
        entropy = masked_mean(entropy_from_logits(logits), mask)
        loss = loss - ent_coef * entropy
        stats["entropy"] = entropy.item()
    stats["loss"] = loss.item()
    return loss, stats


@torch.no_grad()
def sequence_response_logprob(model, enc_input_ids, prompt_len, attention_mask=None) -> torch.Tensor:
    """Mean response-token log-prob per sequence: the ``old_logprobs`` that mode='ppo' expects."""
    logits = model(input_ids=enc_input_ids, attention_mask=attention_mask).logits[:, :-1]
    log_probs = logprobs_from_logits(logits, enc_input_ids[:, 1:])
    mask = response_mask(log_probs.shape, prompt_len, attention_mask).to(enc_input_ids.device)
    return masked_mean(log_probs, mask, dim=-1)
