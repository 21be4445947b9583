"""Which policy-optimisation stage a pipeline run uses, and whether SFT comes first."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PolicyConfig(BaseModel):
    """``dpo`` covers the DPO family (loss types, IPO, ORPO, KTO: see the ``dpo`` section)."""

    model_config = ConfigDict(extra="forbid")

    algorithm: Literal["dpo", "grpo", "ppo"] = "dpo"
    run_sft: bool = Field(True, description="fine-tune on the preferred responses before policy optimisation")
