"""The training chain, written once: sft -> reward -> policy, and the prompts its policy is judged on.

A pipeline run's :class:`~alignflow.plan.RunPlan` (executed by the Prefect retraining flow and
the feedback service's local launcher) and the spec-002 :class:`~alignflow.rlhf.trainer.RLHFTrainer`
(PPO on feedback, its reward model trained or given) both run these steps. The chain's rules
live here and nowhere else:

- SFT runs first when ``policy.run_sft``;
- the reward model starts from the SFT weights when it shares the policy's backbone
  (``reward.backbone: policy``) and its rows (``policy.reward_data: shared``): it already reads
  the task, so the preference head learns from few pairs (as in InstructGPT). With disjoint
  halves the SFT model has read the policy's half, so the reward model starts from the base;
- the policy stage (``policy.algorithm``) starts from the SFT model and scores with the reward
  stage's model wherever its config says ``@reward``;
- the policy is judged on the eval split's distinct prompts (the train split's when the eval
  split is empty, as with a handful of feedback rows).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Role = Literal["sft", "reward", "policy"]


@dataclass(frozen=True)
class ChainStep:
    """One step of the chain: its role, the registered stage that runs it, what it starts from."""

    role: Role
    stage: str
    starts_from_sft: bool = False


def chain_steps(
    run_sft: bool, algorithm: str, reward_backbone: str = "policy", reward_data: str = "shared"
) -> list[ChainStep]:
    """The steps in order, for the chain's four choices."""
    reward_from_sft = run_sft and reward_backbone == "policy" and reward_data == "shared"
    steps = [ChainStep("sft", "sft")] if run_sft else []
    steps.append(ChainStep("reward", "reward", reward_from_sft))
    steps.append(ChainStep("policy", algorithm, run_sft))
    return steps


def model_dir(result: Any) -> str:
    """Where a step's result put its model (a stage's :class:`StageResult` or a flow task's dict)."""
    return str(result["model_dir"] if isinstance(result, Mapping) else result.model_dir)


# (step, the model it starts from or None for its base, the results of the steps before it) -> result
Execute = Callable[[ChainStep, str | None, Mapping[str, Any]], Any]


def run_chain(steps: list[ChainStep], execute: Execute) -> dict[Role, Any]:
    """Run ``steps`` in order through ``execute``, handing each the model it starts from."""
    results: dict[Role, Any] = {}
    for step in steps:
        start = model_dir(results["sft"]) if step.starts_from_sft else None
        results[step.role] = execute(step, start, dict(results.items()))
    return results


def held_out_prompts(data_dir: str | Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Distinct prompts of the eval split with their metadata (answers), in order; the train
    split's when the eval split is empty. ``limit``: at most this many."""
    from alignflow.data.snapshot import load_split
    from alignflow.data.split import distinct_prompt_rows

    for split in ("eval", "train"):
        rows = distinct_prompt_rows(load_split(data_dir, split), limit)
        if rows:
            return rows
    return []
