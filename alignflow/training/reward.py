"""Reward models: Bradley-Terry on pairs (TRL RewardTrainer), regression and multi-objective heads.

The reward model encodes text with its *own* tokenizer through
:func:`alignflow.models.reward_scorer.encode_for_reward`, the function the scorer uses at
inference, so a MiniLM reward model can judge a Llama policy. After training the stage
measures accuracy, margin and calibration (ECE) on held-out pairs and saves the reward
mean/std beside the weights for downstream normalisation.

- one objective, pairwise: TRL's RewardTrainer;
- regression (scores in [0, 1], MSE) or several weighted objectives: :class:`HeadsRewardTrainer`.
  Multi-objective targets come from ``metadata["scores"][name]`` (regression) or
  ``metadata["preferences"][name]`` in {1, -1, 0} (pairwise; default 1 = chosen wins).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments
from trl import RewardConfig as TRLRewardConfig
from trl import RewardTrainer

from alignflow.data.snapshot import load_split
from alignflow.evaluation.calibration import pairwise_report
from alignflow.models.factory import minilm_path, model_init_kwargs, peft_config, resolve_model_source
from alignflow.models.reward_scorer import RewardMeta, RewardScorer, encode_for_reward
from alignflow.training.stage import (
    StageResult,
    StageTrainerMixin,
    TrackingCallback,
    begin_stage,
    filter_known_args,
    finish_stage,
    load_optional_pairs,
    load_pairs,
    require_rows,
    resolve_start_model,
    save_final_model,
    train_with_resume,
    trainer_arguments,
)


class AlignflowRewardTrainer(StageTrainerMixin, RewardTrainer):
    """TRL's RewardTrainer with atomic checkpoints."""


class HeadsRewardTrainer(StageTrainerMixin, Trainer):
    """Weighted per-objective losses: MSE on scores, or Bradley-Terry per objective on pairs."""

    def __init__(self, *args, weights: list[float], mode: str, pad_id: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.weights = torch.tensor(weights, dtype=torch.float32)
        self.mode = mode
        self.pad_id = pad_id

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        w = self.weights.to(inputs["targets"].device)
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits.float()
        if self.mode == "regression":
            per_objective = ((logits - inputs["targets"]) ** 2).mean(dim=0)
        else:
            chosen, rejected = logits.chunk(2, dim=0)
            prefs = inputs["targets"]
            nll = -F.logsigmoid(prefs * (chosen - rejected)) * (prefs != 0)
            per_objective = nll.sum(dim=0) / (prefs != 0).sum(dim=0).clamp_min(1)
        loss = (per_objective * w).sum() / w.abs().sum()
        return (loss, logits) if return_outputs else loss


def _pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def heads_collator(pad_id: int, mode: str):
    """Batches for :class:`HeadsRewardTrainer` (pairs are stacked chosen-then-rejected)."""

    def collate(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if mode == "regression":
            rows = [e["input_ids"] for e in examples]
        else:
            rows = [e["chosen_ids"] for e in examples] + [e["rejected_ids"] for e in examples]
        ids, mask = _pad(rows, pad_id)
        targets = torch.tensor([e["targets"] for e in examples], dtype=torch.float32)
        return {"input_ids": ids, "attention_mask": mask, "targets": targets}

    return collate


def objective_targets(record: dict[str, Any], names: list[str], mode: str) -> list[float]:
    """Per-objective targets of one row (see the module docstring for where they come from)."""
    meta = record.get("metadata") or {}
    if mode == "regression":
        scores = meta.get("scores") or {}
        return [float(scores.get(n, record["score"])) for n in names]
    prefs = meta.get("preferences") or {}
    return [float(prefs.get(n, 1.0)) for n in names]


def encode_pairs(pairs: list[dict[str, Any]], tokenizer: Any, max_length: int, names: list[str]) -> Dataset:
    rows = []
    for p in pairs:
        rows.append(
            {
                "chosen_ids": encode_for_reward(tokenizer, p["prompt"], p["chosen"], max_length),
                "rejected_ids": encode_for_reward(tokenizer, p["prompt"], p["rejected"], max_length),
                "targets": objective_targets(p, names, "pairwise"),
            }
        )
    return Dataset.from_list(rows)


def encode_scored(
    records: list[dict[str, Any]], tokenizer: Any, max_length: int, names: list[str]
) -> Dataset:
    return Dataset.from_list(
        [
            {
                "input_ids": encode_for_reward(tokenizer, r["prompt"], r["completion"], max_length),
                "targets": objective_targets(r, names, "regression"),
            }
            for r in records
        ]
    )


def resolve_backbone(
    config: Any, data_dir: str | Path, output_dir: Path, model_path: str | Path | None
) -> str:
    """'policy' -> the model section's model (or ``model_path``); 'minilm' -> the packaged encoder."""
    backbone = config.reward.backbone
    if backbone == "policy":
        return resolve_start_model(config.model, load_split(data_dir, "train"), output_dir, model_path)
    if backbone == "minilm":
        return str(minilm_path())
    return resolve_model_source(backbone)


def _scored_rows(data_dir: str | Path, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    try:
        rows = load_split(data_dir, split, kind="scored")
    except FileNotFoundError:
        return []
    return rows[:limit] if limit else rows


def run_reward(
    config: Any, data_dir: str | Path, output_dir: str | Path, model_path: str | Path | None = None
) -> StageResult:
    """Train a reward model; metrics: eval accuracy, margin, ECE, reward mean/std."""
    stage = config.reward
    seed, output_dir = begin_stage(stage, config.seed, output_dir)
    names = [o.name for o in stage.objectives]
    weights = [o.weight for o in stage.objectives]

    path = resolve_backbone(config, data_dir, output_dir, model_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    init = model_init_kwargs(config.model)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=len(names), **init)
    model.config.pad_token_id = tokenizer.pad_token_id

    train_pairs = load_pairs(data_dir, "train")
    eval_pairs = load_optional_pairs(data_dir, "eval", stage.eval_max_rows)
    base_args = trainer_arguments(stage, output_dir, config.model, seed, has_eval=False)
    callbacks = [TrackingCallback({"reward": stage.model_dump(), "model": config.model.model_dump()})]
    lora = peft_config(config.model, task_type="SEQ_CLS")
    if stage.mode == "pairwise" and len(names) == 1:
        require_rows(train_pairs, data_dir, "train", "pair/scored")
        train_ds = encode_pairs(train_pairs, tokenizer, stage.max_length, names).remove_columns("targets")
        if stage.use_margin:
            train_ds = train_ds.add_column("margin", [float(p.get("margin") or 0.0) for p in train_pairs])
        args = dict(base_args, max_length=None, center_rewards_coefficient=stage.center_rewards_coefficient)
        args.update(dataset_num_proc=None)
        trainer = AlignflowRewardTrainer(
            model=model,
            args=TRLRewardConfig(**filter_known_args(TRLRewardConfig, args)),
            train_dataset=train_ds,
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=callbacks,
        )
    else:
        if stage.mode == "regression":
            scored = require_rows(_scored_rows(data_dir, "train"), data_dir, "train", "scored")
            train_ds = encode_scored(scored, tokenizer, stage.max_length, names)
        else:
            train_ds = encode_pairs(
                require_rows(train_pairs, data_dir, "train", "pair"), tokenizer, stage.max_length, names
            )
        if lora is not None:
            from peft import get_peft_model

            model = get_peft_model(model, lora)
        trainer = HeadsRewardTrainer(
            model=model,
            args=TrainingArguments(
                **filter_known_args(TrainingArguments, dict(base_args, remove_unused_columns=False))
            ),
            train_dataset=train_ds,
            data_collator=heads_collator(tokenizer.pad_token_id, stage.mode),
            processing_class=tokenizer,
            callbacks=callbacks,
            weights=weights,
            mode=stage.mode,
            pad_id=tokenizer.pad_token_id,
        )
    output, resumed_from = train_with_resume(trainer, output_dir, stage.resume)
    model_dir = save_final_model(trainer, output_dir)
    metrics = {"train_loss": output.training_loss}
    metrics.update(measure_and_save_meta(model_dir, stage, names, weights, train_pairs, eval_pairs, data_dir))
    return finish_stage("reward", output_dir, model_dir, metrics, resumed_from)


def measure_and_save_meta(
    model_dir: Path,
    stage: Any,
    names: list[str],
    weights: list[float],
    train_pairs: list[dict[str, Any]],
    eval_pairs: list[dict[str, Any]],
    data_dir: str | Path,
) -> dict[str, float]:
    """Held-out accuracy/margin/ECE, train reward mean/std; the stats go beside the weights."""
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, use_safetensors=True)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    meta = RewardMeta(objectives=names, weights=weights, max_length=stage.max_length, mode=stage.mode)
    scorer = RewardScorer(
        model, tokenizer, meta, normalize=False, batch_size=stage.per_device_eval_batch_size
    )
    metrics: dict[str, float] = {}
    stats_rows = train_pairs[: stage.stats_max_rows]
    if stats_rows:
        train_report = _report(scorer, stats_rows)
        meta.mean, meta.std = train_report.reward_mean, max(train_report.reward_std, 1e-6)
        metrics.update(train_report.as_metrics("train/"))
    if stage.mode == "regression":
        scored = _scored_rows(data_dir, "eval", stage.eval_max_rows) or _scored_rows(data_dir, "train")
        if scored:
            predicted = torch.tensor(
                scorer.raw([r["prompt"] for r in scored], [r["completion"] for r in scored])
            )
            metrics["eval/mse"] = float(
                ((predicted - torch.tensor([r["score"] for r in scored])) ** 2).mean()
            )
            if not stats_rows:
                meta.mean, meta.std = float(predicted.mean()), max(float(predicted.std()), 1e-6)
    if eval_pairs:
        metrics.update(_report(scorer, eval_pairs).as_metrics("eval/"))
    meta.metrics = metrics
    meta.save(model_dir)
    return metrics


def _report(scorer: RewardScorer, pairs: list[dict[str, Any]]):
    prompts = [p["prompt"] for p in pairs]
    chosen = scorer.raw(prompts, [p["chosen"] for p in pairs])
    rejected = scorer.raw(prompts, [p["rejected"] for p in pairs])
    return pairwise_report(chosen, rejected)
