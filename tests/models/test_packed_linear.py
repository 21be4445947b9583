"""Linear layers with oneDNN-packed bf16 weights compute what ``nn.Linear`` computes, take new
weights, refuse gradients, and a LoRA policy's merged copy samples through them."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from alignflow.models import packed_linear
from alignflow.models.merged_copy import MergedCopy
from alignflow.models.packed_linear import PackedLinear, onednn_bf16, pack_linears
from tests.models.tiny_llama import left_padded, tiny_lm

needs_onednn_bf16 = pytest.mark.skipif(
    not onednn_bf16(), reason="oneDNN computes no bf16 products on this CPU (no AVX-512 or AVX-NE-CONVERT)"
)


def _linear(bias: bool, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(48, 40, bias=bias).to(torch.bfloat16).requires_grad_(False)


@needs_onednn_bf16
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_packed_products_equal_nn_linear_s_for_any_row_count_and_layout(bias):
    linear = _linear(bias)
    packed = PackedLinear(linear)
    for x in (
        torch.randn(1, 48),
        torch.randn(16, 48),
        torch.randn(300, 48),
        torch.randn(4, 3, 48),
        torch.randn(3, 4, 48).transpose(0, 1),  # not contiguous
    ):
        x = x.bfloat16()
        if bias:  # oneDNN adds the bias before rounding, nn.Linear (3-D input) after: bf16 tolerance
            torch.testing.assert_close(packed(x), linear(x), rtol=1.6e-2, atol=4e-3)
        else:
            assert torch.equal(packed(x), linear(x))


@needs_onednn_bf16
def test_new_weights_are_laid_out_again_and_a_wrong_shape_is_refused():
    packed, other = PackedLinear(_linear(True)), _linear(True, seed=1)
    x = torch.randn(5, 48).bfloat16()
    packed.load_weight(other.weight)
    assert torch.equal(packed(x), torch.nn.functional.linear(x, other.weight, packed.bias))
    with pytest.raises(ValueError, match="40 -> 48|48 -> 40"):
        packed.load_weight(torch.zeros(48, 40))


@needs_onednn_bf16
def test_an_input_that_needs_a_gradient_is_refused():
    packed = PackedLinear(_linear(False))
    x = torch.randn(2, 48).bfloat16().requires_grad_()
    with pytest.raises(RuntimeError, match="no gradients"):
        packed(x)
    with torch.no_grad():
        assert packed(x).shape == (2, 40)


@needs_onednn_bf16
def test_a_bf16_model_packs_every_linear_layer_and_decodes_the_same_tokens():
    model = tiny_lm("sdpa").to(torch.bfloat16)
    batch = left_padded()
    settings = {"do_sample": False, "max_new_tokens": 6, "pad_token_id": 0}
    expected = model.generate(**batch, **settings)
    assert pack_linears(model) == 2 * 7 + 1  # both blocks' seven and the output head
    assert isinstance(model.get_output_embeddings(), PackedLinear)
    assert torch.equal(model.generate(**batch, **settings), expected)


def test_fp32_layers_and_cpus_without_onednn_bf16_keep_nn_linear(monkeypatch):
    assert pack_linears(tiny_lm("sdpa")) == 0  # fp32
    monkeypatch.setattr(packed_linear, "onednn_bf16", lambda: False)
    assert pack_linears(tiny_lm("sdpa").to(torch.bfloat16)) == 0


@needs_onednn_bf16
def test_a_bf16_lora_policy_s_merged_copy_samples_through_packed_layers_and_follows_updates():
    policy = get_peft_model(
        tiny_lm("sdpa").to(torch.bfloat16),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0),
    )

    def move_adapters(seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=generator) * 0.3)

    def logits(model):
        with torch.no_grad():
            return model(**left_padded()).logits.float()

    move_adapters(0)
    copy = MergedCopy(policy)
    assert copy.packed_layers == 2 * 7 + 1
    assert torch.allclose(logits(copy.model), logits(policy), atol=3e-2)
    move_adapters(1)
    assert not torch.allclose(logits(copy.model), logits(policy), atol=3e-2)  # stale until refreshed
    assert torch.allclose(logits(copy.refresh(policy)), logits(policy), atol=3e-2)
