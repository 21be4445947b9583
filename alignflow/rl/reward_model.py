"""Reward models: a transformer backbone pooled to a scalar (or several) score.

``RewardModel`` scores a sequence; ``PairwiseRewardModel`` scores the preference of A
over B; ``MultiObjectiveRewardModel`` keeps one head per objective (helpfulness,
safety, ...) and a weighted combination. ``RewardModelTrainer`` fits any of them on
chosen/rejected texts with the Bradley-Terry objective and stores them as safetensors
plus JSON, so loading never unpickles anything.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import safetensors.torch
import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    PretrainedConfig,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from alignflow.rl.trainer_loop import loop_arguments, output_folder

POOLING = ("last", "mean", "cls")
WEIGHTS_FILE = "reward_model.safetensors"
CONFIG_FILE = "reward_config.json"
BACKBONE_DIR = "backbone"


@dataclass
class RewardModelConfig:
    """Backbone, head and optimisation settings of a reward model."""

    model_name: str
    num_labels: int = 1
    pooling_strategy: str = "last"
    dropout_prob: float = 0.1
    temperature: float = 1.0
    use_lora: bool = False
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.1
    learning_rate: float = 1e-4
    warmup_steps: int = 100
    gradient_accumulation_steps: int = 1
    max_grad_norm: float = 1.0
    max_length: int = 512
    seed: int = 0
    lora_target_modules: list[str] | str = field(default="all-linear")

    def __post_init__(self) -> None:
        if self.pooling_strategy not in POOLING:
            raise ValueError(
                f"RewardModelConfig.pooling_strategy must be one of {POOLING}, got {self.pooling_strategy!r}"
            )
        if self.temperature <= 0:
            raise ValueError(f"RewardModelConfig.temperature must be positive, got {self.temperature}")
        if self.num_labels < 1:
            raise ValueError(f"RewardModelConfig.num_labels must be >= 1, got {self.num_labels}")
        if self.gradient_accumulation_steps < 1:
            raise ValueError("RewardModelConfig.gradient_accumulation_steps must be >= 1")


def _is_causal_lm(model: nn.Module) -> bool:
    return type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))


def load_backbone(model_name: str) -> nn.Module:
    """The encoder/decoder body without its LM head (safetensors only)."""
    return AutoModel.from_pretrained(model_name, use_safetensors=True)


def pool_hidden_states(hidden: torch.Tensor, attention_mask: torch.Tensor, strategy: str) -> torch.Tensor:
    """One vector per row: the last or first attended token, or the attended mean.

    Works with left or right padding because positions come from the mask, not the shape.
    """
    mask = attention_mask.to(hidden.dtype)
    if strategy == "mean":
        return (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp_min(1.0)
    positions = torch.arange(hidden.size(1), device=hidden.device).expand_as(attention_mask)
    attended = attention_mask.bool()
    if strategy == "last":
        index = torch.where(attended, positions, -1).max(dim=1).values.clamp_min(0)
    elif strategy == "cls":
        index = (
            torch.where(attended, positions, hidden.size(1)).min(dim=1).values.clamp_max(hidden.size(1) - 1)
        )
    else:
        raise ValueError(f"unknown pooling strategy {strategy!r}; expected one of {POOLING}")
    return hidden[torch.arange(hidden.size(0), device=hidden.device), index]


class RewardModel(nn.Module):
    """Backbone + pooling + dropout + linear head; rewards are divided by ``temperature``."""

    def __init__(self, config: RewardModelConfig, base_model: nn.Module | None = None):
        super().__init__()
        self.config = config
        backbone = base_model if base_model is not None else load_backbone(config.model_name)
        self.backbone_is_causal_lm = _is_causal_lm(backbone)
        # nn.Module types a submodule's attributes as Tensor | Module
        backbone_config = cast(PretrainedConfig, backbone.config)
        self.backbone_config = backbone_config
        hidden_size = backbone_config.hidden_size
        if config.use_lora:
            backbone = self._add_lora(backbone)
        self.backbone = backbone
        self.dropout = nn.Dropout(config.dropout_prob)
        self.head = self._build_head(hidden_size)

    def _add_lora(self, backbone: nn.Module) -> nn.Module:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=self.config.lora_rank,
            lora_alpha=self.config.lora_alpha,
            lora_dropout=self.config.lora_dropout,
            target_modules=self.config.lora_target_modules,
        )
        return get_peft_model(backbone, lora)

    def _build_head(self, hidden_size: int) -> nn.Module:
        return nn.Linear(hidden_size, self.config.num_labels)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def pooled_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if self.backbone_is_causal_lm:
            out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            hidden = out.hidden_states[-1]
        else:
            hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pooled = pool_hidden_states(hidden, attention_mask, self.config.pooling_strategy)
        return self.dropout(pooled.float())

    def forward(self, input_ids, attention_mask=None, return_dict: bool = True):
        pooled = self.pooled_features(input_ids, attention_mask)
        rewards = self.head(pooled) / self.config.temperature
        if self.config.num_labels == 1:
            rewards = rewards.squeeze(-1)
        return {"rewards": rewards, "hidden_states": pooled} if return_dict else rewards

    def score(self, input_ids, attention_mask=None) -> torch.Tensor:
        """One scalar per row (the reward used for preferences)."""
        rewards = self(input_ids, attention_mask, return_dict=True)["rewards"]
        return rewards if rewards.dim() == 1 else rewards[:, 0]

    def compute_preference_loss(self, chosen_ids, chosen_mask, rejected_ids, rejected_mask, margin=0.0):
        """Bradley-Terry loss ``-log sigmoid(r_chosen - r_rejected - margin)``, averaged."""
        chosen = self.score(chosen_ids, chosen_mask)
        rejected = self.score(rejected_ids, rejected_mask)
        margin = torch.as_tensor(margin, dtype=chosen.dtype, device=chosen.device)
        return -F.logsigmoid(chosen - rejected - margin).mean()

    @torch.no_grad()
    def predict_rewards(self, texts: Sequence[str], tokenizer, max_length: int = 512, batch_size: int = 8):
        """Scores for raw texts, in eval mode (restores the previous mode afterwards)."""
        was_training = self.training
        self.eval()
        scores: list[float] = []
        try:
            for start in range(0, len(texts), batch_size):
                enc = encode_texts(
                    tokenizer, list(texts[start : start + batch_size]), max_length, self.device
                )
                scores.extend(self.score(enc["input_ids"], enc["attention_mask"]).float().cpu().tolist())
        finally:
            self.train(was_training)
        return scores

    def extra_init_kwargs(self) -> dict:
        """Constructor arguments beyond the config (saved next to the weights)."""
        return {}

    @classmethod
    def from_pretrained(cls, path: str | Path) -> RewardModel:
        """Rebuild a model saved by :meth:`RewardModelTrainer.save_model` (safetensors + JSON)."""
        return load_reward_model(path, expected=cls)


class PairwiseRewardModel(RewardModel):
    """Scores how much A is preferred over B: ``r(A) - r(B)``, a Bradley-Terry logit."""

    def forward_pair(self, input_ids_a, attention_mask_a, input_ids_b, attention_mask_b) -> torch.Tensor:
        return self.score(input_ids_a, attention_mask_a) - self.score(input_ids_b, attention_mask_b)

    def compute_bradley_terry_loss(
        self, input_ids_a, attention_mask_a, input_ids_b, attention_mask_b, labels
    ) -> torch.Tensor:
        """Binary cross-entropy of ``sigmoid(r_a - r_b)`` against labels (1: A preferred, 0: B)."""
        logits = self.forward_pair(input_ids_a, attention_mask_a, input_ids_b, attention_mask_b)
        labels = torch.as_tensor(labels, dtype=logits.dtype, device=logits.device)
        return F.binary_cross_entropy_with_logits(logits, labels)


class MultiObjectiveRewardModel(RewardModel):
    """One linear head per objective on a shared backbone; ``combined_reward`` is their weighted sum."""

    head: nn.ModuleList
    objective_weights: torch.Tensor  # a buffer

    def __init__(
        self,
        config: RewardModelConfig,
        num_objectives: int = 3,
        objective_weights: Sequence[float] | None = None,
        base_model: nn.Module | None = None,
    ):
        if num_objectives < 1:
            raise ValueError(f"MultiObjectiveRewardModel.num_objectives must be >= 1, got {num_objectives}")
        weights = (
            [1.0 / num_objectives] * num_objectives if objective_weights is None else list(objective_weights)
        )
        if len(weights) != num_objectives:
            raise ValueError(
                f"MultiObjectiveRewardModel: {len(weights)} objective_weights for {num_objectives} objectives"
            )
        self.num_objectives = num_objectives
        super().__init__(config, base_model=base_model)
        self.register_buffer("objective_weights", torch.tensor(weights, dtype=torch.float32))

    def _build_head(self, hidden_size: int) -> nn.ModuleList:
        return nn.ModuleList(nn.Linear(hidden_size, 1) for _ in range(self.num_objectives))

    def objective_rewards(self, input_ids, attention_mask=None) -> torch.Tensor:
        pooled = self.pooled_features(input_ids, attention_mask)
        return torch.cat([head(pooled) for head in self.head], dim=-1) / self.config.temperature

    def combine_objectives(self, multi_rewards: torch.Tensor) -> torch.Tensor:
        """Weighted sum over the last axis, kept as ``[batch, 1]``."""
        return (multi_rewards * self.objective_weights).sum(dim=-1, keepdim=True)

    # spec 000's order, return_all_objectives before return_dict (positional callers rely on it)
    def forward(  # type: ignore[override]
        self, input_ids, attention_mask=None, return_all_objectives: bool = False, return_dict: bool = True
    ):
        rewards = self.objective_rewards(input_ids, attention_mask)
        combined = self.combine_objectives(rewards)
        if return_all_objectives:
            return {"rewards": rewards, "combined_reward": combined} if return_dict else rewards
        return (
            {"rewards": combined.squeeze(-1), "objective_rewards": rewards}
            if return_dict
            else combined.squeeze(-1)
        )

    def compute_multi_objective_loss(self, input_ids, attention_mask, target_rewards, objective_mask=None):
        """Squared error per objective over the entries ``objective_mask`` keeps.

        ``objective_mask`` is ``[num_objectives]`` (which objectives to train) or
        ``[batch, num_objectives]`` (which labels exist, e.g. a row rated only for safety).
        Returns the weighted sum over objectives and the per-objective losses (detached).
        """
        predictions = self.objective_rewards(input_ids, attention_mask)
        targets = torch.as_tensor(target_rewards, dtype=predictions.dtype, device=predictions.device)
        if targets.shape != predictions.shape:
            raise ValueError(
                f"compute_multi_objective_loss: target_rewards have shape {tuple(targets.shape)}, "
                f"expected {tuple(predictions.shape)}"
            )
        if objective_mask is None:
            mask = torch.ones_like(predictions)
        else:
            mask = torch.as_tensor(objective_mask, device=predictions.device).to(predictions.dtype)
            mask = mask.expand_as(predictions)
        squared = (predictions - targets) ** 2 * mask
        per_objective = squared.sum(0) / mask.sum(0).clamp_min(1.0)
        total = (per_objective * self.objective_weights).sum()
        return total, per_objective.detach()

    def extra_init_kwargs(self) -> dict:
        return {"num_objectives": self.num_objectives, "objective_weights": self.objective_weights.tolist()}


MODEL_CLASSES = {cls.__name__: cls for cls in (RewardModel, PairwiseRewardModel, MultiObjectiveRewardModel)}


def encode_texts(tokenizer, texts: list[str], max_length: int, device) -> dict[str, torch.Tensor]:
    """Tokenise with padding and truncation; gives a tokenizer without pad token its EOS."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    enc = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    return {"input_ids": enc["input_ids"].to(device), "attention_mask": enc["attention_mask"].to(device)}


def save_reward_model(model: RewardModel, path: str | Path, tokenizer=None) -> Path:
    """Write weights (safetensors), config JSON, backbone config and tokenizer into a folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_model(model, str(path / WEIGHTS_FILE))
    model.backbone_config.save_pretrained(path / BACKBONE_DIR)
    meta = {
        "class": type(model).__name__,
        "config": asdict(model.config),
        "backbone_is_causal_lm": model.backbone_is_causal_lm,
        "init_kwargs": model.extra_init_kwargs(),
    }
    (path / CONFIG_FILE).write_text(json.dumps(meta, indent=2))
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def _check_saved(path: Path) -> None:
    for name in (WEIGHTS_FILE, CONFIG_FILE):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path}: not a saved reward model ({name} missing)")


def load_reward_model(path: str | Path, expected: type[RewardModel] | None = None) -> RewardModel:
    """Rebuild the model class named in the saved JSON and load its safetensors weights."""
    path = Path(path)
    _check_saved(path)
    meta = json.loads((path / CONFIG_FILE).read_text())
    cls = MODEL_CLASSES.get(meta.get("class"))
    if cls is None:
        raise ValueError(f"{path / CONFIG_FILE}: unknown reward model class {meta.get('class')!r}")
    if expected is not None and not issubclass(cls, expected):
        raise TypeError(f"{path} holds a {cls.__name__}, not a {expected.__name__}")
    backbone_config = AutoConfig.from_pretrained(path / BACKBONE_DIR)
    factory = AutoModelForCausalLM if meta["backbone_is_causal_lm"] else AutoModel
    backbone = factory.from_config(backbone_config)
    model = cls(RewardModelConfig(**meta["config"]), base_model=backbone, **meta["init_kwargs"])
    safetensors.torch.load_model(model, str(path / WEIGHTS_FILE), strict=True)
    return model


class PairBatches:
    """Collates ``{"chosen", "rejected", "margin"}`` rows into padded token batches (chosen and
    rejected tokenised apart, each with its own padding)."""

    def __init__(self, tokenizer, max_length: int):
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        chosen = encode_texts(self.tokenizer, [r["chosen"] for r in rows], self.max_length, "cpu")
        rejected = encode_texts(self.tokenizer, [r["rejected"] for r in rows], self.max_length, "cpu")
        return {
            "chosen_input_ids": chosen["input_ids"],
            "chosen_attention_mask": chosen["attention_mask"],
            "rejected_input_ids": rejected["input_ids"],
            "rejected_attention_mask": rejected["attention_mask"],
            "margin": torch.tensor([float(r["margin"]) for r in rows]),
        }


class _EpochTally:
    """Loss and accuracy of the pairs seen in the current epoch, pair-weighted."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss, self.correct, self.pairs = 0.0, 0, 0

    def add(self, losses: torch.Tensor, chosen: torch.Tensor, rejected: torch.Tensor) -> None:
        self.loss += float(losses.detach().sum())
        self.correct += int((chosen > rejected).sum())
        self.pairs += len(losses)

    def close(self, epoch: int) -> dict[str, float]:
        metrics = {"epoch": epoch, "loss": self.loss / self.pairs, "accuracy": self.correct / self.pairs}
        self.reset()
        return metrics


class BradleyTerryTrainer(Trainer):
    """transformers' Trainer (the loop of every pipeline stage) with the Bradley-Terry loss of a
    research :class:`RewardModel`, tallied per epoch into the history the face returns."""

    def __init__(self, *args, history: list[dict[str, float]], **kwargs):
        super().__init__(*args, **kwargs)
        self.tally = _EpochTally()
        self.model_accepts_loss_kwargs = False  # the loop divides by the accumulation steps
        self.add_callback(_CloseEpoch(self, history))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        chosen = model.score(inputs["chosen_input_ids"], inputs["chosen_attention_mask"])
        rejected = model.score(inputs["rejected_input_ids"], inputs["rejected_attention_mask"])
        losses = -F.logsigmoid(chosen - rejected - inputs["margin"].to(chosen.dtype))
        if model.training:
            self.tally.add(losses, chosen, rejected)
        loss = losses.mean()
        return (loss, {"chosen": chosen, "rejected": rejected}) if return_outputs else loss


class _CloseEpoch(TrainerCallback):
    """At each epoch's end: the tally into the history and, through the loop's own log, to
    every callback (``epoch_loss``, ``epoch_accuracy``)."""

    def __init__(self, loop: BradleyTerryTrainer, history: list[dict[str, float]]):
        self.loop, self.history = loop, history

    def on_epoch_end(self, args, state, control, **kwargs):
        metrics = self.loop.tally.close(len(self.history))
        self.history.append(metrics)
        self.loop.log({"epoch_loss": metrics["loss"], "epoch_accuracy": metrics["accuracy"]})


class RewardModelTrainer:
    """Fits a reward model on preference pairs (Bradley-Terry) with transformers' Trainer:
    AdamW, constant learning rate after warmup, gradient accumulation and clipping."""

    def __init__(
        self,
        model: RewardModel,
        tokenizer,
        config: RewardModelConfig,
        device: torch.device | str | None = None,
        callbacks: Sequence[TrainerCallback] = (),
    ):
        """``callbacks``: transformers ``TrainerCallback``s that receive the loop's logs and each
        epoch's loss and accuracy (MLflow: :class:`~alignflow.registry.trainer_callback.TrackingCallback`)."""
        self.callbacks = list(callbacks)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model = model.to(self.device)
        self.tokenizer = tokenizer
        self.config = config
        self.global_step = 0
        self.history: list[dict[str, float]] = []

    @staticmethod
    def _validate_pairs(chosen_texts, rejected_texts, margins=None) -> None:
        if len(chosen_texts) != len(rejected_texts):
            raise ValueError(
                f"train_on_preferences: {len(chosen_texts)} chosen_texts "
                f"but {len(rejected_texts)} rejected_texts"
            )
        if not chosen_texts:
            raise ValueError("train_on_preferences: no preference pairs given")
        for name, texts in (("chosen_texts", chosen_texts), ("rejected_texts", rejected_texts)):
            for i, text in enumerate(texts):
                if not isinstance(text, str) or not text:
                    raise ValueError(f"{name}[{i}] must be a non-empty string, got {text!r}")
        if margins is not None and len(margins) != len(chosen_texts):
            raise ValueError(f"train_on_preferences: {len(margins)} margins for {len(chosen_texts)} pairs")

    def _loop_arguments(self, output_dir: str, num_epochs: int, batch_size: int):
        cfg = self.config
        return TrainingArguments(
            output_dir=output_dir,
            **loop_arguments(
                device=self.device,
                batch_size=batch_size,
                gradient_accumulation_steps=cfg.gradient_accumulation_steps,
                learning_rate=cfg.learning_rate,
                max_grad_norm=cfg.max_grad_norm,
                seed=cfg.seed,
                num_epochs=num_epochs,
            ),
            lr_scheduler_type="constant_with_warmup",
            warmup_steps=cfg.warmup_steps,
            save_strategy="no",
            remove_unused_columns=False,
        )

    def train_on_preferences(
        self,
        chosen_texts: Sequence[str],
        rejected_texts: Sequence[str],
        num_epochs: int = 3,
        batch_size: int = 8,
        margins: Sequence[float] | None = None,
    ) -> list[dict[str, float]]:
        """Bradley-Terry training; returns (and logs to the callbacks) loss and accuracy per epoch."""
        from datasets import Dataset as HFDataset

        self._validate_pairs(chosen_texts, rejected_texts, margins)
        pairs = HFDataset.from_dict(
            {
                "chosen": list(chosen_texts),
                "rejected": list(rejected_texts),
                "margin": [0.0] * len(chosen_texts) if margins is None else [float(m) for m in margins],
            }
        )
        with output_folder(None) as output_dir:
            loop = BradleyTerryTrainer(
                model=self.model,
                args=self._loop_arguments(output_dir, num_epochs, batch_size),
                train_dataset=pairs,
                data_collator=PairBatches(self.tokenizer, self.config.max_length),
                callbacks=self.callbacks,
                history=self.history,
            )
            loop.train()
        self.global_step += loop.state.global_step
        return self.history

    @torch.no_grad()
    def evaluate(self, chosen_texts, rejected_texts, batch_size: int = 8) -> dict[str, float]:
        """Pairwise accuracy, mean loss and mean margin on held-out pairs."""
        self._validate_pairs(chosen_texts, rejected_texts)
        chosen = torch.tensor(
            self.model.predict_rewards(chosen_texts, self.tokenizer, self.config.max_length, batch_size)
        )
        rejected = torch.tensor(
            self.model.predict_rewards(rejected_texts, self.tokenizer, self.config.max_length, batch_size)
        )
        diff = chosen - rejected
        return {
            "accuracy": (diff > 0).float().mean().item(),
            "loss": (-F.logsigmoid(diff)).mean().item(),
            "margin": diff.mean().item(),
        }

    def save_model(self, path: str | Path) -> Path:
        """Save into the folder ``path`` (created): safetensors weights, JSON config, tokenizer."""
        return save_reward_model(self.model, path, self.tokenizer)

    def load_model(self, path: str | Path) -> RewardModel:
        """Load weights saved by :meth:`save_model` into this trainer's model (same architecture)."""
        path = Path(path)
        _check_saved(path)
        safetensors.torch.load_model(
            self.model, str(path / WEIGHTS_FILE), strict=True, device=str(self.device)
        )
        return self.model
