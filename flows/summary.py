"""What a pipeline run reports back: small, JSON-serialisable, rendered by the CLI."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class StageOutcome:
    name: str
    seconds: float
    compute_seconds: float
    cached: bool
    metrics: dict[str, float] = field(default_factory=dict)
    output: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunSummary:
    project: str
    data_version: str | None = None
    config_hash: str | None = None
    parent_run_id: str | None = None
    tracking_uri: str | None = None
    stages: list[StageOutcome] = field(default_factory=list)
    promotions: dict[str, dict[str, Any]] = field(default_factory=dict)
    nothing_to_do: str | None = None
    stopped: dict[str, Any] | None = None  # {"reason", "message", "report"} when a check stopped the run
    golden: dict[str, Any] | None = None  # the pinned evaluation set: path, version (md5), counts
    wall_seconds: float = 0.0

    def add(self, outcome: StageOutcome) -> StageOutcome:
        self.stages.append(outcome)
        return outcome

    def stage(self, name: str) -> StageOutcome | None:
        return next((s for s in self.stages if s.name == name), None)

    @property
    def compute_seconds(self) -> float:
        return sum(s.compute_seconds for s in self.stages)

    @property
    def orchestration_overhead(self) -> float:
        """(flow wall time - stage compute time) / flow wall time."""
        if self.wall_seconds <= 0:
            return 0.0
        return max(0.0, (self.wall_seconds - self.compute_seconds) / self.wall_seconds)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["compute_seconds"] = self.compute_seconds
        data["orchestration_overhead"] = self.orchestration_overhead
        return data
