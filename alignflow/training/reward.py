"""Reward models: Bradley-Terry on pairs (TRL RewardTrainer), regression and multi-objective heads.

The reward model encodes text with its *own* tokenizer through
:func:`alignflow.models.reward_scorer.encode_for_reward`, the function the scorer uses at
inference, so a MiniLM reward model can judge a Llama policy. After training the stage
measures accuracy, margin and calibration (ECE) on held-out pairs and saves the reward
mean/std beside the weights for downstream normalisation. With ``noisy_pair_fraction`` the
train pairs most likely mislabelled are set aside first (:mod:`alignflow.training.noisy_pairs`).

- one objective, pairwise: TRL's RewardTrainer;
- regression (scores in [0, 1], MSE), mixed (MSE on ratings + Bradley-Terry on pairs, one
  head) or several weighted objectives: :class:`HeadsRewardTrainer`.
  Multi-objective targets come from ``metadata["scores"][name]`` (regression) or
  ``metadata["preferences"][name]`` in {1, -1, 0} (pairwise; default 1 = chosen wins).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments
from trl import RewardConfig as TRLRewardConfig
from trl import RewardTrainer
from trl.trainer.reward_trainer import DataCollatorForPreference

from alignflow.data.halves import rows_for
from alignflow.data.pairing import load_optional_pairs, load_pairs, require_rows
from alignflow.data.snapshot import load_split
from alignflow.errors import InputError
from alignflow.evaluation.calibration import pairwise_report
from alignflow.models.factory import (
    minilm_path,
    model_init_kwargs,
    peft_config,
    placed,
    prepare_base_model,
    resolve_model_source,
    whole_model_precision_flags,
)
from alignflow.models.model_config import LoraSpec, ModelSpec
from alignflow.models.prompting import completion_text
from alignflow.models.reward_scorer import (
    RewardMeta,
    RewardScorer,
    encode_reward_input,
    reward_logits,
    span_mask,
)
from alignflow.registry import tracking
from alignflow.registry.trainer_callback import TrackingCallback
from alignflow.training.batching import LengthGroupedMixin
from alignflow.training.checkpoints import StageTrainerMixin, save_final_model, train_with_resume
from alignflow.training.noisy_pairs import NOISY_PAIRS_FILE, find_noisy_pairs, write_noisy_pairs
from alignflow.training.reward_config import RewardConfig
from alignflow.training.run_settings import RunSettings
from alignflow.training.stage import (
    StageResult,
    begin_stage,
    filter_known_args,
    finish_stage,
    require_length_fits,
    resolve_start_model,
    trained_cost,
    trainer_arguments,
)


class AlignflowRewardTrainer(StageTrainerMixin, LengthGroupedMixin, RewardTrainer):
    """TRL's RewardTrainer with atomic checkpoints; a pooling other than the model's own goes
    through :func:`reward_logits`, the forward pass the scorer uses at inference."""

    pooling = "model"
    args: TRLRewardConfig  # transformers types it as TrainingArguments
    _signature_columns: list[str] | None  # type: ignore[assignment]  # transformers types it as None

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        if self.pooling == "answer":  # the answers' token spans travel to AnswerSpanCollator
            self._signature_columns = [*(self._signature_columns or []), "chosen_span", "rejected_span"]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.pooling == "model":
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        # reward_logits calls the encoder's body itself, past the forward accelerate wraps in
        # its mixed-precision autocast: the same autocast here, or bf16 would never apply
        with self.accelerator.autocast():
            logits = reward_logits(
                model, inputs["input_ids"], inputs["attention_mask"], self.pooling, inputs.get("answer_mask")
            )
        chosen, rejected = logits.float().squeeze(-1).chunk(2)
        loss = -F.logsigmoid(chosen - rejected - inputs.get("margin", 0.0)).mean()
        if self.args.center_rewards_coefficient is not None:
            loss = loss + self.args.center_rewards_coefficient * ((chosen + rejected) ** 2).mean()
        return (loss, {"logits": logits}) if return_outputs else loss


class HeadsRewardTrainer(StageTrainerMixin, LengthGroupedMixin, Trainer):
    """Weighted per-objective losses: MSE on scores, Bradley-Terry on pairs, or both (mixed)."""

    def __init__(self, *args, weights: list[float], **kwargs):
        super().__init__(*args, **kwargs)
        self.weights = torch.tensor(weights, dtype=torch.float32)

    pooling = "model"

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        with self.accelerator.autocast():  # as AlignflowRewardTrainer.compute_loss
            logits = reward_logits(
                model, inputs["input_ids"], inputs["attention_mask"], self.pooling, inputs.get("answer_mask")
            ).float()
        n_scored = int(inputs["n_scored"])
        per_objective = torch.zeros(logits.shape[-1], device=logits.device)
        if n_scored:
            per_objective = per_objective + regression_loss(logits[:n_scored], inputs["score_targets"])
        if logits.shape[0] > n_scored:
            per_objective = per_objective + pairwise_loss(logits[n_scored:], inputs["pair_targets"])
        w = self.weights.to(logits.device)
        loss = (per_objective * w).sum() / w.abs().sum()
        return (loss, logits) if return_outputs else loss


class AnswerSpanCollator(DataCollatorForPreference):
    """TRL's preference batches plus ``answer_mask``: where each row's answer sits (pooling "answer")."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = super().torch_call(examples)
        spans = [e["chosen_span"] for e in examples] + [e["rejected_span"] for e in examples]
        batch["answer_mask"] = span_mask(spans, batch["input_ids"].shape[1])
        return batch


def regression_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-objective MSE of predicted against given scores."""
    return ((logits - targets) ** 2).mean(dim=0)


def pairwise_loss(logits: torch.Tensor, prefs: torch.Tensor) -> torch.Tensor:
    """Per-objective Bradley-Terry NLL; rows are chosen-then-rejected, ``prefs`` in {1, -1, 0}."""
    chosen, rejected = logits.chunk(2, dim=0)
    nll = -F.logsigmoid(prefs * (chosen - rejected)) * (prefs != 0)
    return nll.sum(dim=0) / (prefs != 0).sum(dim=0).clamp_min(1)


def _pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return ids, mask


def heads_collator(pad_id: int):
    """Batches for :class:`HeadsRewardTrainer`: rated rows first, then pairs (chosen, then rejected).

    Each example says what it is (``input_ids`` for a rating, ``chosen_ids``/``rejected_ids``
    for a pair), so regression, pairwise and mixed batches share one collator.
    """

    def collate(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        scored = [e for e in examples if e.get("input_ids")]
        pairs = [e for e in examples if e.get("chosen_ids")]
        rows = [e["input_ids"] for e in scored] + [e["chosen_ids"] for e in pairs]
        rows += [e["rejected_ids"] for e in pairs]
        ids, mask = _pad(rows, pad_id)
        width = len(examples[0]["targets"])
        answer = {}
        if "span" in examples[0]:  # pooling "answer": the spans in the rows' order
            spans = [e["span"] for e in scored] + [e["chosen_span"] for e in pairs]
            answer["answer_mask"] = span_mask(spans + [e["rejected_span"] for e in pairs], ids.shape[1])
        return answer | {
            "input_ids": ids,
            "attention_mask": mask,
            "n_scored": torch.tensor(len(scored)),
            "score_targets": torch.tensor([e["targets"] for e in scored], dtype=torch.float32).view(
                -1, width
            ),
            "pair_targets": torch.tensor([e["targets"] for e in pairs], dtype=torch.float32).view(-1, width),
        }

    return collate


def objective_targets(record: dict[str, Any], names: list[str], mode: str) -> list[float]:
    """Per-objective targets of one row (see the module docstring for where they come from)."""
    meta = record.get("metadata") or {}
    if mode == "regression":
        scores = meta.get("scores") or {}
        return [float(scores.get(n, record["score"])) for n in names]
    prefs = meta.get("preferences") or {}
    return [float(prefs.get(n, 1.0)) for n in names]


def encode_pairs(
    pairs: list[dict[str, Any]], tokenizer: Any, max_length: int, names: list[str], spans: bool = False
) -> list[dict]:
    """Comparison rows for the reward trainers (``input_ids`` empty: not a rating); with ``spans``,
    where each answer's tokens sit (pooling "answer")."""
    rows = []
    for p in pairs:
        (chosen, chosen_span), (rejected, rejected_span) = (
            encode_reward_input(tokenizer, p["prompt"], p[side], max_length, spans)
            for side in ("chosen", "rejected")
        )
        row = {
            "input_ids": [],
            "chosen_ids": chosen,
            "rejected_ids": rejected,
            "targets": objective_targets(p, names, "pairwise"),
        }
        if spans:
            assert chosen_span is not None and rejected_span is not None  # located with ``spans``
            row |= {"span": [0, 0], "chosen_span": list(chosen_span), "rejected_span": list(rejected_span)}
        rows.append(row)
    return rows


def encode_scored(
    records: list[dict[str, Any]], tokenizer: Any, max_length: int, names: list[str], spans: bool = False
) -> list[dict]:
    """Rating rows for :class:`HeadsRewardTrainer` (``chosen_ids`` empty: not a pair)."""
    rows = []
    for r in records:
        ids, span = encode_reward_input(tokenizer, r["prompt"], r["completion"], max_length, spans)
        row = {
            "input_ids": ids,
            "chosen_ids": [],
            "rejected_ids": [],
            "targets": objective_targets(r, names, "regression"),
        }
        if spans:
            assert span is not None  # located with ``spans``
            row |= {"span": list(span), "chosen_span": [0, 0], "rejected_span": [0, 0]}
        rows.append(row)
    return rows


def heads_rows(
    stage: Any, data_dir: str | Path, train_pairs: list[dict[str, Any]], tokenizer: Any, names: list[str]
) -> Dataset:
    """What :class:`HeadsRewardTrainer` fits: ratings (regression), pairs (pairwise) or both (mixed)."""
    rows: list[dict] = []
    spans = stage.pooling == "answer"
    if stage.mode in ("regression", "mixed"):
        scored = _scored_rows(data_dir, "train")
        if stage.mode == "regression":
            require_rows(scored, data_dir, "train", "scored")
        rows += encode_scored(scored, tokenizer, stage.max_length, names, spans)
    if stage.mode in ("pairwise", "mixed"):
        rows += encode_pairs(train_pairs, tokenizer, stage.max_length, names, spans)
    return Dataset.from_list(require_rows(rows, data_dir, "train", f"{stage.mode} reward"))


def resolve_backbone(
    config: RunSettings, data_dir: str | Path, output_dir: Path, model_path: str | Path | None
) -> str:
    """'policy' -> the model section's model (or ``model_path``); 'minilm' -> the packaged encoder."""
    backbone = config.section_as("reward", RewardConfig).backbone
    if backbone == "policy":
        return resolve_start_model(config.model, load_split(data_dir, "train"), output_dir, model_path)
    if config.model.weights == "random":  # its own backbone's architecture, as random as the policy's
        return prepare_base_model(backbone_spec(config), [], output_dir)
    if backbone == "minilm":
        return str(minilm_path())
    return resolve_model_source(backbone)


def backbone_spec(config: RunSettings) -> ModelSpec:
    """How the reward model's weights are loaded and trained: as the ``model`` section says when it
    shares the policy's backbone; a backbone of its own (MiniLM, a path) is trained whole, in fp32
    weights: the policy's LoRA and dtype were chosen for the policy's model."""
    backbone = config.section_as("reward", RewardConfig).backbone
    if backbone == "policy":
        return config.model
    # fp32 weights (on a GPU too, where 'auto' would load them in half precision and AdamW would
    # round its updates away); the products run in half precision under autocast
    own = {"name": backbone, "dtype": "float32", "lora": LoraSpec()}
    return config.model.model_copy(update=own)


def _scored_rows(data_dir: str | Path, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    try:
        rows = load_split(data_dir, split, kind="scored")
    except FileNotFoundError:
        return []
    return rows[:limit] if limit else rows


def response_log_length(completion: Any) -> float:
    """log(1 + characters) of a response: the length the prior and the length-gap metrics read."""
    return float(np.log1p(len(completion_text(completion))))


def log_length_differences(pairs: list[dict[str, Any]]) -> np.ndarray:
    """Per pair, log-length of the chosen response minus that of the rejected one."""
    return np.array([response_log_length(p["chosen"]) - response_log_length(p["rejected"]) for p in pairs])


def fit_length_prior(pairs: list[dict[str, Any]]) -> float:
    """Slope w of P(chosen wins) = sigmoid(w * (log-length chosen - log-length rejected)), by Newton's method.

    Negative when the data prefers shorter answers. Used as a fixed offset during training
    (``length_debias``): the reward then only has to explain what length does not.
    """
    d = log_length_differences(pairs)
    w = 0.0
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-w * d))
        step = ((1.0 - p) * d).sum() / max((p * (1.0 - p) * d * d).sum(), 1e-12)
        w += step
        if abs(step) < 1e-8:
            break
    return float(w)


def freeze_lower_layers(model: Any, n_layers: int) -> int:
    """Freeze the embeddings and the ``n_layers`` lowest transformer layers; returns how many were frozen."""
    if n_layers <= 0:
        return 0
    body = getattr(model, model.base_model_prefix)
    layers = getattr(getattr(body, "encoder", None), "layer", None) or getattr(body, "layers", None)
    embeddings = getattr(body, "embeddings", None) or getattr(body, "embed_tokens", None)
    if layers is None or embeddings is None:
        raise InputError(f"{type(model).__name__}: cannot find the embeddings and layers to freeze")
    for module in [embeddings, *list(layers)[:n_layers]]:
        module.requires_grad_(False)
    return min(n_layers, len(layers))


def length_split_accuracy(
    pairs: list[dict[str, Any]], chosen: list[float], rejected: list[float]
) -> dict[str, float]:
    """Accuracy where the chosen answer is the longer / the shorter one, and their signed gap
    (longer - shorter), from :func:`~alignflow.evaluation.benchmark.length_bias`.

    A reward model that learned "shorter wins" scores well on one side only; the gap shows it.
    """
    from alignflow.evaluation.benchmark import length_bias

    lengths = {side: [len(completion_text(p[side])) for p in pairs] for side in ("chosen", "rejected")}
    bias = length_bias(chosen, rejected, lengths["chosen"], lengths["rejected"])
    longer, shorter = bias.chosen_longer, bias.chosen_shorter
    out = {"n_chosen_longer": float(longer.n), "n_chosen_shorter": float(shorter.n)}
    # both accuracies exist exactly where length_bias gives a gap
    if longer.value is not None and shorter.value is not None:
        out |= {
            "accuracy_chosen_longer": longer.value,
            "accuracy_chosen_shorter": shorter.value,
            "length_gap": longer.value - shorter.value,
        }
    return out


def run_reward(
    config: RunSettings, data_dir: str | Path, output_dir: str | Path, model_path: str | Path | None = None
) -> StageResult:
    """Train a reward model; metrics: eval accuracy, margin, ECE, reward mean/std."""
    stage = config.section_as("reward", RewardConfig)
    seed, output_dir = begin_stage(stage, config.seed, output_dir)
    names = [o.name for o in stage.objectives]
    weights = [o.weight for o in stage.objectives]

    path = resolve_backbone(config, data_dir, output_dir, model_path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    spec = backbone_spec(config)
    init = model_init_kwargs(spec)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=len(names), **init)
    model.config.pad_token_id = tokenizer.pad_token_id
    require_length_fits(model, tokenizer, stage.max_length, "reward.max_length", f"backbone {path}")
    freeze_lower_layers(model, stage.freeze_layers)

    train_pairs = rows_for(load_pairs(data_dir, "train"), config.policy.reward_data, "reward")
    eval_pairs = load_optional_pairs(data_dir, "eval", stage.eval_max_rows)
    base_args = trainer_arguments(stage, output_dir, spec, seed, has_eval=False)
    if stage.backbone != "policy":
        base_args.update(whole_model_precision_flags(spec, config.model))
    # transformers counts the tokens trained: TRL's own count skips a pooling of ours and the heads
    base_args.setdefault("include_num_input_tokens_seen", "non_padding")
    callbacks = [TrackingCallback({"reward": stage.model_dump(), "model": spec.model_dump()})]
    lora = peft_config(spec, task_type="SEQ_CLS")
    metrics: dict[str, float] = {}
    trainer: AlignflowRewardTrainer | HeadsRewardTrainer
    if stage.mode == "pairwise" and len(names) == 1:
        require_rows(train_pairs, data_dir, "train", "pair/scored/ranked")
        if stage.noisy_pair_fraction:
            n_read = len(train_pairs)
            train_pairs = set_aside_noisy_pairs(model, tokenizer, train_pairs, stage, seed, output_dir)
            metrics["train/pairs_set_aside"] = float(n_read - len(train_pairs))
        encoded = encode_pairs(train_pairs, tokenizer, stage.max_length, names, stage.pooling == "answer")
        train_ds = Dataset.from_list(encoded).remove_columns(
            [c for c in ("targets", "input_ids", "span") if c in encoded[0]]
        )
        margins = [float(p.get("margin") or 0.0) if stage.use_margin else 0.0 for p in train_pairs]
        if stage.length_debias:
            # TRL subtracts the margin inside the sigmoid: -w * d adds the prior w * d to the logit
            w = stage.length_debias * fit_length_prior(train_pairs)
            margins = [m - w * d for m, d in zip(margins, log_length_differences(train_pairs), strict=True)]
        if stage.use_margin or stage.length_debias:
            train_ds = train_ds.add_column("margin", margins)
        args = dict(base_args, max_length=None, center_rewards_coefficient=stage.center_rewards_coefficient)
        args.update(dataset_num_proc=None)
        collator = None
        if stage.pooling == "answer":
            collator = AnswerSpanCollator(pad_token_id=tokenizer.pad_token_id)
        trainer = AlignflowRewardTrainer(
            model=model,
            args=TRLRewardConfig(**filter_known_args(TRLRewardConfig, args)),
            data_collator=collator,
            train_dataset=train_ds,
            processing_class=tokenizer,
            peft_config=lora,
            callbacks=callbacks,
        )
    else:
        train_ds = heads_rows(stage, data_dir, train_pairs, tokenizer, names)
        if lora is not None:
            from peft import get_peft_model

            model = get_peft_model(model, lora)
        trainer = HeadsRewardTrainer(
            model=model,
            args=TrainingArguments(
                **filter_known_args(TrainingArguments, dict(base_args, remove_unused_columns=False))
            ),
            train_dataset=train_ds,
            data_collator=heads_collator(tokenizer.pad_token_id),
            processing_class=tokenizer,
            callbacks=callbacks,
            weights=weights,
        )
    trainer.pooling = stage.pooling
    output, resumed_from = train_with_resume(trainer, output_dir, stage.resume)
    model_dir = save_final_model(trainer, output_dir)
    metrics |= {"train_loss": output.training_loss, "global_step": float(trainer.state.global_step)}
    if stage.mode != "regression":  # ratings alone learn from no pair
        metrics["train/pairs_used"] = float(len(train_pairs))
    measured = measure_and_save_meta(
        model_dir, stage, names, weights, train_pairs, eval_pairs, data_dir, trainer.args.device
    )
    metrics.update(measured)
    cost = trained_cost(trainer, output)
    return finish_stage("reward", output_dir, model_dir, metrics, resumed_from, cost)


def set_aside_noisy_pairs(
    model: Any, tokenizer: Any, pairs: list[dict[str, Any]], stage: Any, seed: int, output_dir: Path
) -> list[dict[str, Any]]:
    """The train pairs to learn from; the ones set aside as likely mislabelled go to ``noisy_pairs.jsonl``
    (logged to the active run), each with the probe's probability of its label."""
    prior_logit = fit_length_prior(pairs) * log_length_differences(pairs)
    noisy = find_noisy_pairs(
        model, tokenizer, pairs, stage.noisy_pair_fraction, stage.max_length, prior_logit, seed
    )
    path = write_noisy_pairs(Path(output_dir) / NOISY_PAIRS_FILE, pairs, noisy)
    if tracking.active():
        import mlflow

        mlflow.log_artifact(str(path), artifact_path="reward")
    return [pairs[i] for i in noisy.kept(len(pairs))]


def measure_and_save_meta(
    model_dir: Path,
    stage: Any,
    names: list[str],
    weights: list[float],
    train_pairs: list[dict[str, Any]],
    eval_pairs: list[dict[str, Any]],
    data_dir: str | Path,
    device: Any = None,
) -> dict[str, float]:
    """Held-out accuracy/margin/ECE, train reward mean/std; the stats go beside the weights.
    ``device``: where the model trained, so the measure runs there too."""
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, use_safetensors=True)
    model = placed(model, device)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    meta = RewardMeta(
        objectives=names, weights=weights, max_length=stage.max_length, mode=stage.mode, pooling=stage.pooling
    )
    scorer = RewardScorer(
        model, tokenizer, meta, normalize=False, batch_size=stage.per_device_eval_batch_size
    )
    metrics: dict[str, float] = {}
    stats_rows = train_pairs[: stage.stats_max_rows]
    if stats_rows:
        train_report = _report(scorer, stats_rows)
        meta.mean, meta.std = train_report.reward_mean, max(train_report.reward_std, 1e-6)
        metrics.update(train_report.as_metrics("train/"))
    if stage.mode in ("regression", "mixed"):
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
        chosen, rejected = _rewards(scorer, eval_pairs)
        metrics.update(pairwise_report(chosen, rejected).as_metrics("eval/"))
        for key, value in length_split_accuracy(eval_pairs, chosen, rejected).items():
            metrics[f"eval/{key}"] = value
    meta.metrics = metrics
    meta.save(model_dir)
    return metrics


def _rewards(scorer: RewardScorer, pairs: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    prompts = [p["prompt"] for p in pairs]
    chosen = scorer.raw(prompts, [p["chosen"] for p in pairs])
    return chosen, scorer.raw(prompts, [p["rejected"] for p in pairs])


def _report(scorer: RewardScorer, pairs: list[dict[str, Any]]):
    return pairwise_report(*_rewards(scorer, pairs))
