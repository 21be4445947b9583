"""Fused RMSNorm: the same outputs and gradients, and only for norms it computes the same."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from alignflow.models.fused_norm import fused_equals_own, use_fused_rms_norms
from tests.models.tiny_llama import tiny_lm


def _tiny_llama(dtype: torch.dtype) -> LlamaForCausalLM:
    model = tiny_lm("sdpa").to(dtype)
    for norm in model.modules():  # weights that are not all ones, so a dropped weight shows
        if isinstance(norm, LlamaRMSNorm):
            norm.weight.data.uniform_(0.5, 1.5)
    return model


def _logits_and_grads(model: LlamaForCausalLM, ids: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    logits = model(ids).logits
    logits.float().pow(2).mean().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_norms_keep_outputs_and_gradients(dtype):
    model = _tiny_llama(dtype)
    ids = torch.randint(0, 50, (3, 11))
    before, grads_before = _logits_and_grads(model, ids)
    assert use_fused_rms_norms(model) == 2 * 2 + 1  # two per layer and the final one
    assert all(
        type(m).__name__ == "FusedLlamaRMSNorm" for m in model.modules() if "RMSNorm" in type(m).__name__
    )
    after, grads_after = _logits_and_grads(model, ids)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for a, b in zip(grads_after, grads_before, strict=True):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance)
    assert use_fused_rms_norms(model) == 5  # again: counted, not wrapped twice
    assert "FusedFused" not in {type(m).__name__ for m in model.modules()}


class OffsetRMSNorm(LlamaRMSNorm):
    """A norm that scales by (1 + weight), as Gemma's does: the fused forward would be wrong."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.float().pow(2).mean(-1, keepdim=True)
        normed = hidden_states.float() * torch.rsqrt(variance + self.variance_epsilon)
        return ((1.0 + self.weight.float()) * normed).to(hidden_states.dtype)


def test_a_norm_that_computes_otherwise_keeps_its_own_forward():
    model = torch.nn.Sequential(OffsetRMSNorm(16), LlamaRMSNorm(16))
    assert not fused_equals_own(model[0])
    assert use_fused_rms_norms(model) == 1
    assert type(model[0]) is OffsetRMSNorm
    assert type(model[1]).__name__ == "FusedLlamaRMSNorm"
