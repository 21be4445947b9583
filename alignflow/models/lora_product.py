"""A LoRA layer over half-precision weights computed as one product, base and adapter together.

PEFT computes ``base(x) + lora_B(lora_A(x)) * scaling``: after the base product and the
adapter's two thin ones come a scale and an add over a tensor as wide as the layer's
output, and in the backward a scale of the incoming gradient and the sum of the input's two
gradients, each one more pass over memory. On 2 CPU cores those passes, not the products,
were the adapter's cost (SmolLM2's seven adapted layers of a block, 16 x 112 tokens, bf16,
Zen 5: forward + backward 63 ms through PEFT, 37 ms here). Here the adapter's share is
accumulated into the base product's output (``addmm_``: one rounding instead of two), the
scaling rides on the [tokens, r] factor, and the backward adds the adapter's input gradient
into the base's the same way. The adapter's weights keep their dtype (fp32 under PEFT's
``autocast_adapter_dtype``) and receive gradients in it; they are cast to the input's dtype
for the product, as autocast would.
"""

from __future__ import annotations

from typing import Any

import torch
from peft.tuners.lora import Linear as LoraLinear

HALF = (torch.bfloat16, torch.float16)


class LoraProduct(torch.autograd.Function):
    """``x W^T + b + scaling * (x A^T) B^T`` in ``x``'s dtype; gradients for ``x``, ``A`` and ``B``
    (the base weight and bias are frozen)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scaling: float,
    ) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        a, b = lora_a.to(x.dtype), lora_b.to(x.dtype)
        low = rows @ a.t()
        out = rows @ weight.t() if bias is None else torch.addmm(bias, rows, weight.t())
        out.addmm_(low, b.t(), alpha=scaling)
        ctx.save_for_backward(rows, low, weight, a, b)
        ctx.scaling = scaling
        ctx.adapter_dtypes = (lora_a.dtype, lora_b.dtype)
        ctx.input_shape = x.shape
        return out.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        rows, low, weight, a, b = ctx.saved_tensors
        grad_rows = grad.reshape(-1, grad.shape[-1])
        grad_low = (grad_rows @ b).mul_(ctx.scaling)
        grad_x = grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = (grad_rows @ weight).addmm_(grad_low, a).view(ctx.input_shape)
        if ctx.needs_input_grad[3]:
            grad_a = (grad_low.t() @ rows).to(ctx.adapter_dtypes[0])
        if ctx.needs_input_grad[4]:
            grad_b = (grad_rows.t() @ low).mul_(ctx.scaling).to(ctx.adapter_dtypes[1])
        return grad_x, None, None, grad_a, grad_b, None


def _no_dropout(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Identity) or (
        isinstance(module, torch.nn.Dropout) and (module.p == 0 or not module.training)
    )


class ProductLoraLinear(LoraLinear):
    """PEFT's LoRA ``Linear`` whose plain case (one vanilla adapter without dropout, active and
    unmerged, over a frozen half-precision ``nn.Linear``, no autocast) runs as
    :class:`LoraProduct`; every other case takes PEFT's own forward."""

    def fused_adapter(self, x: torch.Tensor) -> str | None:
        """The adapter this call can fuse, or None where PEFT's path must run."""
        if self.disable_adapters or self.merged or x.dtype not in HALF:
            return None
        if torch.is_autocast_enabled(x.device.type):
            return None
        active = [name for name in self.active_adapters if name in self.lora_A]
        if len(active) != 1 or active[0] in self.lora_variant:
            return None
        name = active[0]
        base = self.get_base_layer()
        frozen = not base.weight.requires_grad and (base.bias is None or not base.bias.requires_grad)
        plain = type(base) is torch.nn.Linear and base.weight.dtype == x.dtype and frozen
        no_bias = self.lora_A[name].bias is None and self.lora_B[name].bias is None
        return name if plain and no_bias and _no_dropout(self.lora_dropout[name]) else None

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        name = None if args or kwargs else self.fused_adapter(x)
        if name is None:
            return super().forward(x, *args, **kwargs)
        base = self.get_base_layer()
        a, b = self.lora_A[name].weight, self.lora_B[name].weight
        return LoraProduct.apply(x, base.weight, base.bias, a, b, float(self.scaling[name]))


def use_lora_products(module: torch.nn.Module) -> None:
    """Make a PEFT LoRA ``Linear`` a :class:`ProductLoraLinear` (its forward decides per call).
    Other LoRA layer types (quantised, convolutions) stay as they are."""
    if type(module) is LoraLinear:
        module.__class__ = ProductLoraLinear
