"""A stage refuses a max_length beyond its model's table of absolute positions before training.

GPT-2-style policies look each position up in a table (48 rows for the test's tiny GPT-2); a
training row longer than the table crashes mid-run with ``IndexError``. The reward stage
already refused such a ``reward.max_length``; SFT and DPO now do too, with the same helper.
"""

from __future__ import annotations

import re

import pytest

from alignflow.training.dpo import run_dpo
from alignflow.training.sft import run_sft


@pytest.mark.parametrize(
    ("run", "key"),
    [(run_sft, "sft.max_length"), (run_dpo, "dpo.max_length (dpo)")],
)
def test_a_max_length_beyond_the_position_table_is_refused_before_training(
    run, key, demo_config, demo_snapshot, gpt2_policy_dir, tmp_path
):
    stage = key.split(".")[0]
    config = demo_config(f"{stage}.max_length=64", f"{stage}.max_steps=2", f"{stage}.save_steps=1000")
    with pytest.raises(ValueError, match=re.escape(f"{key} 64 exceeds the 48 positions")):
        run(config, demo_snapshot, tmp_path, model_path=str(gpt2_policy_dir))
    assert not (tmp_path / "model").exists() and not list(tmp_path.glob("checkpoints/checkpoint-*"))


def test_a_max_length_within_the_table_trains(demo_config, demo_snapshot, gpt2_policy_dir, tmp_path):
    config = demo_config("sft.max_length=48", "sft.max_steps=2", "sft.save_steps=1000", "sft.eval_max_rows=8")
    result = run_sft(config, demo_snapshot, tmp_path, model_path=str(gpt2_policy_dir))
    assert result.metrics["global_step"] == 2.0 and (tmp_path / "model" / "config.json").exists()
