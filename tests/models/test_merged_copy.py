"""A LoRA policy's merged copy answers as the policy does, follows its updates, and leaves it
alone; it computes with its own weights even where a trainer patched the policy's forward."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from trl.trainer.utils import add_fused_lm_head

from alignflow.models import load_causal_lm
from alignflow.models.merged_copy import MergedCopy, can_merge, folded_weight, lora_layers


def lora_policy(model_dir, fused_head: bool = False, **lora):
    model, tokenizer = load_causal_lm(model_dir)
    if fused_head:  # as TRL's trainers patch the model before wrapping it with PEFT
        add_fused_lm_head(model)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM", **lora)
    policy = get_peft_model(model, config)
    move_adapters(policy, seed=0)
    return policy, tokenizer


@torch.no_grad()
def move_adapters(policy, seed: int) -> None:
    """What an optimiser step does: every adapter matrix takes new values (B starts at zero)."""
    generator = torch.Generator().manual_seed(seed)
    for name, p in policy.named_parameters():
        if "lora_" in name:
            p.copy_(torch.randn(p.shape, generator=generator) * 0.2)


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("fused_head", [False, True], ids=["plain", "trl-patched-forward"])
def test_the_copy_gives_the_policys_logits_and_follows_each_update(tiny_model_dir, fused_head):
    """With TRL's fused head patched onto the policy, a copied forward would still run the
    policy's own modules (the patch closes over them): the copy drops it."""
    policy, tokenizer = lora_policy(tiny_model_dir, fused_head)
    ids = tokenizer(["What is 3 plus 4? The answer is 7."], return_tensors="pt").input_ids
    base = {n: p.clone() for n, p in policy.named_parameters() if "lora_" not in n}
    copy = MergedCopy(policy)
    assert torch.allclose(logits(copy.model, ids), logits(policy, ids), atol=1e-4)

    move_adapters(policy, seed=1)
    stale = logits(copy.model, ids)
    assert not torch.allclose(stale, logits(policy, ids), atol=1e-2)  # the update is visible
    assert torch.allclose(logits(copy.refresh(policy), ids), logits(policy, ids), atol=1e-4)
    assert all(torch.equal(p, base[n]) for n, p in policy.named_parameters() if "lora_" not in n)
    assert not any(p.requires_grad for p in copy.model.parameters())

    ran = []
    for module in policy.modules():
        module.register_forward_pre_hook(lambda *_: ran.append(1))
    copy.model.generate(ids, max_new_tokens=3, do_sample=False)
    assert not ran, "sampling from the copy ran the policy's modules"


def test_only_plain_adapters_are_merged(tiny_model_dir):
    model, _ = load_causal_lm(tiny_model_dir)
    assert not can_merge(model)  # no adapters at all
    assert can_merge(lora_policy(tiny_model_dir)[0])
    # a trained head beside the adapters is not in the merged weights: sampling would ignore it
    assert not can_merge(lora_policy(tiny_model_dir, modules_to_save=["lm_head"])[0])


FLAVOURS = {"lora": {}, "dora": {"use_dora": True}, "trained-head": {"modules_to_save": ["lm_head"]}}


@pytest.mark.parametrize("flavour", FLAVOURS.values(), ids=FLAVOURS.keys())
def test_a_saved_adapter_loads_folded_into_a_plain_model_alike(tiny_model_dir, tmp_path, flavour):
    """``merge_lora`` gives a plain model (no PEFT layers left to slow decoding) whose logits
    are the adapter's, for each flavour of LoRA a stage saves; without it the adapter stays."""
    policy, tokenizer = lora_policy(tiny_model_dir, **flavour)
    if "modules_to_save" in flavour:  # the trained copy of the head differs from the base's
        with torch.no_grad():
            policy.base_model.model.lm_head.modules_to_save["default"].weight.mul_(1.5)
    policy.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    ids = tokenizer(["What is 3 plus 4? The answer is 7."], return_tensors="pt").input_ids

    as_adapter, _ = load_causal_lm(tmp_path)
    folded, _ = load_causal_lm(tmp_path, merge_lora=True)
    assert hasattr(as_adapter, "peft_config")
    assert not hasattr(folded, "peft_config")
    assert not any("lora_" in name for name, _ in folded.named_parameters())
    assert torch.allclose(logits(folded, ids), logits(as_adapter, ids), atol=1e-4)
    assert not torch.allclose(logits(folded, ids), logits(load_causal_lm(tiny_model_dir)[0], ids), atol=1e-2)


def test_a_bf16_layer_folds_within_rounding_of_the_fp32_fold(tiny_model_dir):
    """A bf16 base with fp32 adapters (as the stages train them): the fold rounds the adapters
    to bf16 before its product, so each weight lies within one bf16 step of the fp32 fold plus
    the adapters' own rounding (half a step of each factor), and an update still shows."""
    policy, _ = lora_policy(tiny_model_dir)
    for name, p in policy.named_parameters():
        p.data = p.data.float() if "lora_" in name else p.data.to(torch.bfloat16)
    layer = next(iter(lora_layers(policy).values()))
    base = layer.get_base_layer().weight
    delta = layer.scaling["default"] * layer.lora_B["default"].weight @ layer.lora_A["default"].weight
    exact = base.float() + delta
    folded = folded_weight(layer, "default")
    assert folded.dtype == torch.bfloat16 and not torch.equal(folded, base)
    eps = torch.finfo(torch.bfloat16).eps
    factors = layer.lora_B["default"].weight.abs() @ layer.lora_A["default"].weight.abs()
    bound = eps * exact.abs() + eps * layer.scaling["default"] * factors
    assert ((folded.float() - exact).abs() <= bound).all()
    move_adapters(policy, seed=3)
    assert not torch.equal(folded_weight(layer, "default"), folded)
