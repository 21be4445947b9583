"""The preference judges of the pinned set, by name: one registry that evaluation and promotion read.

Evaluation builds every registered judge that is available for the run (a judge's builder
returns None where it cannot judge, e.g. no champion reward model yet) and records its win
rates and its agreement with the verifiable answers; promotion counts a judge only when it
comes from outside the challenger's run (``outside_the_run``) or, for the run's own reward
model, once that model has passed its own gates. A judge registered with ``decides=False``
(the pinned outside judge) is reported beside them and never counted. A new judge is its own
module plus one ``register_judge`` line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from alignflow.evaluation.config import EvaluationConfig
from alignflow.evaluation.judges import Judge, RewardModelJudge, Scorer
from alignflow.named_registry import NamedRegistry

OWN_REWARD_JUDGE = "reward"  # the run's own reward model: counts only once it passed its gates
OUTSIDE_JUDGE = "outside"  # a judge fitted once, outside every run (evaluation.outside_judge): reported


@dataclass(frozen=True)
class JudgeInputs:
    """What a judge may be built from: the evaluation settings and the reward models at hand."""

    config: EvaluationConfig
    scorer: Scorer | None = None  # the run's own reward model
    champion_scorer: Scorer | None = None  # the champion reward model, where one exists
    pinned_prompts: tuple[Any, ...] = ()  # every prompt of the pinned set (a fitted judge must not know one)


@dataclass(frozen=True)
class JudgeSpec:
    name: str
    build: Callable[[JudgeInputs], Judge | None]  # None: this judge cannot judge this run
    outside_the_run: bool = True  # independent of the challenger's own training
    decides: bool = True  # False: its figures are reported, its verdicts never decide a promotion


_JUDGES: NamedRegistry[JudgeSpec] = NamedRegistry("judge", "it names metrics")


def register_judge(spec: JudgeSpec, replace: bool = False) -> JudgeSpec:
    return _JUDGES.add(spec, replace)


def unregister_judge(name: str) -> None:
    _JUDGES.remove(name)


def outside_judges() -> tuple[str, ...]:
    """The judges that count without proving themselves first: none of them trained in the run."""
    return tuple(name for name, spec in _JUDGES.all().items() if spec.outside_the_run and spec.decides)


def build_pinned_set_judges(inputs: JudgeInputs) -> dict[str, Judge]:
    """Every registered judge that can judge this run, by name, in registration order."""
    built = {name: spec.build(inputs) for name, spec in _JUDGES.all().items()}
    return {name: judge for name, judge in built.items() if judge is not None}


def _champion_reward(inputs: JudgeInputs) -> Judge | None:
    if inputs.champion_scorer is None:
        return None
    return RewardModelJudge(inputs.champion_scorer, inputs.config.tie_margin)


def _own_reward(inputs: JudgeInputs) -> Judge | None:
    return None if inputs.scorer is None else RewardModelJudge(inputs.scorer, inputs.config.tie_margin)


def _llm(inputs: JudgeInputs) -> Judge | None:
    llm = inputs.config.llm_judge
    if llm is None:
        return None
    from alignflow.evaluation.llm_judge import OpenAIJudge

    return OpenAIJudge(
        base_url=llm.base_url, model=llm.model, api_key_env=llm.api_key_env, timeout=llm.timeout
    )


def _outside(inputs: JudgeInputs) -> Judge | None:
    if inputs.config.outside_judge is None:
        return None
    from alignflow.evaluation.embedding_judge import load_outside_judge

    return load_outside_judge(inputs.config.outside_judge, inputs.pinned_prompts, inputs.config.tie_margin)


register_judge(JudgeSpec("champion_reward", _champion_reward))
register_judge(JudgeSpec(OWN_REWARD_JUDGE, _own_reward, outside_the_run=False))
register_judge(JudgeSpec("llm", _llm))
register_judge(JudgeSpec(OUTSIDE_JUDGE, _outside, decides=False))
