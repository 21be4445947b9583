"""GRPO with LoRA samples (training and held-out) from the merged copy, refreshed before each
use, prefills each prompt of a generation group once, and tags the faster paths it took."""

from __future__ import annotations

import re

import pytest

from alignflow.models import fixed_cache_decoding, shared_prefill
from alignflow.models.merged_copy import MergedCopy
from alignflow.training.grpo_config import GRPOConfig


@pytest.mark.parametrize("merged", [True, False])
def test_a_lora_policy_samples_from_its_merged_copy_when_asked(
    merged, sft_result, demo_snapshot, demo_config, tmp_path, monkeypatch, stage_tags
):
    from alignflow.training.grpo import run_grpo

    refreshed = []
    real_refresh = MergedCopy.refresh
    monkeypatch.setattr(MergedCopy, "refresh", lambda self, m: refreshed.append(1) or real_refresh(self, m))
    prefilled = []
    real_prefill = fixed_cache_decoding.prefill_rows

    def counted_prefill(model, ids, mask):
        cache, rows, logits = real_prefill(model, ids, mask)
        prefilled.append((len(ids), cache.layers[0].keys.shape[0]))
        return cache, rows, logits

    monkeypatch.setattr(fixed_cache_decoding, "prefill_rows", counted_prefill)
    shared = []
    real_shared_prefill = shared_prefill.prefill
    monkeypatch.setattr(
        shared_prefill,
        "prefill",
        lambda m, ids, mask: shared.append(len(ids)) or real_shared_prefill(m, ids, mask),
    )
    config = demo_config(
        "model.lora.enabled=true",
        "grpo.max_steps=3",
        "grpo.save_steps=1000",
        "grpo.eval_max_rows=1",
        f"grpo.merged_generation={str(merged).lower()}",
    )
    result = run_grpo(config, demo_snapshot, tmp_path, model_path=sft_result.model_dir)
    assert result.metrics["global_step"] == 3
    # one generation per step at these settings, and the held-out reward before and after
    assert len(refreshed) == (3 + 2 if merged else 0)
    # 16 rows a generation, 4 prompts x 4 completions, sampled through the fixed cache: each
    # prompt read once; the held-out reward's one row before and after training decodes so too.
    # The PEFT model itself samples through generate, each prompt prefilled once
    grpo = config.section_as("grpo", GRPOConfig)
    group = (grpo.per_device_train_batch_size, grpo.per_device_train_batch_size // grpo.num_generations)
    if merged:
        assert prefilled == [(1, 1), group, group, group, (1, 1)] and not shared
    else:
        assert shared == [group[1]] * 3 and not prefilled
    assert "eval/reward" in result.metrics and "eval/before_reward" in result.metrics
    # the run says which faster paths it took: the frozen head of a LoRA policy scored the labels
    assert stage_tags["compute.label_head"].startswith("on (")
    # and computed each group's prompt once for its four completions (tags: forwards, tokens)
    computed, tokens = map(
        int, re.search(r"(\d+) of (\d+) tokens computed", stage_tags["compute.packed_rows"]).groups()
    )
    assert computed < tokens
    assert stage_tags["compute.half_precision_adapters"] == "0"
    assert stage_tags["compute.attention"] == "cpu matmuls"
