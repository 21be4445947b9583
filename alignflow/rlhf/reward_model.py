"""A trained reward model as a torch module that users can subclass, and spec 002's Step 1.

:class:`RewardModel` wraps what the reward stage saves (a sequence-classification model,
its tokenizer and ``alignflow_reward.json``). Its ``forward(input_ids, attention_mask)``
returns one reward per row on the model's own scale (a regression model predicts the
normalised score); a subclass overrides ``forward`` to reshape rewards, and
:meth:`RewardModel.score` (text in, rewards out) always goes through ``forward``, so the
override is what scores PPO's rollouts when the model is handed to ``RLHFTrainer``.

:func:`train_reward_model` trains through the reward stage, never a second trainer.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
from torch import nn

from alignflow.models.reward_scorer import (
    RewardMeta,
    combine_heads,
    encode_reward_input,
    padded_span_mask,
    reward_logits,
)

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from alignflow.rlhf.training_config import RewardModelConfig

R = TypeVar("R", bound="RewardModel")


class RewardModel(nn.Module):
    """Token ids in, one reward per row out (a 1-D tensor); ``score`` does text in, floats out."""

    def __init__(self, model: nn.Module, tokenizer: Any, meta: RewardMeta | None = None):
        super().__init__()
        # a transformers model (PEFT-wrapped or not): nn.Module's typing has no config or save_pretrained
        self.model: Any = model
        self.tokenizer = tokenizer
        self.meta = meta or RewardMeta(mode="regression")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        config = cast("PretrainedConfig", model.config)
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = tokenizer.pad_token_id
        self.metrics: dict[str, float] = dict(self.meta.metrics)
        self.eval()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, answer_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The model's reward for each row: its objective heads' weighted sum, unnormalised
        (``answer_mask``, from :meth:`encode`, only for a model pooled over the answer)."""
        logits = reward_logits(self.model, input_ids, attention_mask, self.meta.pooling, answer_mask).float()
        return combine_heads(logits, self.meta.weights)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def encode(self, prompts: Sequence[Any], responses: Sequence[Any]) -> dict[str, torch.Tensor]:
        """A padded batch of (prompt, response) rows, encoded as the reward stage trained on them."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        with_span = self.meta.pooling == "answer"
        encoded = [
            encode_reward_input(self.tokenizer, p, r, self.meta.max_length, with_span)
            for p, r in zip(prompts, responses, strict=True)
        ]
        rows = [ids for ids, _ in encoded]
        batch = self.tokenizer.pad([{"input_ids": ids} for ids in rows], return_tensors="pt", padding=True)
        out = {
            "input_ids": batch["input_ids"].to(self.device),
            "attention_mask": batch["attention_mask"].to(self.device),
        }
        if with_span:
            spans: list[tuple[int, int]] = []
            for _, span in encoded:
                assert span is not None  # with_span: every answer was located
                spans.append(span)
            mask = padded_span_mask(self.tokenizer, rows, spans, out["input_ids"].shape[1])
            out["answer_mask"] = mask.to(self.device)
        return out

    @torch.no_grad()
    def score(self, prompts: Sequence[Any], responses: Sequence[Any], batch_size: int = 32) -> list[float]:
        """Rewards of ``responses`` to ``prompts``, through :meth:`forward` (so overrides apply)."""
        was_training = self.training
        self.eval()
        rewards: list[float] = []
        try:
            for start in range(0, len(prompts), batch_size):
                batch = self.encode(
                    prompts[start : start + batch_size], responses[start : start + batch_size]
                )
                out = self(**batch)
                rows = batch["input_ids"].shape[0]
                if not isinstance(out, torch.Tensor) or tuple(out.shape) != (rows,):
                    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                    raise ValueError(
                        f"{type(self).__name__}.forward must return one reward per row "
                        f"(a tensor of shape ({rows},)), got {shape}"
                    )
                rewards.extend(float(r) for r in out.float().cpu())
        finally:
            self.train(was_training)
        return rewards

    @classmethod
    def from_pretrained(cls: type[R], path: str | Path, device: str | torch.device | None = None) -> R:
        """Load a reward model saved by the reward stage or :meth:`save_pretrained`, as ``cls``."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = Path(path)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path}: not a saved reward model (no config.json)")
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, use_safetensors=True)
        reward_model = cls(model, tokenizer, RewardMeta.load(path))
        return reward_model.to(device) if device is not None else reward_model

    def save_pretrained(self, path: str | Path) -> Path:
        """Weights (safetensors), tokenizer and reward metadata: a folder the pipeline's scorer loads."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
        self.meta.save(path)
        return path


# ---------------------------------------------------------------- Step 1: training one


@contextmanager
def _work_dir(output_dir: str | Path | None) -> Iterator[Path]:
    if output_dir is not None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        yield Path(output_dir)
        return
    path = Path(tempfile.mkdtemp(prefix="alignflow-reward-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _start_model(base_model: str, tokenizer: Any, work: Path, spec: Any) -> str | None:
    """For ``tiny``: a fresh small model built around the caller's tokenizer; else the stage loads
    ``base_model`` itself (its own tokenizer, which must be the one the datasets used)."""
    from alignflow.models.factory import init_tiny_model
    from alignflow.models.model_config import TINY

    if base_model != TINY:
        return None
    target = work / "base-model"
    if not (target / "model.safetensors").exists():
        init_tiny_model(tokenizer, target, spec)
    return str(target)


def train_reward_model(
    train_dataset: Any,
    val_dataset: Any,
    config: RewardModelConfig,
    tokenizer: Any,
    output_dir: str | Path | None = None,
) -> RewardModel:
    """Regress the datasets' normalised scores (MSE) with the reward stage; returns the model.

    The stage's files (snapshot, checkpoints, saved model) go to ``output_dir``, or to a
    temporary folder removed afterwards. ``model.metrics`` holds the stage's metrics
    (``eval/mse`` on ``val_dataset``, ``train_loss``).
    """
    from alignflow.data.snapshot import write_split
    from alignflow.rlhf.pipeline import pipeline_config, reward_settings, setting
    from alignflow.training.reward import run_reward

    if len(train_dataset) == 0:
        raise ValueError("train_reward_model: the training dataset is empty")
    with _work_dir(output_dir) as work:
        data_dir = work / "data"
        write_split(data_dir, "train", train_dataset.snapshot_records())
        write_split(data_dir, "eval", val_dataset.snapshot_records() if val_dataset is not None else [])
        # rows are cut to the length the datasets were encoded with
        settings = reward_settings(config, "regression", len(train_dataset))
        settings.append(setting("reward.max_length", train_dataset.max_length))
        pipeline = pipeline_config([], settings)
        start = _start_model(config.base_model, tokenizer, work, pipeline.model)
        result = run_reward(pipeline, data_dir, work / "reward", model_path=start)
        model = RewardModel.from_pretrained(result.model_dir)
    model.metrics.update(result.metrics)
    return model
