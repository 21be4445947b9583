"""Which policy-optimisation stage a pipeline run uses, and whether SFT comes first."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from alignflow.training.registry import registered_policy


class PolicyConfig(BaseModel):
    """``algorithm`` names a registered policy stage; ``dpo`` covers the DPO family (loss types,
    IPO, ORPO, KTO: see the ``dpo`` section)."""

    model_config = ConfigDict(extra="forbid")

    algorithm: str = "dpo"
    run_sft: bool = Field(True, description="fine-tune on the preferred responses before policy optimisation")

    _registered = field_validator("algorithm")(registered_policy)
