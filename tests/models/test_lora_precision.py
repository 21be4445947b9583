"""LoRA adapters over bf16 weights compute in bf16 on a CPU, keep fp32 weights and gradients,
agree with PEFT's fp32 adapter path to bf16 precision, and still learn."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from alignflow.models.lora_precision import InputDtypeLinear, compute_adapters_in_base_dtype


def _lora_lm(dtype: torch.dtype, seed: int = 0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    model = LlamaForCausalLM._from_config(config, dtype=dtype)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0))
    for name, p in peft.named_parameters():
        if "lora_B" in name:  # PEFT starts B at zero: give the adapters something to say
            torch.nn.init.normal_(p, std=0.05)
    return peft


def _output_dtypes(model, suffix: str) -> set[torch.dtype]:
    """The dtypes of what the modules whose names end with ``suffix`` returned in one forward."""
    seen: set[torch.dtype] = set()
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
        for name, m in model.named_modules()
        if name.endswith(suffix)
    ]
    model(input_ids=torch.tensor([[1, 2, 3, 4]]))
    for hook in hooks:
        hook.remove()
    return seen


def test_adapters_over_bf16_weights_compute_in_bf16_with_fp32_weights():
    model = _lora_lm(torch.bfloat16)
    assert _output_dtypes(model, "lora_A.default") == {torch.float32}  # PEFT's own path
    layers = compute_adapters_in_base_dtype(model)
    assert layers == 2 * 7  # every adapted linear layer of both blocks
    # the plain case runs base and adapter as one bf16 product (alignflow.models.lora_product)
    assert _output_dtypes(model, "mlp.up_proj") == {torch.bfloat16}
    assert _output_dtypes(model, "lora_A.default") == set()
    # where PEFT's path runs (dropout while training), the adapters' products are bf16 too
    for name, module in model.named_modules():
        if name.endswith("lora_dropout"):
            module["default"] = torch.nn.Dropout(0.1)
    model.train()
    assert _output_dtypes(model, "lora_A.default") == {torch.bfloat16}
    adapters = [p for name, p in model.named_parameters() if "lora_" in name]
    assert all(p.dtype == torch.float32 for p in adapters)
    assert compute_adapters_in_base_dtype(model) == layers  # a second call changes nothing


def test_the_outputs_and_gradients_agree_with_peft_to_bf16_precision():
    ids = torch.randint(0, 64, (4, 12), generator=torch.Generator().manual_seed(1))
    results = []
    for switch in (False, True):
        model = _lora_lm(torch.bfloat16)
        if switch:
            compute_adapters_in_base_dtype(model)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.item(), grads))
    (loss_peft, grads_peft), (loss_ours, grads_ours) = results
    assert loss_ours == pytest.approx(loss_peft, rel=1e-2)
    assert grads_ours.keys() == grads_peft.keys() and grads_ours
    for name, grad in grads_ours.items():
        assert grad.dtype == torch.float32
        error = (grad - grads_peft[name]).norm() / grads_peft[name].norm()
        assert error < 0.1, name


def test_training_through_the_bf16_adapters_lowers_the_loss():
    model = _lora_lm(torch.bfloat16)
    compute_adapters_in_base_dtype(model)
    ids = torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(2))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(20):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.2


def test_full_precision_bases_and_other_devices_keep_peft_s_path():
    model = _lora_lm(torch.float32)
    assert compute_adapters_in_base_dtype(model) == 0
    assert not any(isinstance(m, InputDtypeLinear) for m in model.modules())
    with torch.device("meta"):
        meta = _lora_lm(torch.bfloat16)
    assert compute_adapters_in_base_dtype(meta) == 0
