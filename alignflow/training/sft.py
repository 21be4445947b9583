"""Supervised fine-tuning (TRL SFTTrainer): teaches a from-scratch policy the task and format.

Each training row is ``format_prompt(prompt)`` followed by the preferred response, so the
policy learns the same prompt rendering that DPO, GRPO, PPO and evaluation use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig as TRLSFTConfig
from trl import SFTTrainer

from alignflow.data.halves import rows_for
from alignflow.data.pairing import best_responses, require_rows
from alignflow.data.snapshot import load_split
from alignflow.models.factory import model_init_kwargs, peft_config
from alignflow.models.prompting import completion_text, format_prompt
from alignflow.registry.trainer_callback import TrackingCallback
from alignflow.training.checkpoints import StageTrainerMixin
from alignflow.training.logprob_head import LabelHeadMixin
from alignflow.training.run_settings import RunSettings
from alignflow.training.sft_config import SFTConfig
from alignflow.training.stage import (
    StageResult,
    begin_stage,
    filter_known_args,
    require_length_fits,
    resolve_start_model,
    train_and_finish,
    trainer_arguments,
)


class AlignflowSFTTrainer(StageTrainerMixin, LabelHeadMixin, SFTTrainer):
    """TRL's SFTTrainer with atomic checkpoints."""


def sft_examples(data_dir: str | Path, split: str, min_score: float) -> list[dict[str, Any]]:
    """What SFT imitates: each pair's chosen response, scored responses >= ``min_score`` and
    the top-ranked responses of ranked rows."""
    try:
        pairs = load_split(data_dir, split, kind="pair")
        scored = load_split(data_dir, split, kind="scored")
        ranked = load_split(data_dir, split, kind="ranked")
    except FileNotFoundError:
        if split == "train":
            raise
        return []
    rows = [{"prompt": r["prompt"], "completion": r["chosen"]} for r in pairs]
    good = [r for r in scored if r["score"] >= min_score]
    rows += [{"prompt": r["prompt"], "completion": r["completion"]} for r in good]
    rows += [{"prompt": r["prompt"], "completion": best} for r in ranked for best in best_responses(r)]
    return rows


def to_text_dataset(rows: list[dict[str, Any]], tokenizer: Any) -> Dataset:
    """Prompt-completion rows rendered as the policy sees them."""
    return Dataset.from_list(
        [
            {"prompt": format_prompt(tokenizer, r["prompt"]), "completion": completion_text(r["completion"])}
            for r in rows
        ]
    )


def run_sft(
    config: RunSettings, data_dir: str | Path, output_dir: str | Path, model_path: str | Path | None = None
) -> StageResult:
    """Train a policy on the preferred responses; returns eval loss before and after."""
    stage = config.section_as("sft", SFTConfig)
    seed, output_dir = begin_stage(stage, config.seed, output_dir)
    train_rows = rows_for(
        sft_examples(data_dir, "train", stage.min_score), config.policy.reward_data, "policy"
    )
    require_rows(train_rows, data_dir, "train", "pair/scored/ranked")
    eval_rows = sft_examples(data_dir, "eval", stage.min_score)[: stage.eval_max_rows or None]

    start = resolve_start_model(config.model, load_split(data_dir, "train"), output_dir, model_path)
    tokenizer = AutoTokenizer.from_pretrained(start)
    model = AutoModelForCausalLM.from_pretrained(start, **model_init_kwargs(config.model))
    require_length_fits(model, tokenizer, stage.max_length, "sft.max_length", start)
    train_ds, eval_ds = to_text_dataset(train_rows, tokenizer), to_text_dataset(eval_rows, tokenizer)

    kwargs = trainer_arguments(stage, output_dir, config.model, seed, has_eval=bool(eval_rows))
    kwargs.update(
        max_length=stage.max_length,
        completion_only_loss=stage.completion_only_loss,
        packing=stage.packing,
        dataset_num_proc=None,
    )
    trainer = AlignflowSFTTrainer(
        model=model,
        args=TRLSFTConfig(**filter_known_args(TRLSFTConfig, kwargs)),
        train_dataset=train_ds,
        eval_dataset=eval_ds if eval_rows else None,
        processing_class=tokenizer,
        peft_config=peft_config(config.model),
        callbacks=[TrackingCallback({"sft": stage.model_dump(), "model": config.model.model_dump()})],
    )
    return train_and_finish("sft", trainer, output_dir, stage.resume)
