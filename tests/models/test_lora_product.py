"""The fused LoRA product gives PEFT's layer output and the gradients of x, A and B to bf16
precision, closer to fp32 than PEFT's own bf16 path; PEFT's layers take it only in the
plain case (one active, unmerged, vanilla adapter without dropout)."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from alignflow.models import lora_product
from alignflow.models.lora_precision import compute_adapters_in_base_dtype
from alignflow.models.lora_product import LoraProduct, ProductLoraLinear

SCALING = 2.0


def _factors(seed: int = 0, bias: bool = True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 10, 48, generator=g).bfloat16()
    weight = (torch.randn(40, 48, generator=g) * 0.2).bfloat16()
    b = (torch.randn(40, generator=g) * 0.2).bfloat16() if bias else None
    lora_a = torch.randn(4, 48, generator=g) * 0.2
    lora_b = torch.randn(40, 4, generator=g) * 0.2
    return x, weight, b, lora_a, lora_b


def _run(fn, x, weight, bias, lora_a, lora_b):
    """Output and the gradients of x, A and B for a fixed upstream gradient."""
    x, a, b = (t.detach().clone().requires_grad_() for t in (x, lora_a, lora_b))
    out = fn(x, weight, bias, a, b)
    upstream = torch.linspace(-1, 1, out.numel()).view(out.shape)
    out.backward(upstream.to(out.dtype))
    return [t.float() for t in (out, x.grad, a.grad, b.grad)]


def _fused(x, weight, bias, a, b):
    return LoraProduct.apply(x, weight, bias, a, b, SCALING)


def _peft_bf16(x, weight, bias, a, b):  # PEFT's path with its adapters computing in bf16
    linear = torch.nn.functional.linear
    return linear(x, weight, bias) + linear(linear(x, a.bfloat16()), b.bfloat16()) * SCALING


def _fp32(x, weight, bias, a, b):
    out = torch.nn.functional.linear(x.float(), weight.float(), None if bias is None else bias.float())
    return out + (x.float() @ a.t() @ b.t()) * SCALING


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_output_and_gradients_match_fp32_at_least_as_well_as_peft(bias):
    factors = _factors(bias=bias)
    truth = _run(_fp32, *factors)
    fused = _run(_fused, *factors)
    peft = _run(_peft_bf16, *factors)
    for name, got, ref, want in zip(("out", "x", "A", "B"), fused, peft, truth, strict=True):
        assert _relative(got, want) < 1e-2, name
        assert _relative(got, want) <= _relative(ref, want) * 1.05 + 1e-4, name
    assert fused[2].dtype == fused[3].dtype == torch.float32


def test_adapter_gradients_keep_the_adapters_dtype_and_no_input_gradient_is_made_unasked():
    x, weight, bias, lora_a, lora_b = _factors()
    a, b = lora_a.requires_grad_(), lora_b.bfloat16().requires_grad_()
    LoraProduct.apply(x, weight, bias, a, b, SCALING).float().sum().backward()
    assert a.grad.dtype == torch.float32 and b.grad.dtype == torch.bfloat16
    assert x.grad is None


def _lora_lm(dropout: float = 0.0):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=dropout)
    peft = get_peft_model(model, lora)
    for name, p in peft.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    compute_adapters_in_base_dtype(peft)
    return peft


@pytest.fixture
def products(monkeypatch):
    """How many times the fused product ran."""
    calls = []

    def counted(*args):
        calls.append(1)
        return original(*args)

    original = LoraProduct.apply
    monkeypatch.setattr(lora_product.LoraProduct, "apply", counted)
    return calls


IDS = torch.tensor([[1, 2, 3, 4, 5, 6]])


def test_the_plain_case_takes_the_product_and_the_others_peft_s_path(products):
    model = _lora_lm()
    assert sum(isinstance(m, ProductLoraLinear) for m in model.modules()) == 2 * 7
    with_adapters = model(input_ids=IDS).logits
    assert len(products) == 2 * 7

    with model.disable_adapter():
        without = model(input_ids=IDS).logits
    assert len(products) == 2 * 7
    base = model.get_base_model()
    for module in model.modules():
        if isinstance(module, ProductLoraLinear):
            module.merge()
    merged = base(input_ids=IDS).logits
    assert len(products) == 2 * 7  # a merged layer is its base layer
    assert not torch.allclose(with_adapters, without, atol=1e-2)  # the adapters said something
    assert torch.allclose(merged.float(), with_adapters.float(), atol=5e-2)


def test_dropout_while_training_keeps_peft_s_path_and_evaluation_fuses(products):
    model = _lora_lm(dropout=0.1)
    model.train()
    model(input_ids=IDS)
    assert products == []
    model.eval()
    model(input_ids=IDS)
    assert len(products) == 2 * 7
