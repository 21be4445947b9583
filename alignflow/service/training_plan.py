"""From a training request and the agent's feedback to the pipeline config one job will run.

The pipeline config is the service's (``alignflow api --config FILE --set k=v``, else the
embedded default); the feedback decides the reward model and algorithm
(:mod:`alignflow.training.feedback_plan`); the request's fields go last. The whole config
is validated here, so a request that cannot train is a 422 before any job exists, and
``modelConfig`` echoes what the job will really use.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic.alias_generators import to_camel

from alignflow.config import ConfigError, OverrideNamer, PipelineConfig, load_config, set_flag
from alignflow.service.schemas import TrainPolicyIn
from alignflow.service.settings import ServiceSettings
from alignflow.training.feedback_plan import FeedbackCounts, FeedbackPlan, PlanError, plan_for


class JobPlanError(ValueError):
    """The request cannot train on this feedback; the message says why (a 422)."""


@dataclass(frozen=True)
class JobPlan:
    """What one training job runs: the feedback plan and the resolved pipeline config."""

    plan: FeedbackPlan
    overrides: tuple[str, ...]  # on top of the service's pipeline config file
    config: PipelineConfig

    @property
    def policy_section(self) -> Any:
        return self.config.section(self.plan.algorithm)

    @property
    def max_steps(self) -> int:
        return self.policy_section.max_steps

    @property
    def learning_rate(self) -> float:
        return self.policy_section.learning_rate

    def model_config(self) -> dict[str, Any]:
        """The settings the job will train with (spec 002's ``modelConfig``), from the config."""
        lora = self.config.model.lora
        return {
            "base_model": self.config.model.name,
            "use_lora": lora.enabled,
            **(
                {"lora_r": lora.r, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout}
                if lora.enabled
                else {}
            ),
            "learning_rate": self.learning_rate,
            "max_steps": self.max_steps,
            "batch_size": self.policy_section.per_device_train_batch_size,
            "algorithm": self.plan.algorithm,
            "reward_mode": self.plan.reward_mode,
            "run_sft": self.plan.run_sft,
        }


def _request_fields(body: TrainPolicyIn, algorithm: str) -> dict[str, str]:
    """Pipeline-config key -> the request field that sets it (only the fields it sets)."""
    fields = {
        "model.name": "base_model",
        "model.lora.enabled": "use_lora",
        "model.lora.r": "lora_r",
        "model.lora.alpha": "lora_alpha",
        "model.lora.dropout": "lora_dropout",
        f"{algorithm}.per_device_train_batch_size": "batch_size",
        f"{algorithm}.max_steps": "max_steps",
        f"{algorithm}.learning_rate": "learning_rate",
    }
    return {key: field for key, field in fields.items() if getattr(body, field) is not None}


def request_overrides(body: TrainPolicyIn, algorithm: str) -> list[str]:
    """The request's fields as pipeline-config overrides (only those it sets)."""
    return [
        f"{key}={_yaml_scalar(getattr(body, field))}"
        for key, field in _request_fields(body, algorithm).items()
    ]


def _as_sent(body: TrainPolicyIn, field: str) -> str:
    """A request field as the client wrote it in the JSON body (``batchSize=3``)."""
    return f"request field {to_camel(field)}={json.dumps(getattr(body, field))}"


def override_sources(settings: ServiceSettings, plan: FeedbackPlan, body: TrainPolicyIn) -> OverrideNamer:
    """How a config error names each override of a job: a client knows its request's fields,
    not ``--set``; the feedback plan's choices and the service's own ``--set`` are said as such."""
    names = {item: f"alignflow api {set_flag(item)}" for item in settings.pipeline_overrides}
    names |= {item: f"the feedback plan's {item}" for item in plan.overrides()}
    if body.algorithm is not None:
        names[f"policy.algorithm={plan.algorithm}"] = _as_sent(body, "algorithm")
    for key, field in _request_fields(body, plan.algorithm).items():
        names[f"{key}={_yaml_scalar(getattr(body, field))}"] = _as_sent(body, field)
    return lambda item: names.get(item, set_flag(item))


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"  # a YAML single-quoted string: never a number
    return repr(value)


def check_base_model(name: str) -> None:
    from alignflow.models.factory import model_unavailable

    reason = model_unavailable(name)
    if reason:
        raise JobPlanError(f"baseModel: {reason}")


def plan_job(settings: ServiceSettings, body: TrainPolicyIn, counts: FeedbackCounts) -> JobPlan:
    """The job this request would start, or :class:`JobPlanError` saying why it cannot."""
    try:
        plan = plan_for(counts, body.algorithm)
    except PlanError as exc:
        raise JobPlanError(str(exc)) from exc
    if body.base_model is not None:
        check_base_model(body.base_model)
    overrides = (*settings.pipeline_overrides, *plan.overrides(), *request_overrides(body, plan.algorithm))
    try:
        config = load_config(
            settings.pipeline_config, list(overrides), override_sources(settings, plan, body)
        )
    except ConfigError as exc:
        raise JobPlanError(f"this request makes an invalid training config: {exc}") from exc
    return JobPlan(plan=plan, overrides=overrides, config=config)
