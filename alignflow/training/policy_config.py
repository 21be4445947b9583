"""Which policy-optimisation stage a pipeline run uses, and whether SFT comes first."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from alignflow.training.registry import registered_policy


class PolicyConfig(BaseModel):
    """``algorithm`` names a registered policy stage; ``dpo`` covers the DPO family (loss types,
    IPO, ORPO, KTO: see the ``dpo`` section)."""

    model_config = ConfigDict(extra="forbid")

    algorithm: str = "dpo"
    run_sft: bool = Field(True, description="fine-tune on the preferred responses before policy optimisation")
    reward_data: Literal["shared", "disjoint"] = Field(
        "shared",
        description="'disjoint': the reward model trains on one half of the train prompts (by a hash of "
        "the prompt) and every policy stage on the other, so the run's reward model judges a policy "
        "that never saw its pairs; 'shared': every stage trains on all of them",
    )

    _registered = field_validator("algorithm")(registered_policy)
