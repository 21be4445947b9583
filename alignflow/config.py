"""The pipeline configuration: one typed object for the whole chain.

Loaded from YAML, overridable per key (``--set sft.max_steps=10``), and hashed so that
an unchanged config can be recognised downstream (Prefect cache keys, MLflow tags).
Each section's model lives beside the code it configures; this module only assembles.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import ErrorDetails

from alignflow.data.config import DataConfig
from alignflow.errors import InputError
from alignflow.evaluation.config import EvaluationConfig
from alignflow.models.model_config import ModelSpec
from alignflow.promotion.promotion_config import PromotionConfig
from alignflow.runtime_config import OrchestrationConfig, TrackingConfig
from alignflow.training.policy_config import PolicyConfig
from alignflow.training.registry import REWARD_STAGE_REF, config_sections

SectionT = TypeVar("SectionT", bound=BaseModel)


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

    def section_as(self, name: str, kind: type[SectionT]) -> SectionT:
        """A stage's section as its own class, so that a type checker knows its fields."""
        section = self.section(name)
        if not isinstance(section, kind):
            raise TypeError(f"config section {name!r} is a {type(section).__name__}, not a {kind.__name__}")
        return section


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
    """A config file or override that cannot be applied: one line naming where it came from
    (``--set dpo.betaa=0.2``, or the file with line and column), what is wrong and the fix."""


def set_flag(item: str) -> str:
    """How the command line names an override in a message: as the user typed it."""
    return f"--set {item}"


OverrideNamer = Callable[[str], str]  # an override ``key=value`` -> how its source is named


def _parse_override(item: str, named: OverrideNamer = set_flag) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"{named(item)}: not key=value; write it as --set section.key=value")
    key, raw = item.split("=", 1)
    if not key.strip():
        raise ConfigError(f"{named(item)}: the key is empty; write it as --set section.key=value")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "not a YAML value"
        raise ConfigError(
            f"{named(item)}: cannot parse the value: {problem}; quote it if it is text"
        ) from exc
    return key.strip().split("."), value


def apply_overrides(
    data: dict[str, Any],
    overrides: list[str],
    set_by: dict[tuple[str, ...], str] | None = None,
    named: OverrideNamer = set_flag,
) -> dict[str, Any]:
    """Set dotted keys in a nested dict; values are parsed as YAML scalars. ``set_by``, when
    given, records which override set each dotted key, as ``named`` names it (messages say it)."""
    for item in overrides:
        path, value = _parse_override(item, named)
        node = data
        for depth, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(path[: depth + 1])
                raise ConfigError(
                    f"{named(item)}: {where} is a value, not a section; set {where}=VALUE instead"
                )
            node = child
        node[path[-1]] = value
        if set_by is not None:
            set_by[tuple(path)] = named(item)
    return data


DEFAULT_CONFIG = Path(__file__).parent / "configs" / "demo.yaml"


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, named: OverrideNamer = set_flag
) -> PipelineConfig:
    """Read a YAML config and apply overrides; with no ``path``, the embedded default: the demo.

    The demo is the one configuration known to train a policy that can do its task on any
    machine in minutes, so a bare ``alignflow run`` never crowns an untrained model. ``named``
    says how an error names an override: ``--set k=v`` on the command line, the request's
    field in the HTTP API.
    """
    path = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(
            f"{path}: no such config file; pass an existing YAML (configs/ holds the shipped ones), "
            "or leave --config out for the built-in demo"
        ) from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{_yaml_position(path, exc)}: not valid YAML: {_yaml_problem(exc)}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config must be a mapping of sections (section: {{key: value}})")
    set_by: dict[tuple[str, ...], str] = {}
    data = apply_overrides(data, overrides or [], set_by, named)
    located = _Located(path, text, set_by)
    unknown = sorted(set(data) - set(PipelineConfig.model_fields) - set(config_sections()))
    if unknown:
        raise ConfigError("; ".join(located.describe_unknown((name,)) for name in unknown))
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(located.describe(exc.errors())) from exc
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


def _yaml_problem(exc: yaml.YAMLError) -> str:
    return " ".join(str(getattr(exc, "problem", None) or exc).split())


def _yaml_position(path: Path, exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)


def _as_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (through ``X | None`` and other unions), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        model = _as_model(arg)
        if model is not None:
            return model
    return None


def _keys_of(model: type[BaseModel]) -> dict[str, Any]:
    """A model's keys as a config may spell them (field names and aliases) -> annotation."""
    keys: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        keys[name] = field.annotation
        if field.alias:
            keys[field.alias] = field.annotation
    return keys


def known_keys(parent: tuple[str, ...]) -> list[str] | None:
    """The keys a config may hold under the dotted ``parent`` (``()``: the sections); None
    where the config does not fix them (a mapping such as ``orchestration.work_pools``)."""
    keys: dict[str, Any] = {**_keys_of(PipelineConfig), **config_sections()}
    for part in parent:
        model = _as_model(keys.get(part))
        if model is None:
            return None
        keys = _keys_of(model)
    return sorted(keys)


def closest_key(loc: tuple[str, ...]) -> str | None:
    """The known dotted key nearest to a misspelt one (``dpo.betaa`` -> ``dpo.beta``)."""
    siblings = known_keys(loc[:-1])
    if siblings:
        match = difflib.get_close_matches(loc[-1], siblings, n=1, cutoff=0.6)
        if match:
            return ".".join([*loc[:-1], match[0]])
    # the right key in another section (``--set beta=0.1``, ``--set sft.beta=0.1``)
    everywhere = [
        f"{section}.{key}"
        for section in known_keys(()) or []
        for key in known_keys((section,)) or []
        if key == loc[-1]
    ]
    if len(everywhere) > 1:
        return "one of " + ", ".join(everywhere)
    return everywhere[0] if everywhere else None


def _dotted(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


class _Located:
    """Where each key of a loaded config came from: an override (``set_by``: as it is named in
    messages), or a line of the file."""

    def __init__(self, path: Path, text: str, set_by: dict[tuple[str, ...], str]):
        self.path, self.text, self.set_by = path, text, set_by
        packaged = Path(__file__).parent.parent
        self.name = (
            str(path) if path != DEFAULT_CONFIG else f"the default config ({path.relative_to(packaged)})"
        )

    def source(self, loc: tuple[Any, ...], message: str = "") -> str:
        """What set the key at ``loc``: the override that set it (or a key under it that the
        message names, or that the file does not hold), else the file, line and column."""
        keys = tuple(str(part) for part in loc)
        for path, item in reversed(self.set_by.items()):  # the last override of a key wins
            if keys[: len(path)] == path:
                return item
        inside = [(path, item) for path, item in self.set_by.items() if path[: len(keys)] == keys]
        for path, item in reversed(inside):
            if ".".join(path) in message:
                return item
        position, found = self._position(loc)
        if inside and not found:
            return inside[-1][1]
        return position + (f" (with {inside[-1][1]})" if inside else "")

    def _position(self, loc: tuple[Any, ...]) -> tuple[str, bool]:
        """``file:line:column`` of the deepest key of ``loc`` that the file holds, and whether
        it holds the whole of ``loc``."""
        try:
            node = yaml.compose(self.text)
        except yaml.YAMLError:
            node = None
        mark, depth = None, 0
        for part in loc:
            child = None
            if isinstance(node, yaml.MappingNode):
                for key, value in node.value:
                    if key.value == str(part):
                        mark, child = key.start_mark, value
                        break
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                child = node.value[part]
                mark = child.start_mark
            if child is None:
                break
            node, depth = child, depth + 1
        if mark is None:
            return self.name, not loc
        return f"{self.name}:{mark.line + 1}:{mark.column + 1}", depth == len(loc)

    def describe_unknown(self, loc: tuple[Any, ...]) -> str:
        dotted = _dotted(loc)
        what = f"unknown config section {dotted!r}" if len(loc) == 1 else f"unknown key {dotted}"
        suggestion = closest_key(tuple(str(part) for part in loc))
        if suggestion:
            fix = f"did you mean {suggestion}?"
        else:
            known = known_keys(tuple(str(part) for part in loc[:-1])) or []
            fix = f"known {'sections' if len(loc) == 1 else 'keys'}: {', '.join(known)}"
        return f"{self.source(loc)}: {what}; {fix}"

    def describe(self, errors: list[ErrorDetails]) -> str:
        """Every validation error on one line: its source, the key, what is wrong (and the fix)."""
        parts = []
        for error in errors:
            loc = tuple(part for part in error["loc"] if isinstance(part, int | str))
            if error["type"] == "extra_forbidden":
                parts.append(self.describe_unknown(loc))
                continue
            message = error["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
            dotted = _dotted(loc)
            named = not loc or message.startswith((f"{dotted}.", f"{dotted}:", f"{dotted} "))
            what = message if named else f"{dotted}: {message}"
            shown = error.get("input")
            if loc and not isinstance(shown, dict | list):
                what += f" (got {shown!r})"
            parts.append(f"{self.source(loc, message)}: {what}")
        return "; ".join(" ".join(part.split()) for part in parts)


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
