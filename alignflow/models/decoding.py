"""Faster ``generate`` on a CPU: the same distribution, less time per decoded token.

Profiled on SmolLM2-135M (bf16, 16 sequences, 2 Zen 5 cores), a sampled decoding step took
72 ms, of which ~12 ms went to ``torch.multinomial`` (an exponential draw per vocabulary
entry, 49k per row) and ~15 ms to SDPA's flash kernel, which is slow for one query token.
Drawing from the cumulative distribution (one uniform per row and a binary search) and
plain matmul attention brought the step to 50 ms. Plain attention loses on long prompts,
whose prefill it computes as a full score matrix (16 x 400-token prompts + 40 tokens greedy:
9.1 s against SDPA's 8.8; at 256 tokens 4.6 against 5.3), so it is used up to
``EAGER_PROMPT_TOKENS``. On other devices nothing changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

_TORCH_MULTINOMIAL = torch.multinomial
EAGER_PROMPT_TOKENS = 256  # the widest prompt batch plain attention decodes faster than SDPA


def inverse_cdf_multinomial(
    probs: torch.Tensor,
    num_samples: int,
    replacement: bool = False,
    *,
    generator: torch.Generator | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``torch.multinomial`` for one draw per row of a 2-D CPU tensor, by inverse CDF: the
    same distribution from one uniform number per row. Anything else goes to torch's."""
    if num_samples != 1 or probs.dim() != 2 or out is not None or probs.device.type != "cpu":
        return _TORCH_MULTINOMIAL(probs, num_samples, replacement, generator=generator, out=out)
    cdf = probs.float().cumsum(-1)
    # scaled by each row's total: torch accepts unnormalised weights too
    draws = torch.rand(probs.shape[0], 1, generator=generator, dtype=cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, draws, right=True).clamp_(max=probs.shape[-1] - 1)


@contextlib.contextmanager
def cpu_decoding(model: Any, prompt_tokens: int) -> Iterator[Any]:
    """While generating with ``model`` on a CPU: inverse-CDF sampling, and eager attention
    for prompt batches up to ``EAGER_PROMPT_TOKENS`` wide; both restored on exit. ``model``
    is yielded unchanged elsewhere."""
    parameter = next(model.parameters(), None)
    if parameter is None or parameter.device.type != "cpu":
        yield model
        return
    config = getattr(model, "config", None)
    attention = getattr(config, "_attn_implementation", None)
    switch = (
        attention == "sdpa"
        and prompt_tokens <= EAGER_PROMPT_TOKENS
        and hasattr(model, "set_attn_implementation")
    )
    if switch:
        model.set_attn_implementation("eager")
    torch.multinomial = inverse_cdf_multinomial  # type: ignore[assignment]
    try:
        yield model
    finally:
        torch.multinomial = _TORCH_MULTINOMIAL
        if switch:
            model.set_attn_implementation(attention)
