"""The one list of training stages: what each is called, runs, reads and how it scales.

Everything that needs to know the stages reads this registry: the pipeline config (one
section per stage, validated by the stage's config class), ``alignflow train STAGE``, the
launcher (runner, multi-process or not), the retraining flow's cache keys (the sections a
stage's result depends on) and ``policy.algorithm`` (the registered policy algorithms).

A new algorithm is its own two files (``<name>.py`` with ``run_<name>`` and
``<name>_config.py`` with its config) plus one :func:`register_stage` call: here for a
built-in, or, for a plugin package, an entry point in the ``alignflow.stages`` group whose
object is its :class:`StageSpec` (loaded in every process, accelerate workers included).

Runners and config classes may be given as ``"module:attribute"`` strings, so that reading
the registry imports neither torch nor the stage modules.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Literal

from pydantic import BaseModel

from alignflow.named_registry import NamedRegistry

Role = Literal["sft", "reward", "policy"]
ENTRY_POINT_GROUP = "alignflow.stages"
REWARD_STAGE_REF = "@reward"  # a reward-model path the retraining flow swaps for the reward stage's model


def _resolve(target: Any) -> Any:
    if not isinstance(target, str):
        return target
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


@dataclass(frozen=True)
class StageSpec:
    """One training stage.

    - ``name``: the CLI verb, the config section and (for a policy) ``policy.algorithm``;
    - ``runner``: ``run(config, data_dir, output_dir, model_path=None) -> StageResult``;
    - ``config``: the pydantic class of its config section;
    - ``role``: where the retraining flow runs it (sft, reward, or the policy step);
    - ``cache_sections``: the config sections its result depends on (its cache key);
      default ``("seed", "model", name)``;
    - ``distributed``: whether ``orchestration.num_processes > 1`` runs it under accelerate;
    - ``needs_pairs``: a policy that learns from preference pairs (not a reward model);
    - ``reward_overrides``: config overrides that point it at the reward stage's model
      (``@reward``), used when feedback decides the algorithm.
    """

    name: str
    runner: Callable[..., Any] | str
    config: type[BaseModel] | str
    role: Role = "policy"
    cache_sections: tuple[str, ...] = ()
    distributed: bool = False
    needs_pairs: bool = False
    reward_overrides: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.cache_sections:
            object.__setattr__(self, "cache_sections", ("seed", "model", self.name))

    def load_runner(self) -> Callable[..., Any]:
        """The runner, whose whole run (held-out evaluation included) reports an operation that
        strict determinism refuses as an input error (:mod:`alignflow.training.determinism`)."""
        from alignflow.training.determinism import refusing_nondeterminism

        runner = _resolve(self.runner)

        @functools.wraps(runner)
        def run(*args: Any, **kwargs: Any) -> Any:
            with refusing_nondeterminism():
                return runner(*args, **kwargs)

        return run

    def config_class(self) -> type[BaseModel]:
        return _resolve(self.config)


_STAGES: NamedRegistry[StageSpec] = NamedRegistry("training stage", "it is a config section")
_plugins_loaded = False


def register_stage(spec: StageSpec, replace: bool = False) -> StageSpec:
    """Add a stage; a name taken by another stage is an error unless ``replace``."""
    return _STAGES.add(spec, replace)


def unregister_stage(name: str) -> None:
    """Remove a stage (tests that register a toy one clean up with this)."""
    _STAGES.remove(name)


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        register_stage(entry.load(), replace=True)


def stages() -> dict[str, StageSpec]:
    """Every registered stage, built-ins first, by name."""
    _load_plugins()
    return _STAGES.all()


def stage_spec(name: str) -> StageSpec:
    _load_plugins()
    return _STAGES.get(name)


def policy_algorithms() -> tuple[str, ...]:
    """The names ``policy.algorithm`` may take."""
    return tuple(name for name, spec in stages().items() if spec.role == "policy")


def registered_policy(name: str) -> str:
    """``name`` if it is a registered policy algorithm (a pydantic validator's check)."""
    known = policy_algorithms()
    if name not in known:
        raise ValueError(f"{name!r} is not a registered policy algorithm; registered: {list(known)}")
    return name


def config_sections() -> dict[str, type[BaseModel]]:
    """Config section name -> its pydantic class, one per stage."""
    return {name: spec.config_class() for name, spec in stages().items()}


def _builtin(name: str, role: Role = "policy", **kwargs: Any) -> None:
    module = f"alignflow.training.{name}"
    config = kwargs.pop("config", f"{module}_config:{name.upper()}Config")
    register_stage(StageSpec(name, f"{module}:run_{name}", config, role, **kwargs))


_builtin("sft", role="sft", distributed=True)
_builtin("reward", role="reward", distributed=True, config="alignflow.training.reward_config:RewardConfig")
_builtin("dpo", distributed=True, needs_pairs=True)
_builtin(
    "grpo",
    distributed=True,
    reward_overrides=(f"grpo.reward_functions=[{{kind: reward_model, path: '{REWARD_STAGE_REF}'}}]",),
)
_builtin(
    "ppo",
    config="alignflow.training.ppo_config:PPOStageConfig",
    reward_overrides=(f"ppo.reward_model='{REWARD_STAGE_REF}'", "ppo.verifiable_rewards=[]"),
)
_builtin("simpo", distributed=True, needs_pairs=True, config="alignflow.training.simpo_config:SimPOConfig")
_builtin("orpo", distributed=True, needs_pairs=True, config="alignflow.training.orpo_config:ORPOConfig")
_builtin("kto", distributed=True, needs_pairs=True, config="alignflow.training.kto_config:KTOConfig")
