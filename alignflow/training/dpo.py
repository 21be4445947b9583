"""Direct preference optimisation with TRL: DPO and its loss family (IPO, hinge, robust...).

The policy starts from the SFT model (a saved path, so TRL can build its reference from
the same weights) and trains on ``format_prompt(prompt)`` + chosen/rejected, the prompt
rendering every stage shares. What the pair-trained stages share (the train and eval pairs,
the start model, the pair dataset) is here too: SimPO, ORPO and KTO read their rows with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import AutoTokenizer
from trl import DPOConfig as TRLDPOConfig
from trl import DPOTrainer

from alignflow.data.halves import rows_for
from alignflow.data.pairing import load_optional_pairs, load_pairs, require_rows
from alignflow.data.snapshot import load_split
from alignflow.evaluation.metric_names import eval_key
from alignflow.models.factory import peft_config, trl_model_init_kwargs
from alignflow.models.prompting import completion_text, format_prompt
from alignflow.registry.trainer_callback import TrackingCallback
from alignflow.rl.dpo import ZeroReferenceMixin
from alignflow.training.batching import LengthGroupedMixin
from alignflow.training.checkpoints import StageTrainerMixin
from alignflow.training.dpo_config import DPOConfig
from alignflow.training.held_out_best import HeldOutBest, HeldOutCurve
from alignflow.training.logprob_head import LabelHeadMixin
from alignflow.training.reference_logps import CachedReferenceMixin
from alignflow.training.run_settings import RunSettings
from alignflow.training.stage import (
    StageResult,
    begin_stage,
    filter_known_args,
    held_out_metrics,
    require_length_fits,
    resolve_start_model,
    train_and_finish,
    trainer_arguments,
)
from alignflow.training.stage_config import RunConfig, StageConfig


class AlignflowDPOTrainer(
    StageTrainerMixin, CachedReferenceMixin, LengthGroupedMixin, LabelHeadMixin, DPOTrainer
):
    """TRL's DPOTrainer with atomic checkpoints, cached reference log-probs, length-grouped
    batches and a log-prob head that scores only the completions on a CPU."""


class ReferenceFreeDPOTrainer(ZeroReferenceMixin, AlignflowDPOTrainer):
    """DPO against a uniform reference (every reference log-probability is zero); zeros need no cache."""


def pair_dataset(pairs: list[dict[str, Any]], tokenizer: Any) -> Dataset:
    return Dataset.from_list(
        [
            {
                "prompt": format_prompt(tokenizer, p["prompt"]),
                "chosen": completion_text(p["chosen"]),
                "rejected": completion_text(p["rejected"]),
            }
            for p in pairs
        ]
    )


def _trainer_and_args(stage: DPOConfig, reference_free: bool) -> tuple[type, dict[str, Any]]:
    losses = [stage.loss_type] if isinstance(stage.loss_type, str) else list(stage.loss_type)
    extra = {"beta": stage.beta, "loss_type": losses, "label_smoothing": stage.label_smoothing}
    if stage.loss_weights:
        extra["loss_weights"] = stage.loss_weights
    if reference_free:
        extra["precompute_ref_log_probs"] = True
        return ReferenceFreeDPOTrainer, extra
    extra["precompute_ref_log_probs"] = stage.precompute_reference
    return AlignflowDPOTrainer, extra


def policy_pairs(
    config: RunSettings,
    stage: RunConfig,
    data_dir: str | Path,
    output_dir: Path,
    model_path: str | Path | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str, Any]:
    """What a pair-trained policy stage reads: the policy's train pairs, at most
    ``stage.eval_max_rows`` eval pairs, the model it starts from and that model's tokenizer."""
    pairs = rows_for(load_pairs(data_dir, "train"), config.policy.reward_data, "policy")
    require_rows(pairs, data_dir, "train", "pair/scored/ranked")
    eval_pairs = load_optional_pairs(data_dir, "eval", stage.eval_max_rows)
    start = resolve_start_model(config.model, load_split(data_dir, "train"), output_dir, model_path)
    return pairs, eval_pairs, start, AutoTokenizer.from_pretrained(start)


def preference_trainer(
    name: str,
    config: RunSettings,
    stage: StageConfig,
    classes: tuple[type, type],
    arguments: dict[str, Any],
    model: Any,
    start: str,
    tokenizer: Any,
    datasets: tuple[Dataset, Dataset | None],
    **trainer_kwargs: Any,
) -> Any:
    """A TRL trainer built the way every pair-trained stage builds one: ``classes`` (trainer,
    TRL config) with the arguments that config knows, the model section's LoRA, the stage's
    settings sent to the tracker; refused before any step if the model cannot hold
    ``max_length`` tokens."""
    trainer_cls, args_cls = classes
    train_ds, eval_ds = datasets
    trainer = trainer_cls(
        model=model,
        args=args_cls(**filter_known_args(args_cls, arguments)),
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        processing_class=tokenizer,
        peft_config=peft_config(config.model),
        callbacks=[TrackingCallback({name: stage.model_dump(), "model": config.model.model_dump()})],
        **trainer_kwargs,
    )
    require_length_fits(trainer.model, tokenizer, stage.max_length, f"{name}.max_length", start)
    return trainer


def run_dpo(
    config: RunSettings, data_dir: str | Path, output_dir: str | Path, model_path: str | Path | None = None
) -> StageResult:
    """Preference-optimise the policy at ``model_path`` (normally the SFT model)."""
    stage = config.section_as("dpo", DPOConfig)
    seed, output_dir = begin_stage(stage, config.seed, output_dir)
    pairs, eval_pairs, start, tokenizer = policy_pairs(config, stage, data_dir, output_dir, model_path)

    trainer_cls, extra = _trainer_and_args(stage, stage.reference_free)
    train_ds = pair_dataset(pairs, tokenizer)
    eval_ds = pair_dataset(eval_pairs, tokenizer) if eval_pairs else None

    init_kwargs = trl_model_init_kwargs(config.model)
    kwargs = trainer_arguments(stage, output_dir, config.model, seed, has_eval=eval_ds is not None)
    kwargs.update(extra, max_length=stage.max_length, model_init_kwargs=init_kwargs, dataset_num_proc=None)
    if stage.max_prompt_length:
        kwargs["max_prompt_length"] = stage.max_prompt_length
    classes, datasets = (trainer_cls, TRLDPOConfig), (train_ds, eval_ds)
    trainer = preference_trainer(
        "dpo", config, stage, classes, kwargs, start, start, tokenizer, datasets,
        reference_cache_dir=stage.reference_cache_dir,
    )  # fmt: skip
    curve = held_out_curve(stage, data_dir, output_dir, trainer, tokenizer)
    return train_and_finish("dpo", trainer, output_dir, stage.resume, reference_metrics(trainer), curve=curve)


def held_out_curve(
    stage: DPOConfig, data_dir: str | Path, output_dir: Path, trainer: Any, tokenizer: Any
) -> HeldOutCurve | None:
    """With ``dpo.eval_every``, the trainer's callback that scores the held-out set every that
    many steps: greedy answers' task accuracy on eval prompts that carry answers (what the
    policy is for), else the implicit reward's accuracy on the eval pairs; None without either."""
    from alignflow.training.grpo import build_reward_function, mean_reward, prompt_rows
    from alignflow.training.grpo_config import RewardFunctionSpec

    if not stage.eval_every:
        return None
    answered = [r for r in prompt_rows(data_dir, "eval") if r["answer"] is not None]
    answered = answered[: stage.eval_max_rows or None]
    if answered:
        key = eval_key("task_accuracy")
        correct = [build_reward_function(RewardFunctionSpec(kind="correctness"))]

        def score() -> float:
            return mean_reward(trainer.model, tokenizer, answered, correct, [1.0], stage.eval_max_new_tokens)

    elif trainer.eval_dataset is not None:
        key = eval_key("rewards/accuracies")

        def score() -> float:
            return held_out_metrics(trainer.evaluate())[key]

    else:
        return None
    best = HeldOutBest(output_dir) if stage.hand_on == "best" else None
    curve = HeldOutCurve(stage.eval_every, score, key, trainer.model, best)
    trainer.add_callback(curve)
    return curve


def reference_metrics(trainer: Any) -> dict[str, float]:
    """What the reference pass did: per split, 1.0 when its log-probs came from the cache, and its seconds."""
    metrics = {}
    for split, event in getattr(trainer, "reference_cache_events", {}).items():
        metrics[f"reference/{split}_cached"] = float(event["cached"])
        metrics[f"reference/{split}_seconds"] = float(event["seconds"])
    return metrics
