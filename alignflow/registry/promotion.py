"""Gated promotion: ``champion`` moves only when every configured gate passes.

Each gate compares one evaluation metric with a threshold from :class:`PromotionConfig`;
a gate set to ``None`` is off. A gate whose metric is missing fails (an unmeasured model
is not promoted by accident). The outcome is written onto the model version as tags, so
the registry itself explains why a version was or was not promoted, and the champion
history lives in the ``champion.previous`` tag chain that :func:`rollback` walks back.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Literal

from mlflow import MlflowClient

from alignflow.registry.models import CHAMPION, version_by_alias
from alignflow.registry.promotion_config import PromotionConfig

# metric keys shared with alignflow.evaluation (the eval report's flat metrics)
WIN_RATE_VS_CHAMPION = "eval/win_rate_vs_champion"
WIN_RATE_VS_REFERENCE = "eval/win_rate_vs_reference"
KL_TO_REFERENCE = "eval/kl_to_reference"
LENGTH_GROWTH_RATIO = "eval/length_growth_ratio"
TASK_ACCURACY_GAIN = "eval/task_accuracy_gain"
REWARD_ACCURACY = "eval/reward_accuracy"
CALIBRATION_ERROR = "eval/reward_ece"

DECISION_TAG = "promotion.decision"
FAILED_GATES_TAG = "promotion.failed_gates"
GATES_TAG = "promotion.gates"
REASON_TAG = "promotion.reason"
PREVIOUS_CHAMPION_TAG = "champion.previous"
PROMOTED_AT_TAG = "champion.promoted_at"
METRIC_TAG_PREFIX = "eval."

Op = Literal[">=", "<=", ">"]
Role = Literal["policy", "reward"]


@dataclass(frozen=True)
class Gate:
    name: str
    metric: str
    op: Op
    threshold: float


@dataclass(frozen=True)
class GateResult:
    name: str
    metric: str
    op: Op
    threshold: float
    value: float | None
    passed: bool

    def describe(self) -> str:
        shown = "missing" if self.value is None else f"{self.value:.4g}"
        return f"{self.name}: {shown} (needs {self.op} {self.threshold:g})"


@dataclass(frozen=True)
class PromotionDecision:
    name: str
    version: str
    promoted: bool
    results: tuple[GateResult, ...]
    previous_champion: str | None

    @property
    def failed(self) -> list[GateResult]:
        return [r for r in self.results if not r.passed]

    @property
    def reason(self) -> str:
        if self.promoted:
            return "all gates passed" if self.results else "no gates configured"
        return "; ".join(r.describe() for r in self.failed)


def gates_for(config: PromotionConfig, role: Role, has_champion: bool) -> list[Gate]:
    """The gates that apply to a ``role`` model; champion-relative gates need a champion.

    Without a champion a policy must instead beat the reference (win rate strictly above
    ``min_win_rate_vs_reference``) — that is what makes the first model champion.
    """
    candidates: list[tuple[str, str, Op, float | None]]
    if role == "policy":
        candidates = [
            ("kl", KL_TO_REFERENCE, "<=", config.max_kl),
            ("length_growth", LENGTH_GROWTH_RATIO, "<=", config.max_length_growth),
            ("task_accuracy_gain", TASK_ACCURACY_GAIN, ">=", config.min_task_accuracy_gain),
        ]
        if has_champion:
            candidates.insert(
                0, ("win_rate_vs_champion", WIN_RATE_VS_CHAMPION, ">=", config.min_win_rate_vs_champion)
            )
        else:
            candidates.insert(
                0, ("beats_reference", WIN_RATE_VS_REFERENCE, ">", config.min_win_rate_vs_reference)
            )
    elif role == "reward":
        candidates = [
            ("reward_accuracy", REWARD_ACCURACY, ">=", config.min_reward_accuracy),
            ("reward_ece", CALIBRATION_ERROR, "<=", config.max_reward_ece),
        ]
    else:
        raise ValueError(f"role must be 'policy' or 'reward', got {role!r}")
    return [Gate(name, metric, op, float(t)) for name, metric, op, t in candidates if t is not None]


def _passes(value: float | None, op: Op, threshold: float) -> bool:
    if value is None or not math.isfinite(value):
        return False
    if op == ">=":
        return value >= threshold
    if op == "<=":
        return value <= threshold
    return value > threshold


def check_gates(metrics: Mapping[str, float], gates: list[Gate]) -> list[GateResult]:
    """Judge ``metrics`` against each gate; a missing metric fails its gate."""
    results = []
    for gate in gates:
        raw = metrics.get(gate.metric)
        value = None if raw is None else float(raw)
        results.append(
            GateResult(
                gate.name,
                gate.metric,
                gate.op,
                gate.threshold,
                value,
                _passes(value, gate.op, gate.threshold),
            )
        )
    return results


def record_metrics(tracking_uri: str, name: str, version: str, metrics: Mapping[str, float]) -> None:
    """Keep the evaluation metrics on the version (``eval.<key>`` tags) for later re-judging."""
    client = MlflowClient(tracking_uri)
    for key, value in metrics.items():
        tag = METRIC_TAG_PREFIX + key.removeprefix("eval/").replace("/", ".")
        client.set_model_version_tag(name, version, tag, repr(float(value)))


def recorded_metrics(tracking_uri: str, name: str, version: str) -> dict[str, float]:
    """The metrics stored by :func:`record_metrics`, keyed as the eval report keys them."""
    tags = MlflowClient(tracking_uri).get_model_version(name, version).tags
    metrics = {}
    for tag, value in tags.items():
        if tag.startswith(METRIC_TAG_PREFIX):
            key = "eval/" + tag.removeprefix(METRIC_TAG_PREFIX).replace(".", "/")
            metrics[key] = float(value)
    return metrics


def _results_json(results: list[GateResult]) -> str:
    return json.dumps([asdict(r) for r in results], sort_keys=True)


def _set_tags(client: MlflowClient, name: str, version: str, tags: Mapping[str, str]) -> None:
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)


def set_champion(tracking_uri: str, name: str, version: str, reason: str) -> str | None:
    """Move ``champion`` to ``version``, remembering the one it replaces; returns that one."""
    client = MlflowClient(tracking_uri)
    current = version_by_alias(tracking_uri, name, CHAMPION)
    previous = str(current.version) if current is not None else None
    if previous == str(version):
        return previous
    _set_tags(
        client,
        name,
        str(version),
        {
            PREVIOUS_CHAMPION_TAG: previous or "",
            PROMOTED_AT_TAG: str(int(time.time() * 1000)),
            DECISION_TAG: "promoted",
            REASON_TAG: reason[:5000],
        },
    )
    client.set_registered_model_alias(name, CHAMPION, str(version))
    return previous


def promote(
    tracking_uri: str,
    name: str,
    version: str,
    metrics: Mapping[str, float],
    config: PromotionConfig,
    role: Role,
) -> PromotionDecision:
    """Judge ``version`` by its metrics; move ``champion`` only if every gate passes.

    Either way the version is tagged with the decision and each gate's value; a
    rejected version also gets ``promotion.failed_gates`` naming the gates it failed.
    """
    client = MlflowClient(tracking_uri)
    version = str(version)
    champion = version_by_alias(tracking_uri, name, CHAMPION)
    has_champion = champion is not None and str(champion.version) != version
    results = check_gates(metrics, gates_for(config, role, has_champion))
    record_metrics(tracking_uri, name, version, metrics)
    _set_tags(client, name, version, {GATES_TAG: _results_json(results)[:5000]})
    promoted = all(r.passed for r in results)
    decision = PromotionDecision(
        name, version, promoted, tuple(results), str(champion.version) if champion else None
    )
    if promoted:
        set_champion(tracking_uri, name, version, decision.reason)
    else:
        failed = {r.name: {"value": r.value, "op": r.op, "threshold": r.threshold} for r in decision.failed}
        _set_tags(
            client,
            name,
            version,
            {
                DECISION_TAG: "rejected",
                FAILED_GATES_TAG: json.dumps(failed, sort_keys=True)[:5000],
                REASON_TAG: decision.reason[:5000],
            },
        )
    return decision


def rollback(tracking_uri: str, name: str) -> tuple[str, str]:
    """Move ``champion`` back to the version it replaced; returns ``(from, to)``.

    The chain of ``champion.previous`` tags is the history, so repeated rollbacks walk
    further back. Raises when there is no champion or nothing before it.
    """
    client = MlflowClient(tracking_uri)
    current = version_by_alias(tracking_uri, name, CHAMPION)
    if current is None:
        raise LookupError(f"{name}: no champion to roll back")
    previous = current.tags.get(PREVIOUS_CHAMPION_TAG, "")
    if not previous:
        raise LookupError(f"{name}: champion version {current.version} has no previous champion")
    client.set_registered_model_alias(name, CHAMPION, previous)
    _set_tags(
        client,
        name,
        str(current.version),
        {DECISION_TAG: "rolled_back", REASON_TAG: f"rolled back to version {previous}"},
    )
    return str(current.version), previous
