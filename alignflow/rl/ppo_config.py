"""PPO's hyper-parameters (torch-free: the pipeline's PPO section is this class, extended)."""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

DEFAULT_OUTPUT_DIR = "ppo_output"  # where save_every writes when output_dir is not set (cwd-relative)


def _alias(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class PPOConfig(BaseModel):
    """PPO hyper-parameters. Both spec documents' names are accepted (``ppo_epochs`` for
    ``num_epochs``, ``lam`` for ``gae_lambda``, ``clip_ratio`` for ``clip_param``, ...), and the
    trainer-generic ones of the pipeline (``max_steps``, ``per_device_train_batch_size``,
    ``save_steps``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    model_name: str | None = None
    learning_rate: float = Field(1e-5, gt=0)
    batch_size: int = Field(16, ge=1, validation_alias=_alias("batch_size", "per_device_train_batch_size"))
    mini_batch_size: int = Field(4, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    num_epochs: int = Field(4, ge=1, validation_alias=_alias("num_epochs", "ppo_epochs"))
    clip_param: float = Field(0.2, gt=0, validation_alias=_alias("clip_param", "clip_ratio"))
    value_clip: float | None = Field(None, gt=0)
    kl_coef: float = Field(0.1, ge=0, validation_alias=_alias("kl_coef", "kl_penalty_coef"))
    target_kl: float = Field(0.01, gt=0, validation_alias=_alias("target_kl", "kl_target"))
    kl_horizon: int = Field(10000, ge=1)
    use_adaptive_kl: bool = True
    entropy_coef: float = Field(0.01, ge=0)
    value_loss_coef: float = Field(0.5, ge=0, validation_alias=_alias("value_loss_coef", "value_coef"))
    gamma: float = Field(0.99, ge=0, le=1)
    gae_lambda: float = Field(0.95, ge=0, le=1, validation_alias=_alias("gae_lambda", "lam"))
    max_grad_norm: float | None = 1.0
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW's, on the trainable parameters")
    lr_scheduler_type: str | None = Field(
        None,
        description="a transformers scheduler name (linear, cosine...) over every optimiser step; None: none",
    )
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="of the optimiser steps, with a scheduler")
    normalize_advantages: bool = True
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    num_iterations: int = Field(
        100, ge=1, validation_alias=_alias("num_iterations", "iterations", "max_steps")
    )
    save_every: int = Field(
        0,
        ge=0,
        description="checkpoint every N iterations (0: never)",
        validation_alias=_alias("save_every", "save_steps"),
    )
    eval_every: int = Field(
        0, ge=0, description="mean reward on held-out prompts every N iterations (0: never)"
    )
    eval_fraction: float = Field(0.1, gt=0, lt=1, description="prompts held out when none are given")
    save_total_limit: int | None = Field(None, ge=1, description="checkpoints kept (the newest); None: all")
    output_dir: str | None = Field(None, description=f"checkpoints; None: ./{DEFAULT_OUTPUT_DIR}")
    seed: int = 0
    device: str | None = None
