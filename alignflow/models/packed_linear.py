"""Frozen bf16 linear layers whose weights are laid out for oneDNN once, for sampling on a CPU.

torch sends a bf16 product on a CPU to oneDNN, which reorders the weight into its blocked
layout on every call. Decoding multiplies a few rows by every weight of the model per token,
so that reorder is a large share of each product (SmolLM2-135M on 2 Zen 5 cores, the same
numbers either way: [16, 576] x [576, 1536] 95 -> 70-79 us, one row 72 -> 47 us, the
49k-token head for 16 rows 3.6 -> 1.6 ms). A sampling copy whose weights change only when the
policy's do (:class:`~alignflow.models.merged_copy.MergedCopy`) reorders each weight once per
refresh instead. Inference only: the packed weight has no gradient.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

# the rows oneDNN lays a weight out for: measured on 2 Zen 5 cores, a layout for 16 rows ran
# products of 1 to 1,024 rows at least as fast as torch's own (one for no row count did not, at 292)
LAYOUT_ROWS = 16


@functools.cache
def onednn_bf16() -> bool:
    """Whether oneDNN computes bf16 products on this CPU (it refuses on CPUs without AVX-512 or
    AVX-NE-CONVERT); asked once per process, not once per layer."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def can_pack(layer: Any) -> bool:
    """A plain bf16 ``nn.Linear`` on a CPU whose oneDNN computes in bf16."""
    return (
        type(layer) is torch.nn.Linear
        and layer.weight.dtype == torch.bfloat16
        and layer.weight.device.type == "cpu"
        and onednn_bf16()
    )


class PackedLinear(torch.nn.Module):
    """``nn.Linear`` for frozen bf16 weights kept in oneDNN's layout; :meth:`load_weight` takes
    new values (laid out again)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias, persistent=False)
        self.load_weight(linear.weight.detach())

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor) -> None:
        if weight.shape != (self.out_features, self.in_features):
            layer = f"{self.in_features} -> {self.out_features}"
            raise ValueError(f"weight of shape {tuple(weight.shape)} for a {layer} layer")
        weight = weight.to(torch.bfloat16).contiguous()
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, LAYOUT_ROWS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("PackedLinear computes no gradients: it is for sampling under torch.no_grad()")
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        sizes = f"in_features={self.in_features}, out_features={self.out_features}"
        return f"{sizes}, bias={self.bias is not None}"


def pack_linears(model: torch.nn.Module) -> int:
    """Replace every packable ``nn.Linear`` of ``model`` (the output head too: a separate packed
    copy where it is tied to the embeddings) by a :class:`PackedLinear`; how many were replaced."""
    packed = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, torch.nn.Linear) or not can_pack(child):
                continue
            setattr(parent, name, PackedLinear(child))
            packed += 1
    return packed
