"""What a training stage reads of a run's settings besides its own section.

A stage never imports the pipeline config (the config assembles the stages, not the other
way round), so it names what it reads here: the pipeline config is one such object, and so
is any other with these fields (a notebook's, a test's). Each stage takes its own section
typed by its own class: ``config.section_as("dpo", DPOConfig)``.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from alignflow.models.model_config import ModelSpec
from alignflow.runtime_config import OrchestrationConfig
from alignflow.training.policy_config import PolicyConfig

SectionT = TypeVar("SectionT", bound=BaseModel)


class RunSettings(Protocol):
    """The run-wide settings a stage reads, and its own section by name and class."""

    @property
    def seed(self) -> int: ...

    @property
    def model(self) -> ModelSpec: ...

    @property
    def policy(self) -> PolicyConfig: ...

    @property
    def orchestration(self) -> OrchestrationConfig: ...

    def section_as(self, name: str, kind: type[SectionT]) -> SectionT: ...

    def model_dump(self, *, mode: str = "python") -> dict[str, Any]: ...
