"""A stage refuses a max_length beyond its model's table of absolute positions before training.

GPT-2-style policies look each position up in a table (48 rows for the test's tiny GPT-2); a
training row longer than the table crashes mid-run with ``IndexError``. The reward stage
already refused such a ``reward.max_length``; SFT and DPO now do too, with the same helper.
"""

from __future__ import annotations

import re

import pytest

from alignflow.training.dpo import run_dpo
from alignflow.training.grpo import run_grpo
from alignflow.training.sft import run_sft


@pytest.mark.parametrize(
    ("run", "key"),
    [(run_sft, "sft.max_length"), (run_dpo, "dpo.max_length")],
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


@pytest.fixture
def long_prompt_snapshot(tmp_path):
    """Prompts of ~60 tokens: past the tiny GPT-2's 48 positions before any completion."""
    from alignflow.data.snapshot import write_split

    context = "Some background that runs on and on before the question. " * 6
    records = [
        {"kind": "prompt", "prompt": f"{context}What is {i} plus 1?", "metadata": {"answer": str(i + 1)}}
        for i in range(16)
    ]
    data_dir = tmp_path / "data"
    write_split(data_dir, "train", records[:12])
    write_split(data_dir, "eval", records[12:])
    return data_dir


def test_grpo_cuts_prompts_to_leave_room_for_the_completion(
    demo_config, long_prompt_snapshot, gpt2_policy_dir, tmp_path
):
    """TRL 1.16's GRPO has no prompt length limit: such prompts crashed the first generation."""
    from transformers import AutoTokenizer

    config = demo_config(
        "grpo.max_steps=2", "grpo.max_completion_length=8", "grpo.save_steps=1000", "grpo.logging_steps=1"
    )
    from alignflow.training.grpo import prompt_rows

    tokenizer = AutoTokenizer.from_pretrained(gpt2_policy_dir)
    rows = prompt_rows(long_prompt_snapshot, "train")
    lengths = [len(tokenizer(r["raw_prompt"])["input_ids"]) for r in rows]
    assert min(lengths) > 48, lengths
    result = run_grpo(config, long_prompt_snapshot, tmp_path / "out", model_path=str(gpt2_policy_dir))
    assert result.metrics["global_step"] == 2.0
    assert result.metrics["prompts_cut"] == 12.0


def test_grpo_refuses_completions_that_fill_the_position_table(
    demo_config, long_prompt_snapshot, gpt2_policy_dir, tmp_path
):
    config = demo_config("grpo.max_steps=2", "grpo.max_completion_length=48", "grpo.save_steps=1000")
    with pytest.raises(ValueError, match="grpo.max_completion_length 48 leaves no room for a prompt in 48"):
        run_grpo(config, long_prompt_snapshot, tmp_path / "out", model_path=str(gpt2_policy_dir))
