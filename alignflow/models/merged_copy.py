"""A plain copy of a LoRA policy with its adapters folded in, for sampling.

Sampling through PEFT's LoRA layers pays, per linear layer and per decoded token, two extra
small matmuls and the casts of the activations to the adapters' fp32 and back. A copy whose
weights already hold ``W + scale * B @ A`` decodes at the base model's speed (SmolLM2-135M,
bf16, 32 completions x 48 tokens on 2 Zen 5 cores: 10.3 s through the adapters, 6.4 s
merged). The copy costs one more set of base weights in memory; refreshing it after an
optimiser step costs one ``B @ A`` per adapted layer, nothing against a decode.

PEFT's own ``merge_adapter`` / ``unmerge_adapter`` would do it in place, but in bf16 the
round trip leaves rounding error in the frozen base weights that accumulates step by step.
A bf16 copy on a CPU keeps its linear layers' weights in oneDNN's layout
(:mod:`alignflow.models.packed_linear`), laid out again at each refresh.

A bf16 layer's fold is one ``addmm`` in bf16 (the adapters rounded to bf16, the product
summed in fp32 and rounded once): PEFT's delta in fp32, widened, added and narrowed again
took ~0.12 s of the 0.19 s refresh in SmolLM2's GRPO bench (210 layers, an AMX Xeon, 2 cores),
the addmm 0.04. Its weights differ from the fp32 fold by one bf16 step in ~1% of entries,
far below what rounding the policy to bf16 for sampling moves already.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from alignflow.models.packed_linear import PackedLinear, pack_linears

PEFT_PREFIX = "base_model.model."


def lora_layers(model: Any) -> dict[str, Any]:
    """The model's LoRA-wrapped layers by their name in the unwrapped model."""
    from peft.tuners.lora import LoraLayer

    return {
        name.removeprefix(PEFT_PREFIX): module
        for name, module in model.named_modules()
        if isinstance(module, LoraLayer) and hasattr(module, "get_delta_weight")
    }


def only_adapters_train(model: Any) -> bool:
    """Whether every trainable parameter belongs to a LoRA adapter: then the merged weights
    are the whole difference from the base (no ``modules_to_save``, no trained bias or head)."""
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    return bool(trainable) and all(".lora_A." in name or ".lora_B." in name for name in trainable)


def can_merge(model: Any) -> bool:
    """A PEFT model with plain LoRA adapters only (no DoRA, no other trained parameter)."""
    if not hasattr(model, "peft_config") or not only_adapters_train(model):
        return False
    layers = lora_layers(model).values()
    return bool(layers) and not any(getattr(m, "use_dora", {}).get(m.active_adapters[0]) for m in layers)


def foldable_adapters(model: Any) -> bool:
    """Whether a loaded PEFT model's adapters fold exactly into its weights with PEFT's
    ``merge_and_unload``: LoRA of any flavour (DoRA and trained whole modules included) over
    a base that is not quantised. Unlike :func:`can_merge` this asks nothing of training: a
    loaded adapter trains nothing, and a one-time fold need not be refreshed."""
    configs = getattr(model, "peft_config", None) or {}
    quantised = any(getattr(model, f"is_loaded_in_{bits}bit", False) for bits in (4, 8))
    return (
        bool(configs)
        and not quantised
        and all(getattr(c, "peft_type", None) == "LORA" for c in configs.values())  # a str enum
    )


def drop_patched_forwards(model: Any) -> int:
    """Give every module of ``model`` its class's ``forward`` back; how many were patched.

    A trainer patches the policy's forward in place (TRL's fused log-prob head, alignflow's
    label head), as a closure over the policy's own forward: a deep copy keeps the closure, so
    the copy's forward ran the policy's modules, LoRA layers and all, and sampling from the
    copy never used its merged weights. Sampling needs only the plain forward."""
    patched = [module for module in model.modules() if "forward" in vars(module)]
    for module in patched:
        del module.forward
    return len(patched)


def folded_weight(layer: Any, adapter: str) -> torch.Tensor:
    """``W + scale * B @ A`` of a LoRA layer, in ``W``'s dtype: one bf16 ``addmm`` for a plain
    bf16 linear layer, else PEFT's delta added in fp32."""
    base = layer.get_base_layer().weight
    a, b = layer.lora_A[adapter], layer.lora_B[adapter]
    plain = isinstance(a, torch.nn.Linear) and isinstance(b, torch.nn.Linear) and not layer.fan_in_fan_out
    if base.dtype == torch.bfloat16 and plain and base.dim() == 2:
        factors = b.weight.to(base.dtype), a.weight.to(base.dtype)
        return torch.addmm(base, *factors, alpha=layer.scaling[adapter])
    return (base.float() + layer.get_delta_weight(adapter).float()).to(base.dtype)


class MergedCopy:
    """``W + delta`` of a LoRA model in a separate plain model; :meth:`refresh` re-folds the
    adapters' current values in, leaving the LoRA model untouched."""

    def __init__(self, peft_model: Any) -> None:
        self.model = copy.deepcopy(peft_model).merge_and_unload()
        drop_patched_forwards(self.model)
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.packed_layers = pack_linears(self.model)

    @torch.no_grad()
    def refresh(self, peft_model: Any) -> Any:
        """Fold the adapters' current weights into the copy; the copy."""
        for name, layer in lora_layers(peft_model).items():
            adapter = layer.active_adapters[0]
            if adapter not in layer.lora_A:
                continue
            merged = folded_weight(layer, adapter)
            target = self.model.get_submodule(name)
            if isinstance(target, PackedLinear):
                target.load_weight(merged)
            else:
                target.weight.copy_(merged)
        return self.model
