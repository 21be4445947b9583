"""KL(policy || reference) estimated from completions sampled from the policy.

With completions y ~ policy, ``log p_policy(y) - log p_ref(y)`` summed over the
completion's tokens is an unbiased estimate of the sequence-level KL; its mean over
prompts is what a PPO/DPO KL budget refers to. Prompt tokens are masked out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from alignflow.losses.functional import logprobs_from_logits
from alignflow.models.decoding import cpu_decoding
from alignflow.models.positions import prompt_token_budget
from alignflow.models.prompting import prompt_batch


@torch.no_grad()
def _token_logprobs(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Log-probs of ``ids[:, 1:]`` with positions counted from each row's first real token."""
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, :-1]
    return logprobs_from_logits(logits, ids[:, 1:])


@torch.no_grad()
def sampled_kl(
    policy: Any,
    reference: Any,
    tokenizer: Any,
    prompts: Sequence[Any],
    max_new_tokens: int = 16,
    batch_size: int = 32,
    seed: int = 0,
) -> float:
    """Sample one completion per prompt from ``policy`` and average the summed log-ratio.

    Works on the sampled token ids themselves: decoding and re-tokenising a sample would
    score a different sequence than the one drawn. Sampling is plain (temperature 1, no
    top-k/top-p) so that the samples come from the policy the KL is about. ``reference``
    shares ``tokenizer`` with the policy.
    """
    if not prompts:
        raise ValueError("sampled_kl needs at least one prompt")
    torch.manual_seed(seed)
    policy.eval()
    reference.eval()
    device = next(policy.parameters()).device
    budget = prompt_token_budget(tokenizer, max_new_tokens, policy, reference)
    totals: list[float] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompt_batch(tokenizer, prompts[start : start + batch_size], budget).to(device)
        with cpu_decoding(policy):
            ids = policy.generate(
                **batch,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        width = batch["input_ids"].shape[1]
        generated = ids[:, width:]
        is_eos = (generated == tokenizer.eos_token_id).int()
        # keep tokens up to and including the first eos
        keep = (is_eos.cumsum(-1) - is_eos) == 0
        mask = torch.cat([batch["attention_mask"], keep.long()], dim=1)
        ratio = _token_logprobs(policy, ids, mask) - _token_logprobs(reference, ids, mask)
        completion_mask = torch.zeros_like(mask[:, 1:])
        completion_mask[:, width - 1 :] = keep.long()
        totals.extend((ratio * completion_mask).sum(-1).tolist())
    return sum(totals) / len(totals)
