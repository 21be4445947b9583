"""SimPO with TRL: the CPO trainer with ``loss_type="simpo"``, no reference model.

The policy starts from the SFT model and trains on the same pairs as DPO
(``format_prompt(prompt)`` + chosen/rejected). SimPO's reward is an answer's mean per-token
log-probability, so there is no reference to compute or cache. TRL's CPO trainer cuts only
the answer to ``max_length``; the prompt is cut here first, from its start, to
``simpo.prompt_budget`` tokens, so every row keeps answer tokens to average.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import AutoModelForCausalLM

from alignflow.errors import InputError
from alignflow.models.factory import model_init_kwargs
from alignflow.models.prompting import cut_prompt_text
from alignflow.training.batching import LengthGroupedMixin
from alignflow.training.checkpoints import StageTrainerMixin
from alignflow.training.dpo import pair_dataset, policy_pairs, preference_trainer
from alignflow.training.run_settings import RunSettings
from alignflow.training.simpo_config import SimPOConfig
from alignflow.training.stage import (
    StageResult,
    begin_stage,
    train_and_finish,
    trainer_arguments,
)

STAGE = "simpo"


def _trainer_class() -> tuple[type, type]:
    from trl.experimental.cpo import CPOConfig, CPOTrainer

    class AlignflowSimPOTrainer(StageTrainerMixin, LengthGroupedMixin, CPOTrainer):
        """TRL's (experimental) CPOTrainer with atomic checkpoints and length-grouped batches."""

    return AlignflowSimPOTrainer, CPOConfig


def simpo_pairs(pairs: list[dict[str, Any]], tokenizer: Any, prompt_budget: int) -> Dataset:
    """Prompt/chosen/rejected rows, each prompt cut from its start to at most ``prompt_budget``
    tokens as the trainer reads it (it puts the BOS token in front of the prompt's own)."""
    budget = prompt_budget - int(tokenizer.bos_token_id is not None)
    if budget < 1:
        raise InputError(f"simpo: a prompt budget of {prompt_budget} tokens leaves none for the prompt")
    dataset = pair_dataset(pairs, tokenizer)
    return dataset.map(lambda row: {"prompt": cut_prompt_text(tokenizer, row["prompt"], budget)})


def build_trainer(
    config: RunSettings,
    seed: int,
    data_dir: str | Path,
    output_dir: Path,
    model_path: str | Path | None = None,
) -> Any:
    """The SimPO trainer on the snapshot's train pairs (and eval pairs, if any), ready to train."""
    stage = config.section_as(STAGE, SimPOConfig)
    pairs, eval_pairs, start, tokenizer = policy_pairs(config, stage, data_dir, output_dir, model_path)
    train_ds = simpo_pairs(pairs, tokenizer, stage.prompt_budget)
    eval_ds = simpo_pairs(eval_pairs, tokenizer, stage.prompt_budget) if eval_pairs else None

    classes = _trainer_class()
    kwargs = trainer_arguments(stage, output_dir, config.model, seed, has_eval=eval_ds is not None)
    kwargs.update(
        loss_type="simpo",
        beta=stage.beta,
        simpo_gamma=stage.gamma,
        cpo_alpha=stage.cpo_alpha,
        label_smoothing=stage.label_smoothing,
        max_length=stage.max_length,
        dataset_num_proc=None,
        remove_unused_columns=False,  # the trainer's pair collator reads its own columns
    )
    # a model object, not a path: given a path and init kwargs, the CPO trainer would load it
    # with device_map="auto"
    model = AutoModelForCausalLM.from_pretrained(start, **model_init_kwargs(config.model))
    datasets = (train_ds, eval_ds)
    return preference_trainer(STAGE, config, stage, classes, kwargs, model, start, tokenizer, datasets)


def run_simpo(
    config: RunSettings, data_dir: str | Path, output_dir: str | Path, model_path: str | Path | None = None
) -> StageResult:
    """SimPO on the policy at ``model_path`` (normally the SFT model)."""
    stage = config.section_as(STAGE, SimPOConfig)
    seed, output_dir = begin_stage(stage, config.seed, output_dir)
    trainer = build_trainer(config, seed, data_dir, output_dir, model_path)
    return train_and_finish(STAGE, trainer, output_dir, stage.resume)
