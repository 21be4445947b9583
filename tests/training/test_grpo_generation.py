"""GRPO with LoRA samples (training and held-out) from the merged copy, refreshed before each use."""

from __future__ import annotations

import pytest

from alignflow.models.merged_copy import MergedCopy


@pytest.mark.parametrize("merged", [True, False])
def test_a_lora_policy_samples_from_its_merged_copy_when_asked(
    merged, sft_result, demo_snapshot, demo_config, tmp_path, monkeypatch
):
    from alignflow.training.grpo import run_grpo

    refreshed = []
    real_refresh = MergedCopy.refresh
    monkeypatch.setattr(MergedCopy, "refresh", lambda self, m: refreshed.append(1) or real_refresh(self, m))
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
    assert "eval/reward" in result.metrics and "eval/before_reward" in result.metrics
