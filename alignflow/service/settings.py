"""Settings of the feedback service: one typed object, built in code, from the CLI or the environment.

Everything has a default that runs on a laptop with no server: SQLite beside the working
directory, MLflow on a local SQLite store. Production points ``database_url`` at PostgreSQL
and ``tracking_uri`` at the MLflow server without touching code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_core import ErrorDetails

AGENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
"""Agent ids end up in file paths and MLflow model names: no dots, slashes or spaces."""

ENV_PREFIX = "ALIGNFLOW_API_"
MIN_TOKEN_CHARS = 16
# workspace-local state lives under .alignflow/ (git-ignored), like the run logs and reports
DEFAULT_DATABASE_URL = "sqlite:///.alignflow/service.db"


class TokenSpec(BaseModel):
    """A bearer token to install at start-up, optionally limited to some agents."""

    model_config = ConfigDict(extra="forbid")

    token: SecretStr
    name: str = Field("default", max_length=100)
    agents: list[str] | None = None  # None: every agent

    @classmethod
    def parse(cls, text: str) -> TokenSpec:
        """``TOKEN`` or ``TOKEN:agent_a,agent_b`` (the CLI's and the environment's spelling).

        Raises a one-line ValueError (a CLI user sees it as is, not pydantic's error report).
        """
        token, _, scope = text.partition(":")
        if problem := token_problem(token):
            raise ValueError(problem)
        agents = [a.strip() for a in scope.split(",") if a.strip()] or None
        try:
            return cls(token=token, name=f"token-{len(token)}", agents=agents)
        except ValidationError as exc:
            raise ValueError("token: " + "; ".join(_message(e) for e in exc.errors())) from None

    @field_validator("token")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        if problem := token_problem(value.get_secret_value()):
            raise ValueError(problem)
        return value


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be a bearer token, or None; the token itself is never echoed."""
    if len(token) >= MIN_TOKEN_CHARS:
        return None
    return (
        f"a bearer token needs at least {MIN_TOKEN_CHARS} characters, this one has {len(token)}; "
        'make one with: python -c "import secrets; print(secrets.token_urlsafe(24))"'
    )


def _message(error: ErrorDetails) -> str:
    """pydantic's message without its 'Value error, ' prefix."""
    return str(error.get("msg", "")).removeprefix("Value error, ")


class TrainingSettings(BaseModel):
    """How jobs are estimated and answered; what they train comes from the pipeline config."""

    model_config = ConfigDict(extra="forbid")

    seconds_per_step: float = Field(
        0.5, gt=0, description="dry-run estimate per step while MLflow holds no run of the same model"
    )
    overhead_seconds: float = Field(
        60.0, ge=0, description="dry-run estimate of a job's time outside the policy stage, by default"
    )
    wait_by_default: bool = Field(
        False, description="answer POST train_policy when the job ends, as if ?wait=true (spec 002 clients)"
    )
    wait_timeout_s: float = Field(3600.0, gt=0, description="longest a waiting request blocks")


class ServingSettings(BaseModel):
    """How ``generate`` serves policies: one batched ``generate`` call per burst of requests."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(32, ge=1, le=4096)
    max_batch: int = Field(32, ge=1, le=1024)
    max_wait_ms: float = Field(5.0, ge=0.0, le=1000.0, description="how long a batch waits to fill")
    batching: bool = True


_ENV_FIELDS = {  # ALIGNFLOW_API_<suffix> -> the setting it sets
    "DATABASE_URL": "database_url",
    "TRACKING_URI": "tracking_uri",
    "WORK_DIR": "work_dir",
    "MIN_FEEDBACK": "min_feedback",
    "MAX_BODY_BYTES": "max_body_bytes",
    "SQLITE_SYNCHRONOUS": "sqlite_synchronous",
    "PIPELINE_CONFIG": "pipeline_config",
}


class ServiceSettings(BaseModel):
    """The service's whole configuration."""

    model_config = ConfigDict(extra="forbid")

    database_url: str = DEFAULT_DATABASE_URL
    sqlite_synchronous: Literal["NORMAL", "FULL"] = "NORMAL"  # NORMAL survives a process kill (WAL)
    tracking_uri: str = "sqlite:///mlflow.db"
    work_dir: Path = Path(".alignflow/service")  # exports, snapshots, trained models
    tokens: list[TokenSpec] = Field(default_factory=list)
    min_feedback: int = Field(10, ge=1)
    max_body_bytes: int = Field(256 * 1024, ge=1024)
    max_text_chars: int = Field(32_000, ge=1)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    pipeline_config: Path | None = Field(
        None, description="pipeline config of training jobs (None: embedded)"
    )
    pipeline_overrides: list[str] = Field(default_factory=list, description="key=value on top of it")
    training_workers: int = Field(1, ge=1, le=8)
    run_migrations: bool = True

    @property
    def exports_dir(self) -> Path:
        return self.work_dir / "exports"

    @property
    def models_dir(self) -> Path:
        return self.work_dir / "models"

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides) -> ServiceSettings:
        """Read ``ALIGNFLOW_API_*`` variables: ``ALIGNFLOW_API_TOKEN`` holds one token spec,
        ``ALIGNFLOW_API_TOKENS`` several, ``;``-separated. A bad value raises a one-line
        ValueError naming the variable."""
        env = os.environ if environ is None else environ
        values: dict = {}
        for suffix, field in _ENV_FIELDS.items():
            if f"{ENV_PREFIX}{suffix}" in env:
                values[field] = env[f"{ENV_PREFIX}{suffix}"]
        tokens = []
        for suffix in ("TOKEN", "TOKENS"):
            for spec in env.get(f"{ENV_PREFIX}{suffix}", "").split(";"):
                if spec.strip():
                    try:
                        tokens.append(TokenSpec.parse(spec.strip()))
                    except ValueError as exc:
                        raise ValueError(f"{ENV_PREFIX}{suffix}: {exc}") from None
        if tokens:
            values["tokens"] = tokens
        values.update(overrides)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ValueError("; ".join(_located(e, overrides) for e in exc.errors())) from None


def _located(error: ErrorDetails, overrides: dict) -> str:
    """One settings error, named by where its value came from (an option or a variable)."""
    field = str(error["loc"][0]) if error["loc"] else ""
    variable = {v: k for k, v in _ENV_FIELDS.items()}.get(field)
    source = field if field in overrides or variable is None else f"{ENV_PREFIX}{variable}"
    return f"{source}: {_message(error)}" + (f" (got {error['input']!r})" if field else "")


def read_token_file(path: Path) -> list[TokenSpec]:
    """Bearer tokens from a file, one spec per line (``TOKEN`` or ``TOKEN:agent_a,agent_b``);
    blank lines and ``#`` comments are skipped. Raises OSError or a one-line ValueError."""
    specs = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                specs.append(TokenSpec.parse(line.strip()))
            except ValueError as exc:
                raise ValueError(f"line {number}: {exc}") from None
    if not specs:
        raise ValueError("holds no token (one per line: TOKEN or TOKEN:agent_a,agent_b)")
    return specs
