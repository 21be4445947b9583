"""Spec 002's settings in the pipeline's terms: ``PipelineConfig`` overrides, one key each.

The Python API trains through the pipeline's own stages, so its dataclasses are only
translated, never interpreted a second time: each field becomes the ``section.key`` the
stage reads (``cliprange`` -> ``ppo.clip_param``, ``batch_size`` ->
``ppo.batch_size``, ...). Values are written as JSON, which YAML reads
back unchanged, so a model name or path is never mistaken for a number or a boolean.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from alignflow.rlhf.training_config import RewardModelConfig, TrainingConfig

DTYPE_OF_PRECISION = {"no": "float32", "fp16": "float16", "bf16": "bfloat16"}


def setting(key: str, value: Any) -> str:
    return f"{key}={json.dumps(value)}"


def model_settings(
    base_model: str, use_lora: bool, r: int, alpha: int, dropout: float, mixed_precision: str | None
) -> list[str]:
    """``model.*``: which model, LoRA on or off, and the weights' dtype."""
    items = [
        setting("model.name", base_model),
        setting("model.lora.enabled", use_lora),
        setting("model.lora.r", r),
        setting("model.lora.alpha", alpha),
        setting("model.lora.dropout", dropout),
    ]
    if mixed_precision is not None:
        items.append(setting("model.dtype", DTYPE_OF_PRECISION[mixed_precision]))
    return items


def reward_steps(reward: RewardModelConfig, train_rows: int) -> int:
    """``num_epochs`` passes over ``train_rows`` rows, in optimiser steps (the stage counts steps)."""
    return max(1, math.ceil(train_rows / reward.batch_size) * reward.num_epochs)


def reward_settings(
    reward: RewardModelConfig,
    mode: str,
    train_rows: int,
    device: str = "auto",
    mixed_precision: str | None = None,
) -> list[str]:
    """The reward stage's config for ``reward`` on ``train_rows`` rows of the given ``mode``."""
    steps = reward_steps(reward, train_rows)
    items = [
        setting("seed", reward.seed),
        *model_settings(
            reward.base_model,
            reward.use_lora,
            reward.lora_r,
            reward.lora_alpha,
            reward.lora_dropout,
            mixed_precision,
        ),
        setting("reward.mode", mode),
        setting("reward.backbone", "policy"),
        setting("reward.learning_rate", reward.learning_rate),
        setting("reward.per_device_train_batch_size", reward.batch_size),
        setting("reward.max_steps", steps),
        setting("reward.save_steps", steps),
        setting("reward.max_length", reward.max_length),
        setting("reward.warmup_ratio", 0.0),
    ]
    if device == "cpu":
        items.append(setting("reward.extra_args", {"use_cpu": True}))
    return items


def ppo_settings(config: TrainingConfig, reward_dir: str | Path, device: str) -> list[str]:
    """The PPO stage's config: spec 002's PPO and sampling fields, the reward model to maximise."""
    return [
        setting("seed", config.seed),
        *model_settings(
            config.base_model,
            config.use_lora,
            config.lora_r,
            config.lora_alpha,
            config.lora_dropout,
            config.mixed_precision,
        ),
        setting("ppo.learning_rate", config.learning_rate),
        setting("ppo.num_iterations", config.max_steps),
        setting("ppo.batch_size", config.batch_size),
        setting("ppo.mini_batch_size", config.mini_batch_size),
        setting("ppo.num_epochs", config.ppo_epochs),
        setting("ppo.gradient_accumulation_steps", config.gradient_accumulation_steps),
        setting("ppo.kl_coef", config.init_kl_coef),
        setting("ppo.target_kl", config.target_kl),
        setting("ppo.gamma", config.gamma),
        setting("ppo.gae_lambda", config.lam),
        setting("ppo.clip_param", config.cliprange),
        setting("ppo.value_loss_coef", config.vf_coef),
        setting("ppo.max_new_tokens", config.max_new_tokens),
        setting("ppo.temperature", config.temperature),
        setting("ppo.max_length", config.max_prompt_length + config.max_new_tokens),
        setting("ppo.top_k", config.top_k),
        setting("ppo.top_p", config.top_p),
        setting("ppo.device", device),
        setting("ppo.reward_model", str(reward_dir)),
        setting("ppo.verifiable_rewards", []),
    ]


def _key(item: str) -> str:
    return item.split("=", 1)[0].strip()


def pipeline_config(plan_settings: list[str], settings: list[str]) -> Any:
    """The embedded default pipeline config with the plan's settings, then these, applied.

    A plan setting whose key ``settings`` sets too is left out rather than overwritten:
    the plan names the reward model ``@reward``, a placeholder for the folder known here.
    """
    from alignflow.config import load_config

    ours = {_key(item) for item in settings}
    return load_config(None, [*(i for i in plan_settings if _key(i) not in ours), *settings])
