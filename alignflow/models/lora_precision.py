"""LoRA adapters on half-precision weights that compute in half precision, as autocast would.

PEFT keeps a LoRA adapter's weights in fp32 over bf16 base weights (its
``autocast_adapter_dtype``), which is right for the optimiser, and then also computes the
adapter in fp32: every adapted layer casts its input up, runs two small matmuls, widens the
layer's output to fp32 to add the adapter's share and casts the sum back. On a GPU the
trainer's autocast runs those matmuls in bf16; a CPU trainer here runs without autocast, and
on SmolLM2 (2 Zen 5 cores) the casts and fp32 tensors as wide as the layer's output took
over half of GRPO's policy forward. :func:`compute_adapters_in_base_dtype` makes the adapter's
product run in the base layer's dtype with its weights cast on the fly: the weights, their
gradients' destination and the optimiser stay fp32, as under autocast; the layer's output,
bf16 either way, differs by the rounding of the adapter's share. Where a layer is PEFT's plain
``Linear``, the base and adapter products also run as one (:mod:`alignflow.models.lora_product`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from alignflow.models.lora_product import HALF, use_lora_products


class InputDtypeLinear(torch.nn.Linear):
    """A linear layer whose product runs in its input's dtype; its parameters keep theirs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)


def compute_adapters_in_base_dtype(model: Any) -> int:
    """Switch the plain LoRA layers of ``model`` whose base weights are bf16/fp16 on a CPU to
    compute their adapters in that dtype, fused with the base product where PEFT's forward is
    the plain one; how many layers were switched. DoRA and other
    variants, full-precision bases and other devices keep PEFT's path."""
    from peft.tuners.lora import Linear as LoraLinear

    switched = 0
    for module in model.modules():
        if not isinstance(module, LoraLinear) or module.lora_variant:
            continue
        base = module.get_base_layer().weight
        if base.dtype not in HALF or base.device.type != "cpu":
            continue
        adapters = [*module.lora_A.values(), *module.lora_B.values()]
        if not all(type(layer) in (torch.nn.Linear, InputDtypeLinear) for layer in adapters):
            continue
        for layer in adapters:
            layer.__class__ = InputDtypeLinear
        module.cast_input_dtype_enabled = False  # the input stays in the base dtype
        use_lora_products(module)
        switched += 1
    return switched
