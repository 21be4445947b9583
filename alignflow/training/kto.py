"""KTO with TRL: the policy learns from answers labelled desirable or undesirable, no pairs needed.

Each train pair gives its chosen answer as desirable and its rejected one as undesirable; the
snapshot's own ``unpaired`` rows (``prompt``/``completion``/``label``) add single answers. The
policy starts from the SFT model, a saved path from which TRL builds the frozen reference.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datasets import Dataset
from trl import KTOConfig as TRLKTOConfig
from trl import KTOTrainer

from alignflow.data.snapshot import load_split
from alignflow.models.factory import trl_model_init_kwargs
from alignflow.models.prompting import completion_text, format_prompt
from alignflow.training.checkpoints import StageTrainerMixin
from alignflow.training.dpo import policy_pairs, preference_trainer
from alignflow.training.kto_config import KTOConfig
from alignflow.training.logprob_head import LabelHeadMixin
from alignflow.training.run_settings import RunSettings
from alignflow.training.stage import (
    StageResult,
    begin_stage,
    train_and_finish,
    trainer_arguments,
)

STAGE = "kto"


class AlignflowKTOTrainer(StageTrainerMixin, LabelHeadMixin, KTOTrainer):
    """TRL's KTOTrainer with atomic checkpoints."""


def labelled_answers(pairs: list[dict[str, Any]], unpaired: list[dict[str, Any]], tokenizer: Any) -> Dataset:
    """One row per answer: each pair's chosen (desirable) and rejected (undesirable), then the
    unpaired rows with their own labels."""
    rows = []
    for pair in pairs:
        prompt = format_prompt(tokenizer, pair["prompt"])
        rows.append({"prompt": prompt, "completion": completion_text(pair["chosen"]), "label": True})
        rows.append({"prompt": prompt, "completion": completion_text(pair["rejected"]), "label": False})
    for row in unpaired:
        prompt = format_prompt(tokenizer, row["prompt"])
        rows.append(
            {"prompt": prompt, "completion": completion_text(row["completion"]), "label": bool(row["label"])}
        )
    return Dataset.from_list(rows)


def run_kto(
    config: RunSettings, data_dir: str | Path, output_dir: str | Path, model_path: str | Path | None = None
) -> StageResult:
    """KTO on the policy at ``model_path`` (normally the SFT model)."""
    stage = config.section_as(STAGE, KTOConfig)
    seed, output_dir = begin_stage(stage, config.seed, output_dir)
    pairs, eval_pairs, start, tokenizer = policy_pairs(config, stage, data_dir, output_dir, model_path)
    train_ds = labelled_answers(pairs, load_split(data_dir, "train", kind="unpaired"), tokenizer)
    eval_ds = labelled_answers(eval_pairs, [], tokenizer) if eval_pairs else None

    kwargs = trainer_arguments(stage, output_dir, config.model, seed, has_eval=eval_ds is not None)
    kwargs.update(
        beta=stage.beta,
        desirable_weight=stage.desirable_weight,
        undesirable_weight=stage.undesirable_weight,
        max_length=stage.max_length,
        model_init_kwargs=trl_model_init_kwargs(config.model),
        dataset_num_proc=None,
    )
    if stage.max_prompt_length:
        kwargs["max_prompt_length"] = stage.max_prompt_length
    classes = (AlignflowKTOTrainer, TRLKTOConfig)
    datasets = (train_ds, eval_ds)
    trainer = preference_trainer(STAGE, config, stage, classes, kwargs, start, start, tokenizer, datasets)
    return train_and_finish(STAGE, trainer, output_dir, stage.resume)
