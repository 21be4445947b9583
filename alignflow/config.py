"""The pipeline configuration: one typed object for the whole chain.

Loaded from YAML, overridable per key (``--set sft.max_steps=10``), and hashed so that
an unchanged config can be recognised downstream (Prefect cache keys, MLflow tags).
Each section's model lives beside the code it configures; this module only assembles.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, TypedDict

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from alignflow.data.config import DataConfig
from alignflow.errors import InputError
from alignflow.evaluation.config import EvaluationConfig
from alignflow.models.model_config import ModelSpec
from alignflow.registry.promotion_config import PromotionConfig
from alignflow.runtime_config import OrchestrationConfig, TrackingConfig
from alignflow.training.policy_config import PolicyConfig
from alignflow.training.registry import REWARD_STAGE_REF, config_sections


class PipelineConfig(BaseModel):
    """Every section of a pipeline run; unknown keys are an error, not a silent no-op.

    Besides the fixed sections below, there is one section per registered training stage
    (``sft``, ``reward``, ``dpo``, ``grpo``, ``ppo`` and any plugin's), typed by the
    stage's own config class (:mod:`alignflow.training.registry`): ``config.dpo.beta``.
    """

    model_config = ConfigDict(extra="allow")

    project: str = Field("alignflow", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    seed: int = 0
    output_dir: str = "outputs"
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelSpec = Field(default_factory=ModelSpec)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    promotion: PromotionConfig = Field(default_factory=PromotionConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig)

    @model_validator(mode="before")
    @classmethod
    def _stage_sections(cls, data: Any) -> Any:
        """Validate each registered stage's section with its class; refuse any other key."""
        if not isinstance(data, dict):
            return data
        sections = config_sections()
        unknown = sorted(set(data) - set(cls.model_fields) - set(sections))
        if unknown:
            known = sorted([*cls.model_fields, *sections])
            raise ValueError(f"unknown config section(s) {unknown}; known sections: {known}")
        return {**data, **{name: _section(name, kind, data.get(name)) for name, kind in sections.items()}}

    def section(self, name: str) -> BaseModel:
        """A stage's config section by name (``config.section(config.policy.algorithm)``)."""
        return getattr(self, name)


def _section(name: str, kind: type[BaseModel], value: Any) -> BaseModel:
    """One stage section, its validation errors located under the section's name."""
    if isinstance(value, kind):
        return value
    try:
        return kind.model_validate(value or {})
    except ValidationError as exc:
        raise ValidationError.from_exception_data(
            "PipelineConfig",
            [
                {"type": e["type"], "loc": (name, *e["loc"]), "input": e["input"], **_ctx(e)}
                for e in exc.errors()
            ],
        ) from exc


class _Ctx(TypedDict, total=False):
    """The optional ``ctx`` key of an error, typed so it can be unpacked into pydantic's InitErrorDetails."""

    ctx: dict[str, Any]


def _ctx(error: ErrorDetails) -> _Ctx:
    return {"ctx": error["ctx"]} if "ctx" in error else {}


class ConfigError(InputError):
    """A config file or override that cannot be applied; the message names the key."""


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not key=value")
    key, raw = item.split("=", 1)
    if not key.strip():
        raise ConfigError(f"override {item!r} has an empty key")
    return key.strip().split("."), yaml.safe_load(raw) if raw else ""


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set dotted keys in a nested dict; values are parsed as YAML scalars."""
    for item in overrides:
        path, value = _parse_override(item)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return data


DEFAULT_CONFIG = Path(__file__).parent / "configs" / "demo.yaml"


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Read a YAML config and apply overrides; with no ``path``, the embedded default: the demo.

    The demo is the one configuration known to train a policy that can do its task on any
    machine in minutes, so a bare ``alignflow run`` never crowns an untrained model.
    """
    path = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read config: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config must be a mapping of sections")
    data = apply_overrides(data, overrides or [])
    try:
        return PipelineConfig.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def with_reward_model(config_json: dict[str, Any], reward_dir: str) -> dict[str, Any]:
    """Every setting whose value is exactly ``@reward`` (PPO's reward model, a GRPO reward
    function's path, a plug-in stage's own field) set to ``reward_dir``; nothing else changes."""

    def swap(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: swap(item) for key, item in value.items()}
        if isinstance(value, list):
            return [swap(item) for item in value]
        return reward_dir if value == REWARD_STAGE_REF else value

    return swap(config_json)


def config_hash(config: BaseModel) -> str:
    """A stable short hash of a config's content (key order does not matter)."""
    canonical = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
