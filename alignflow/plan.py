"""The plan of one pipeline run, decided once from its config.

Whoever runs the chain (the Prefect retraining flow, the feedback service's local launcher)
executes this plan and only wraps its steps: caching, work pools, retries, MLflow runs. The
run's rules are answered here and nowhere else: which steps run in which order, which config
sections and upstream models key each step's cache, what a step starts from, where
``@reward`` points, what the policy is judged against, whether new data needs a label judge.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alignflow.config import PipelineConfig, config_hash, with_reward_model
from alignflow.training.chain import ChainStep, Role, chain_steps, model_dir, run_chain
from alignflow.training.registry import stage_spec
from alignflow.training.reward_config import RewardConfig

# the steps after training; the training steps' sections come from the stage registry
AFTER_TRAINING_SECTIONS = {"evaluate": ("evaluation",), "register": ("project",), "promote": ("promotion",)}
LABEL_JUDGE_ROLE = "reward"  # the registered model whose champion checks new data's labels


def fingerprint(*parts: str) -> str:
    """A short stable hash of some strings, in order."""
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PlannedStep:
    """One training step as the plan hands it to an executor: all it needs, nothing to decide."""

    step: ChainStep
    start: str | None  # the model it starts from; None: its base model
    config_json: dict[str, Any]  # the run's config with ``@reward`` pointing at this run's reward model
    upstream: str  # what besides data, config and code keys its cache

    @property
    def role(self) -> Role:
        return self.step.role

    @property
    def stage(self) -> str:
        return self.step.stage

    def config(self) -> PipelineConfig:
        return PipelineConfig.model_validate(self.config_json)


# a planned step -> its result (a stage's StageResult, or a flow task's dict)
RunStep = Callable[[PlannedStep], Any]


def _output_dir(result: Any) -> Path:
    return Path(result["output_dir"] if isinstance(result, Mapping) else result.output_dir)


class RunPlan:
    """Steps, cache keys, start models, evaluation reference and label judge of one run."""

    def __init__(self, config: PipelineConfig, repo_dir: str | Path = "."):
        self.config = config
        self.config_json = config.model_dump(mode="json")
        self.config_hash = config_hash(config)
        reward = config.section_as("reward", RewardConfig)
        self.steps = chain_steps(
            config.policy.run_sft, config.policy.algorithm, reward.backbone, config.policy.reward_data
        )
        # a relative output_dir lives in the repo the run works on, like its data snapshot
        self.out_root = (Path(repo_dir) / config.output_dir).resolve() / config.project
        # which train rows SFT and the reward model read is an input of theirs that their own
        # sections do not hold (``policy.reward_data``): it goes into their cache keys
        self._rows = "|rows=disjoint-halves" if config.policy.reward_data == "disjoint" else ""

    @property
    def stage_names(self) -> list[str]:
        """Every step of the run in order, as the summary and the progress view name them."""
        return ["data", *(step.role for step in self.steps), *AFTER_TRAINING_SECTIONS]

    @property
    def label_judge_role(self) -> str | None:
        """The registered role whose champion judges new data's labels; None: no label check."""
        return None if self.config.data.label_check_max_gap is None else LABEL_JUDGE_ROLE

    def sections(self, stage: str) -> tuple[str, ...]:
        """The config sections one step reads: ``policy`` adds its algorithm's (and only its)."""
        if stage in AFTER_TRAINING_SECTIONS:
            return AFTER_TRAINING_SECTIONS[stage]
        if stage == "policy":
            return ("policy", *stage_spec(self.config.policy.algorithm).cache_sections)
        return stage_spec(stage).cache_sections

    def section_hash(self, stage: str) -> str:
        """Hash of the sections one step reads (a change elsewhere does not retrain it)."""
        picked = {name: self.config_json.get(name) for name in self.sections(stage)}
        return hashlib.sha256(json.dumps(picked, sort_keys=True).encode()).hexdigest()[:16]

    def output_dir(self, stage: str, data_version: str, upstream: str) -> Path:
        """A step's output folder, named by the same things as its cache key."""
        key = fingerprint(stage, data_version, self.section_hash(stage), upstream)
        return self.out_root / f"{stage}-{key}"

    def run_chain(self, run_step: RunStep) -> dict[Role, Any]:
        """Run the training steps in order through ``run_step``, each handed what it starts from."""

        def execute(step: ChainStep, start: str | None, done: Mapping[str, Any]) -> Any:
            return run_step(self._planned(step, start, done))

        return run_chain(self.steps, execute)

    def _planned(self, step: ChainStep, start: str | None, done: Mapping[str, Any]) -> PlannedStep:
        if step.role == "sft":
            return PlannedStep(step, start, self.config_json, self._rows)
        if step.role == "reward":
            return PlannedStep(step, start, self.config_json, f"init={start or ''}{self._rows}")
        reward = done["reward"]
        # the policy's key names the reward step's output folder (itself named by that step's key)
        upstream = f"sft={start or ''}|reward={_output_dir(reward)}"
        return PlannedStep(step, start, with_reward_model(self.config_json, model_dir(reward)), upstream)

    def start_model(self, result: Any) -> str:
        """The model a step without SFT started from: the tiny model it built, or the named one."""
        from alignflow.models.factory import BASE_MODEL_DIR, resolve_model_source

        built = _output_dir(result) / BASE_MODEL_DIR
        if (built / "config.json").exists():
            return str(built)
        return resolve_model_source(self.config.model.name)

    def rl_start(self, trained: Mapping[Role, Any]) -> str:
        """The model the RL step started from: its SFT model, else the model the chain began with."""
        sft = trained.get("sft")
        return model_dir(sft) if sft is not None else self.start_model(trained["policy"])

    def evaluation_reference(self, trained: Mapping[Role, Any]) -> str:
        """What the policy is judged against: where its RL step started (``evaluation.reference:
        sft``), or the model the chain started from (``base``)."""
        if self.config.evaluation.reference == "sft":
            return self.rl_start(trained)
        return self.start_model(trained.get("sft") or trained["policy"])

    def evaluation_upstream(
        self, trained: Mapping[Role, Any], champion_version: str, judge_version: str, golden_version: str
    ) -> str:
        """What besides its config keys the evaluation's cache: the models it compares and the set."""
        return (
            f"policy={model_dir(trained['policy'])}|reward={model_dir(trained['reward'])}"
            f"|champion={champion_version}|champion_reward={judge_version}|golden={golden_version}"
        )

    def data_source(self, repo_dir: str | Path) -> str:
        """The configured input, or the built-in demo data (written deterministically) when none is."""
        if self.config.data.source:
            return self.config.data.source
        from alignflow.data.demo import write_demo_source

        return str(write_demo_source(self.config.data, repo_dir))
