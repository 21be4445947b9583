"""Typed configuration of the GRPO stage and its reward functions."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from alignflow.training.stage_config import HeldOutSchedule, StageConfig


class RewardFunctionSpec(BaseModel):
    """One reward signal: a demo verifier, a trained reward model, or user code."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["correctness", "format", "reward_model", "python"]
    path: str | None = Field(
        None, description="reward_model: a saved reward model dir; python: 'module:attribute'"
    )
    weight: float = 1.0
    normalize: bool = Field(True, description="reward_model: apply the saved mean/std")

    @model_validator(mode="after")
    def _path_when_needed(self) -> RewardFunctionSpec:
        if self.kind in {"reward_model", "python"} and not self.path:
            raise ValueError(f"grpo.reward_functions: kind {self.kind!r} needs a 'path'")
        if self.kind == "python" and ":" not in (self.path or ""):
            raise ValueError(f"grpo.reward_functions: python path {self.path!r} must be 'module:attribute'")
        return self


class GRPOConfig(StageConfig, HeldOutSchedule):
    """Group-relative policy optimisation on prompts, scored by the configured reward functions;
    its held-out measure is their mean over greedy answers to the eval prompts."""

    learning_rate: float = Field(5e-4, gt=0)
    per_device_train_batch_size: int = Field(16, ge=1)
    num_generations: int = Field(4, ge=2)
    max_completion_length: int = Field(12, ge=1)
    temperature: float = Field(1.0, gt=0)
    beta: float = Field(0.0, ge=0.0, description="KL coefficient against the reference (0: no reference)")
    loss_type: str = "dapo"
    scale_rewards: str | bool = "group"
    reward_functions: list[RewardFunctionSpec] = Field(
        default_factory=lambda: [RewardFunctionSpec(kind="correctness"), RewardFunctionSpec(kind="format")],
        min_length=1,
    )
    environment: str | None = Field(None, description="'module:attribute' of a TRL environment factory")
    cache_implementation: Literal["dynamic", "static"] | None = Field(
        None,
        description="the KV cache TRL's GRPOTrainer generates with (its cache_implementation): None or "
        "'dynamic' is transformers' growing cache (today's behaviour, the default); 'static' allocates "
        "prompt + max_completion_length positions once, which is what a compiled decoding step needs. "
        "On its own it is no faster: TRL builds its GenerationConfig with disable_compile=True, so "
        "generate compiles nothing (see compile_generation). Not used with vLLM",
    )
    merged_generation: bool = Field(
        True,
        description="with LoRA, sample from a copy of the policy whose adapters are folded into its "
        "weights (refreshed before each generation) instead of through the adapter layers: the same "
        "policy, decoded at the base model's speed, for one more copy of the weights in memory. "
        "Ignored with vLLM and where other parameters than the adapters train",
    )
    compile_generation: bool = Field(
        False,
        description="let transformers' generate compile its decoding step (torch.compile, CUDA graphs) by "
        "lifting the disable_compile=True TRL sets; needs cache_implementation='static' and acts on CUDA "
        "only (generate compiles nothing on the CPU). Off by default: a one-off compile on the first "
        "generation, weighed in bench/results/gpu_trl.md",
    )

    @model_validator(mode="after")
    def _batch_fits_groups(self) -> GRPOConfig:
        if self.per_device_train_batch_size % self.num_generations:
            raise ValueError(
                f"grpo.per_device_train_batch_size ({self.per_device_train_batch_size}) must be a multiple "
                "of "
                f"grpo.num_generations ({self.num_generations})"
            )
        if self.compile_generation and self.cache_implementation != "static":
            raise ValueError(
                "grpo.compile_generation needs grpo.cache_implementation='static' "
                f"(got {self.cache_implementation!r}): only a static cache lets generate compile"
            )
        return self
