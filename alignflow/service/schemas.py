"""Request and response bodies of the HTTP API: snake_case in Python, camelCase on the wire."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)
from pydantic.alias_generators import to_camel

from alignflow.training.registry import registered_policy

MAX_TEXT = 32_000
MAX_SHORT = 200


def _storable(text: str) -> str:
    """Reject what a database cannot keep: NUL characters and lone UTF-16 surrogates."""
    if "\x00" in text:
        raise ValueError("must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("must be valid Unicode (no lone surrogates)") from exc
    return text


def _as_utc(value: datetime) -> datetime:
    """SQLite hands back naive timestamps; every time the service stores is UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]
Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(_storable)]
ShortText = Annotated[str, Field(min_length=1, max_length=MAX_SHORT), AfterValidator(_storable)]
Notes = Annotated[str, Field(max_length=MAX_TEXT), AfterValidator(_storable)]


class ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class ScoredFeedbackIn(ApiModel):
    """A rating of one response, 0 (bad) to 1 (excellent)."""

    prompt: Text
    response: Text
    score: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    run_id: ShortText | None = None
    notes: Notes | None = None


class PairwiseFeedbackIn(ApiModel):
    """A comparison: ``chosen`` was preferred over ``rejected`` for the same prompt."""

    prompt: Text
    chosen: Text
    rejected: Text
    run_id: ShortText | None = None
    notes: Notes | None = None


def _feedback_shape(value: Any) -> str:
    """A body naming ``chosen`` or ``rejected`` is a comparison; anything else a rating."""
    if isinstance(value, dict):
        return "pairwise" if ("chosen" in value or "rejected" in value) else "scored"
    return "pairwise" if isinstance(value, PairwiseFeedbackIn) else "scored"


FeedbackIn = Annotated[
    Annotated[ScoredFeedbackIn, Tag("scored")] | Annotated[PairwiseFeedbackIn, Tag("pairwise")],
    Discriminator(_feedback_shape),
]


class FeedbackOut(ApiModel):
    id: str
    agent_id: str
    kind: Literal["scored", "pairwise"]
    score: float | None
    created_at: UtcDatetime


class TrainPolicyIn(ApiModel):
    """What a training job may choose; anything left out comes from the service's config.

    ``algorithm`` left out follows the feedback (ratings: PPO on a regression reward model;
    comparisons: DPO). LoRA settings need ``useLora: true``; an unknown field is a 422.
    """

    dry_run: bool = False
    max_steps: int | None = Field(None, ge=1, le=100_000)
    learning_rate: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    base_model: ShortText | None = Field(
        None, description="'tiny', a preset, a local folder or a cached hub id"
    )
    use_lora: bool | None = None
    lora_r: int | None = Field(None, ge=1, le=1024)
    lora_alpha: int | None = Field(None, ge=1, le=4096)
    lora_dropout: float | None = Field(None, ge=0.0, lt=1.0, allow_inf_nan=False)
    batch_size: int | None = Field(None, ge=1, le=4096)
    algorithm: Annotated[str, AfterValidator(registered_policy)] | None = Field(
        None, description="a registered policy algorithm (dpo, ppo, grpo, ...)"
    )

    @model_validator(mode="after")
    def _lora_settings_need_lora(self) -> TrainPolicyIn:
        given = [name for name in ("lora_r", "lora_alpha", "lora_dropout") if getattr(self, name) is not None]
        if given and not self.use_lora:
            names = ", ".join(to_camel(n) for n in given)
            raise ValueError(f"{names} only apply with useLora: true")
        return self


class DryRunOut(ApiModel):
    status: Literal["dry_run"] = "dry_run"
    feedback_count: int
    estimated_steps: int
    estimated_time_minutes: float
    estimate_basis: str = Field(
        description="where the time estimate comes from: measured runs or the default"
    )
    score_mean: float | None
    score_std: float | None
    plan: str = Field(description="the reward model and algorithm this feedback would train")
    model_config_: dict[str, Any] = Field(alias="modelConfig")


class TrainedOut(ApiModel):
    """Spec 002's synchronous answer: the finished job's policy (``?wait=true``)."""

    status: Literal["trained"] = "trained"
    job_id: str
    policy_id: str
    version: str
    model_path: str
    reward_model_path: str | None
    feedback_count: int
    training_steps: int
    reward_mean: float | None
    reward_std: float | None
    data_version: str | None = None
    promoted: bool | None = None


class JobOut(ApiModel):
    """A training job; the result fields are filled once ``status`` is ``trained``."""

    job_id: str
    agent_id: str
    status: Literal["queued", "running", "trained", "failed"]
    created_at: UtcDatetime
    updated_at: UtcDatetime
    feedback_count: int
    error: str | None = None
    policy_id: str | None = None
    version: str | None = None
    model_path: str | None = None
    reward_model_path: str | None = None
    training_steps: int | None = None
    reward_mean: float | None = None
    reward_std: float | None = None
    data_version: str | None = None


class OnlineOut(ApiModel):
    """Ratings of the completions this version served: count, mean and its 95% interval."""

    count: int
    mean_score: float | None
    low: float | None
    high: float | None


class PolicyOut(ApiModel):
    id: str
    agent_id: str
    version: str
    created_at: UtcDatetime
    model_path: str | None = None
    aliases: list[str] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)
    online: OnlineOut = Field(
        default_factory=lambda: OnlineOut(count=0, mean_score=None, low=None, high=None)
    )


class GenerateIn(ApiModel):
    """A prompt for the agent's policy; ``userKey`` keeps one user on one arm of an A/B test."""

    prompt: Text
    user_key: ShortText | None = None


class GenerateOut(ApiModel):
    completion: str
    policy_version: str
    arm: Literal["champion", "challenger"]
    run_id: str = Field(description="send it back as runId with the rating of this completion")


class TrafficIn(ApiModel):
    challenger_share: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)


class TrafficOut(ApiModel):
    agent_id: str
    champion_share: float
    challenger_share: float
    champion_version: str | None
    challenger_version: str | None
    updated_at: UtcDatetime | None = None


class ErrorOut(ApiModel):
    detail: str
    errors: list[dict[str, str]] | None = None
