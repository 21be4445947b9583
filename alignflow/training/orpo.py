"""ORPO with TRL: supervised learning on the chosen answers plus an odds-ratio preference term.

No reference model: the policy (normally the SFT model, or the base model when ``policy.run_sft``
is off, which is what ORPO was made for) trains on the snapshot's pairs through TRL's
experimental ORPO trainer, in length-grouped batches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM

from alignflow.models.factory import model_init_kwargs
from alignflow.training.batching import LengthGroupedMixin
from alignflow.training.checkpoints import StageTrainerMixin
from alignflow.training.dpo import pair_dataset, policy_pairs, preference_trainer
from alignflow.training.orpo_config import ORPOConfig
from alignflow.training.run_settings import RunSettings
from alignflow.training.stage import (
    StageResult,
    begin_stage,
    train_and_finish,
    trainer_arguments,
)

STAGE = "orpo"


def _trainer_classes() -> tuple[type, type]:
    """(our ORPO trainer, TRL's ORPOConfig): TRL keeps ORPO under ``trl.experimental``."""
    from trl.experimental.orpo import ORPOConfig as TRLORPOConfig
    from trl.experimental.orpo import ORPOTrainer

    class AlignflowORPOTrainer(StageTrainerMixin, LengthGroupedMixin, ORPOTrainer):
        """TRL's ORPOTrainer with atomic checkpoints and length-grouped batches."""

    return AlignflowORPOTrainer, TRLORPOConfig


def run_orpo(
    config: RunSettings, data_dir: str | Path, output_dir: str | Path, model_path: str | Path | None = None
) -> StageResult:
    """ORPO on the policy at ``model_path`` (the SFT model, or the base model)."""
    stage = config.section_as(STAGE, ORPOConfig)
    seed, output_dir = begin_stage(stage, config.seed, output_dir)
    pairs, eval_pairs, start, tokenizer = policy_pairs(config, stage, data_dir, output_dir, model_path)
    train_ds = pair_dataset(pairs, tokenizer)
    eval_ds = pair_dataset(eval_pairs, tokenizer) if eval_pairs else None

    classes = _trainer_classes()
    kwargs = trainer_arguments(stage, output_dir, config.model, seed, has_eval=eval_ds is not None)
    kwargs.update(beta=stage.beta, max_length=stage.max_length, dataset_num_proc=None)
    if stage.max_prompt_length:
        kwargs["max_prompt_length"] = stage.max_prompt_length
    # a model object: given a path, the experimental trainer would load it with its own defaults
    model: Any = AutoModelForCausalLM.from_pretrained(start, **model_init_kwargs(config.model))
    datasets = (train_ds, eval_ds)
    trainer = preference_trainer(STAGE, config, stage, classes, kwargs, model, start, tokenizer, datasets)
    return train_and_finish(STAGE, trainer, output_dir, stage.resume)
