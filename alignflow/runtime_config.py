"""Where a pipeline run tracks and executes: chosen by configuration, never by code.

The embedded defaults need no server (MLflow in a local SQLite file, Prefect's ephemeral
API, every stage in-process); the same fields point a run at shared services.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"


class TrackingConfig(BaseModel):
    """MLflow: ``uri`` falls back to ``MLFLOW_TRACKING_URI``, then a local SQLite file."""

    model_config = ConfigDict(extra="forbid")  # a misspelt key is an error, not a silent default

    uri: str | None = None
    experiment: str | None = Field(None, description="defaults to the project name")
    artifact_location: str | None = Field(
        None, description="for new experiments; default: mlruns beside a local SQLite store's database file"
    )
    tags: dict[str, str] = Field(
        default_factory=dict, description="extra tags on every run and registered version (e.g. agent_id)"
    )

    def resolved_uri(self) -> str:
        return self.uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


class OrchestrationConfig(BaseModel):
    """Prefect: stages run in-process unless a work pool is named for them."""

    model_config = ConfigDict(extra="forbid")

    work_pools: dict[str, str] = Field(
        default_factory=dict, description="stage name -> work pool; such stages run via run_deployment"
    )
    deployment_name: str = Field("default", description="the deployment of each stage flow to call")
    stage_timeout_s: float | None = Field(None, description="wait at most this long for a deployed stage")
    num_processes: int = Field(1, ge=1, description=">1 launches training stages through accelerate")
    accelerate_config: str | None = Field(None, description="accelerate config file (DDP/FSDP/DeepSpeed)")
