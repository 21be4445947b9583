"""The promotion decision as pure code: gates, their intervals and the verdict, from numbers.

Gates read the pinned-set evaluation (:mod:`alignflow.evaluation.challenger`): each
rate, accuracy or difference is judged on the bound of its 95% interval, a gate with
fewer judged rows than ``min_judged_rows`` fails as ``insufficient_evidence``, and a
gate whose metric is missing fails (an unmeasured model is not promoted by accident).
A release is regression-free, not only better on average: the worst slice of the pinned
set (:mod:`alignflow.evaluation.slices`) must not clearly fall below the champion's, on a
small-sample interval, and the gate names the slice that broke.
Preference judges count only when they are independent of the challenger's run (the
champion reward model, a plugged-in LLM judge, and the run's own reward model only once
it has passed its own gates) and when they are audited: where verifiable answers and the
judge both decide, they must agree (:func:`audit_judges`). A judge that prefers what the
verifier calls wrong is not trusted where the verifier is silent. With
``promotion.release: together`` a run's reward model becomes champion only with its policy.

Nothing here reads or writes a store: :mod:`alignflow.registry.promotion` fetches the
metrics and the champion from MLflow, calls :func:`decide` and records what it returned.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from alignflow.evaluation.intervals import BOUND_SUFFIXES, Estimate, items_to_tell, read_estimate
from alignflow.evaluation.judge_registry import OWN_REWARD_JUDGE, outside_judges
from alignflow.evaluation.metric_names import (
    ANSWERS,
    CALIBRATION_ERROR,
    DECODING_DO_SAMPLE,
    DECODING_MAX_NEW_TOKENS,
    DECODING_REPETITION_PENALTY,
    DECODING_TEMPERATURE,
    DISTINCT_2,
    GOLDEN,
    HUMAN_SCORE_GAIN,
    INDEPENDENT_JUDGES,
    KL_TO_REFERENCE,
    LENGTH_GROWTH_RATIO,
    LENGTH_GROWTH_VS_CHAMPION,
    LOOP_RATE,
    LOOP_RATE_VS_REFERENCE,
    RANDOM_WEIGHTS,
    REFERENCE_DISTINCT_2,
    REFERENCE_LOOP_RATE,
    REWARD_ACCURACY,
    REWARD_ACCURACY_VS_CHAMPION,
    REWARD_DISAGREEMENT_VS_CHAMPION,
    REWARD_SLICES_JUDGED,
    RL_GAIN,
    RL_START,
    RL_START_TASK_ACCURACY,
    SLICES_JUDGED,
    TASK_ACCURACY,
    TASK_ACCURACY_GAIN,
    TASK_ACCURACY_VS_CHAMPION,
    TASK_DISAGREEMENT_VS_CHAMPION,
    WORST_SLICE_REWARD_ACCURACY,
    WORST_SLICE_TASK_ACCURACY,
    is_win_rate,
    judge_agreement_key,
    win_rate_key,
)
from alignflow.evaluation.rl_stage import rl_start_said
from alignflow.named_registry import NamedRegistry
from alignflow.promotion.promotion_config import PromotionConfig

# preference judges; "reward" is the challenger's own reward model and must earn its place
INSUFFICIENT_EVIDENCE = "insufficient_evidence"
SLICE_GATE = "slice_regression"
RL_GAIN_GATE = "rl_gain"
RELEASE_GATE = "released_with_policy"
TRAINED_WEIGHTS_GATE = "trained_weights"
DEGENERATION_GATE = "loop_rate_vs_reference"

Op = Literal[">=", "<=", ">"]
Bound = Literal["low", "high", "value"]
BOUND_NAMES: dict[str, str] = {"low": "lower bound", "high": "upper bound", "value": "value"}
Role = Literal["policy", "reward"]


@dataclass(frozen=True)
class Gate:
    name: str
    metric: str
    op: Op
    threshold: float
    bound: Bound = "value"  # which number decides: the interval's low or high end, or the value
    # rows its interval needs (None: promotion.min_judged_rows); a slice's interval is sound
    # for a handful of items, so the slice gate asks for fewer
    min_rows: int | None = None


@dataclass(frozen=True)
class GateResult:
    name: str
    metric: str
    op: Op
    threshold: float
    bound: Bound
    value: float | None
    low: float | None
    high: float | None
    n: int | None
    passed: bool
    outcome: str  # passed, failed, missing or insufficient_evidence
    detail: str = ""  # what the number is about: the slice it measured, the judges' audit

    @property
    def decisive(self) -> float | None:
        """The number the gate decides on: the interval's low or high end, or the value."""
        return {"low": self.low, "high": self.high, "value": self.value}[self.bound]

    def interval(self) -> str:
        if self.low is None or self.high is None:
            return ""
        return f"[{self.low:.3g}, {self.high:.3g}]"

    @property
    def needs(self) -> str:
        """The bound that decides and what it must clear (``lower bound > 0.5``)."""
        return f"{BOUND_NAMES[self.bound]} {self.op} {self.threshold:g}"

    def describe(self) -> str:
        return self._figures() + (f" ({self.detail})" if self.detail else "")

    def _figures(self) -> str:
        if self.outcome == "missing":
            return f"{self.name}: missing (needs {self.op} {self.threshold:g})"
        shown = f"{self.value:.4g} {self.interval()}".strip() + (f" n={self.n}" if self.n is not None else "")
        if self.outcome == INSUFFICIENT_EVIDENCE:
            return f"{self.name}: {INSUFFICIENT_EVIDENCE} ({shown})"
        return f"{self.name}: {shown}, {BOUND_NAMES[self.bound]} needs {self.op} {self.threshold:g}"


@dataclass(frozen=True)
class PromotionDecision:
    name: str
    version: str
    promoted: bool
    results: tuple[GateResult, ...]
    previous_champion: str | None
    judges: tuple[str, ...] = ()  # the preference judges that counted
    answers: int = 0  # pinned prompts with a verifiable answer the policy was checked against

    @property
    def judges_counted(self) -> list[str]:
        """Every judge whose verdicts counted (what ``independent_judge`` counts): the
        verifiable answers first, then the preference judges."""
        verified = [f"verifiable answers ({self.answers} pinned prompts)"] if self.answers else []
        return verified + list(self.judges)

    @property
    def failed(self) -> list[GateResult]:
        return [r for r in self.results if not r.passed]

    @property
    def reason(self) -> str:
        if self.promoted:
            return "all gates passed" if self.results else "no gates configured"
        return "; ".join(r.describe() for r in self.failed)


@dataclass(frozen=True)
class JudgeAudit:
    """Whether a model judge may count, and on what evidence (its agreement with the verifier)."""

    judge: str
    counts: bool
    reason: str


def audit_judge(metrics: Mapping[str, float], judge: str, config: PromotionConfig) -> JudgeAudit:
    """A judge counts when the lower bound of its agreement with the verifiable answers clears
    ``min_judge_agreement``; where nothing could audit it, only if unaudited judges are allowed."""
    if config.min_judge_agreement is None:
        return JudgeAudit(judge, True, "not audited (promotion.min_judge_agreement is off)")
    key = judge_agreement_key(judge)
    value, low, n = (metric_number(metrics, key + suffix) for suffix in ("", "/low", "/n"))
    if value is None or low is None or not n:
        allowed = config.allow_unaudited_judges
        why = "no pinned item where a verifiable answer and this judge both decide"
        rule = "allowed by" if allowed else "not counted: see"
        return JudgeAudit(judge, allowed, f"unaudited ({why}); {rule} promotion.allow_unaudited_judges")
    needed = f"lower bound needs >= {config.min_judge_agreement:g}"
    shown = f"{value:.3f} [{low:.3f}, {metric_number(metrics, key + '/high') or 0:.3f}] n={int(n)}"
    if low >= config.min_judge_agreement:
        return JudgeAudit(judge, True, f"agrees with the verifiable answers on {shown}, {needed}")
    return JudgeAudit(
        judge, False, f"not counted: agrees with the verifiable answers on only {shown}, {needed}"
    )


def _judges_present(metrics: Mapping[str, float]) -> set[str]:
    return {k.split("/")[1] for k in metrics if k.startswith(f"{GOLDEN}/") and is_win_rate(k)}


def audit_judges(
    metrics: Mapping[str, float], own_reward_trusted: bool, config: PromotionConfig | None = None
) -> dict[str, JudgeAudit]:
    """The audit of every independent preference judge that judged on the pinned set."""
    config = config or PromotionConfig()
    allowed = [*outside_judges(), *([OWN_REWARD_JUDGE] if own_reward_trusted else [])]
    present = _judges_present(metrics)
    return {j: audit_judge(metrics, j, config) for j in allowed if j in present}


def trusted_judges(
    metrics: Mapping[str, float], own_reward_trusted: bool, config: PromotionConfig | None = None
) -> list[str]:
    """Preference judges whose verdicts on the pinned set may decide a policy's promotion:
    independent of the challenger's run, and passing their audit (:func:`audit_judge`)."""
    return [j for j, audit in audit_judges(metrics, own_reward_trusted, config).items() if audit.counts]


@dataclass(frozen=True)
class GateContext:
    """What decides which gates apply to a model: its role, the settings and what was measured."""

    config: PromotionConfig
    role: Role
    has_champion: bool
    judges: tuple[str, ...] = ()  # the trusted preference judges
    has_answers: bool = True  # pinned prompts with verifiable answers were judged
    slices_judged: bool = True  # some slice of the pinned set was big enough to judge


GateRule = Callable[[GateContext], list[Gate]]


@dataclass(frozen=True)
class GateSpec:
    name: str
    role: Role
    rule: GateRule  # the gates it makes for a context (none where its setting is off)


_GATES: NamedRegistry[GateSpec] = NamedRegistry("gate")


def register_gate(spec: GateSpec, replace: bool = False) -> GateSpec:
    """Add a gate rule; a new gate is its own function plus one ``register_gate`` line."""
    return _GATES.add(spec, replace)


def unregister_gate(name: str) -> None:
    _GATES.remove(name)


def gate_specs() -> dict[str, GateSpec]:
    return _GATES.all()


def gate(
    name: str,
    metric: str,
    op: Op,
    threshold: float | None,
    bound: Bound = "value",
    min_rows: int | None = None,
) -> list[Gate]:
    """One gate, or none where its setting is off (``threshold`` None)."""
    return [] if threshold is None else [Gate(name, metric, op, float(threshold), bound, min_rows)]


def per_judge(judges: Sequence[str], name: str, against: str, op: Op, threshold: float | None) -> list[Gate]:
    """One gate per judge on its pinned-set win rate against ``against``: ``{judge}_{name}``."""
    return [
        g for j in judges for g in gate(f"{j}_{name}", win_rate_key(GOLDEN, j, against), op, threshold, "low")
    ]


def _independent_judge(ctx: GateContext) -> list[Gate]:
    """At least one independent judge: verifiable answers or a trusted preference judge."""
    return gate("independent_judge", INDEPENDENT_JUDGES, ">=", 1.0)


def _task_accuracy(ctx: GateContext) -> list[Gate]:
    """With answers: better than the reference and, against a champion, not clearly worse."""
    if not ctx.has_answers:
        return []
    gates = gate("task_accuracy_gain", TASK_ACCURACY_GAIN, ">", ctx.config.min_task_accuracy_gain, "low")
    regression = ctx.config.max_task_accuracy_regression
    if ctx.has_champion and regression is not None:
        gates += gate("task_accuracy_vs_champion", TASK_ACCURACY_VS_CHAMPION, ">=", -regression, "low")
    return gates


def _rl_gain(ctx: GateContext) -> list[Gate]:
    """The RL stage against its start: its task accuracy gain where answers exist, else each
    trusted judge's win rate against it, above a tie by ``min_rl_gain``."""
    if ctx.config.min_rl_gain is None:
        return []
    if ctx.has_answers:
        return gate(RL_GAIN_GATE, RL_GAIN, ">=", ctx.config.min_rl_gain, "low")
    return per_judge(ctx.judges, RL_GAIN_GATE, RL_START, ">=", 0.5 + ctx.config.min_rl_gain)


def _judge_win_rates(ctx: GateContext) -> list[Gate]:
    """Each trusted judge finds the policy not clearly worse than the champion (or, for the
    first champion, better than the reference)."""
    if ctx.has_champion:
        return per_judge(
            ctx.judges, "win_rate_vs_champion", "champion", ">=", ctx.config.min_win_rate_vs_champion
        )
    return per_judge(ctx.judges, "beats_reference", "reference", ">", ctx.config.min_win_rate_vs_reference)


def _length(ctx: GateContext) -> list[Gate]:
    """Answers neither balloon nor collapse against the reference (nor balloon against the champion)."""
    config = ctx.config
    gates = gate("length_growth", LENGTH_GROWTH_RATIO, "<=", config.max_length_growth, "high")
    gates += gate("length_shrink", LENGTH_GROWTH_RATIO, ">=", config.min_length_ratio, "low")
    if ctx.has_champion:
        limit = config.max_length_growth_vs_champion
        gates += gate("length_growth_vs_champion", LENGTH_GROWTH_VS_CHAMPION, "<=", limit, "high")
    return gates


def _degeneration(ctx: GateContext) -> list[Gate]:
    """The policy does not clearly loop more than its reference: fails when even the lower bound
    of the increase in its loop share is above ``max_loop_rate_increase``. A guard, like the slice
    gate: its interval is sound for few prompts, and two models that never loop are not held back
    because a small pinned set cannot prove a tight bound on "never"."""
    limit = ctx.config.max_loop_rate_increase
    return gate(DEGENERATION_GATE, LOOP_RATE_VS_REFERENCE, "<=", limit, "low", min_rows=1)


def _kl(ctx: GateContext) -> list[Gate]:
    return gate("kl", KL_TO_REFERENCE, "<=", ctx.config.max_kl)


def _reward_accuracy(ctx: GateContext) -> list[Gate]:
    """A reward model ranks the pinned pairs well and, against a champion, not clearly worse."""
    gates = gate("reward_accuracy", REWARD_ACCURACY, ">=", ctx.config.min_reward_accuracy, "low")
    regression = ctx.config.max_reward_accuracy_regression
    if ctx.has_champion and regression is not None:
        gates += gate("reward_accuracy_vs_champion", REWARD_ACCURACY_VS_CHAMPION, ">=", -regression, "low")
    return gates


def _reward_calibration(ctx: GateContext) -> list[Gate]:
    return gate("reward_ece", CALIBRATION_ERROR, "<=", ctx.config.max_reward_ece)


def _slice_regression(ctx: GateContext) -> list[Gate]:
    """Against a champion, the worst slice's change must not clearly fall below
    -``max_slice_regression`` (judged on answers: a policy without them has no slices)."""
    judged_on_answers = ctx.role == "reward" or ctx.has_answers
    if not (ctx.has_champion and ctx.slices_judged and judged_on_answers):
        return []
    metric = WORST_SLICE_TASK_ACCURACY if ctx.role == "policy" else WORST_SLICE_REWARD_ACCURACY
    return gate(SLICE_GATE, metric, ">=", _negated(ctx.config.max_slice_regression), "high", min_rows=1)


def _negated(limit: float | None) -> float | None:
    return None if limit is None else -limit


register_gate(GateSpec("independent_judge", "policy", _independent_judge))
register_gate(GateSpec("task_accuracy", "policy", _task_accuracy))
register_gate(GateSpec(RL_GAIN_GATE, "policy", _rl_gain))
register_gate(GateSpec("judge_win_rates", "policy", _judge_win_rates))
register_gate(GateSpec("length", "policy", _length))
register_gate(GateSpec(DEGENERATION_GATE, "policy", _degeneration))
register_gate(GateSpec("kl", "policy", _kl))
register_gate(GateSpec("reward_accuracy", "reward", _reward_accuracy))
register_gate(GateSpec("reward_calibration", "reward", _reward_calibration))
register_gate(GateSpec(SLICE_GATE, "policy", _slice_regression))
register_gate(GateSpec(f"reward_{SLICE_GATE}", "reward", _slice_regression))


def rl_gain_details(metrics: Mapping[str, float], judges: Sequence[str]) -> dict[str, str]:
    """What the RL gain gates measured, in words: the policy against the model its RL stage
    started from, not against the reference (whose gain may all be SFT's)."""
    said = f"policy vs its RL start; {rl_start_said(metrics)}"
    accuracy, start = metric_number(metrics, TASK_ACCURACY), metric_number(metrics, RL_START_TASK_ACCURACY)
    if accuracy is not None and start is not None:
        said += f"; task accuracy {accuracy:.3f} vs its start's {start:.3f}"
    return {RL_GAIN_GATE: said} | {
        f"{j}_{RL_GAIN_GATE}": f"{said}; win rate by {j}, 0.5 = a tie" for j in judges
    }


def loop_details(metrics: Mapping[str, float]) -> dict[str, str]:
    """What the degeneration gate compared, in words: both loop shares and how they were decoded."""
    ours, theirs = read_estimate(metrics, LOOP_RATE), read_estimate(metrics, REFERENCE_LOOP_RATE)
    if ours is None or theirs is None or not ours.n:
        return {}
    said = f"loops in {_share(ours)} of {ours.n} pinned completions, the reference in {_share(theirs)}"
    distinct, reference_distinct = (
        metric_number(metrics, DISTINCT_2),
        metric_number(metrics, REFERENCE_DISTINCT_2),
    )
    if distinct is not None and reference_distinct is not None:
        said += f"; distinct word bigrams {distinct:.3f} vs the reference's {reference_distinct:.3f}"
    return {DEGENERATION_GATE: f"{said}; {decoding_said(metrics)}"}


def _share(estimate: Estimate) -> str:
    assert estimate.value is not None and estimate.low is not None and estimate.high is not None
    return f"{estimate.value:.1%} [{estimate.low:.1%}, {estimate.high:.1%}]"


def decoding_said(metrics: Mapping[str, float]) -> str:
    """The pinned-set decoding settings the evaluation recorded, in words."""
    budget = metric_number(metrics, DECODING_MAX_NEW_TOKENS)
    if budget is None:
        return "decoding settings not recorded"
    sampled = metric_number(metrics, DECODING_DO_SAMPLE)
    temperature = metric_number(metrics, DECODING_TEMPERATURE)
    how = f"sampled at temperature {temperature:g}" if sampled and temperature else "greedy"
    penalty = metric_number(metrics, DECODING_REPETITION_PENALTY)
    penalised = "no repetition penalty" if penalty in (None, 1.0) else f"repetition penalty {penalty:g}"
    return f"decoded {how}, at most {int(budget)} new tokens, {penalised}"


def gates_for(
    config: PromotionConfig,
    role: Role,
    has_champion: bool,
    judges: Sequence[str] = (),
    has_answers: bool = True,
    human: bool = False,
    slices: bool = True,
) -> list[Gate]:
    """The gates that apply to a ``role`` model: every registered rule of its role, in order.

    ``human``: the people who used both versions decide, by the live A/B verdict alone.
    ``slices``: False when no slice of the pinned set was big enough to judge.
    """
    if role not in ("policy", "reward"):
        raise ValueError(f"role must be 'policy' or 'reward', got {role!r}")
    if human:
        if role != "policy":
            raise ValueError("the human gate judges policies")
        threshold = config.min_human_score_gain if config.min_human_score_gain is not None else 0.0
        return gate("human_score_gain", HUMAN_SCORE_GAIN, ">", threshold, "low")
    context = GateContext(config, role, has_champion, tuple(judges), has_answers, slices)
    return [g for spec in _GATES.all().values() if spec.role == role for g in spec.rule(context)]


def _passes(value: float | None, op: Op, threshold: float) -> bool:
    if value is None or not math.isfinite(value):
        return False
    if op == ">=":
        return value >= threshold
    if op == "<=":
        return value <= threshold
    return value > threshold


def metric_number(metrics: Mapping[str, float], key: str) -> float | None:
    """``metrics[key]`` as a float; None where it was not measured."""
    raw = metrics.get(key)
    return None if raw is None else float(raw)


def check_gates(metrics: Mapping[str, float], gates: list[Gate], min_rows: int = 1) -> list[GateResult]:
    """Judge ``metrics`` against each gate on its decisive bound.

    A missing metric (or a missing bound) fails its gate; an interval built on fewer than
    ``min_rows`` judged rows fails as ``insufficient_evidence``, whatever it says.
    """
    return [_judge_gate(gate, metrics, min_rows) for gate in gates]


def _judge_gate(gate: Gate, metrics: Mapping[str, float], min_rows: int) -> GateResult:
    value, low, high, rows = (metric_number(metrics, gate.metric + s) for s in ("", *BOUND_SUFFIXES))
    n = None if rows is None else int(rows)
    result = GateResult(
        gate.name, gate.metric, gate.op, gate.threshold, gate.bound, value, low, high, n, False, "missing"
    )
    if value is None or result.decisive is None:
        return result
    needed = gate.min_rows if gate.min_rows is not None else min_rows
    if gate.bound != "value" and (n is None or n < needed):
        return replace(result, outcome=INSUFFICIENT_EVIDENCE)
    passed = _passes(result.decisive, gate.op, gate.threshold)
    return replace(result, passed=passed, outcome="passed" if passed else "failed")


def _slices_judged(metrics: Mapping[str, float], role: Role) -> bool:
    """False only when the evaluation judged slices and none was big enough (nothing to judge)."""
    count = metric_number(metrics, SLICES_JUDGED if role == "policy" else REWARD_SLICES_JUDGED)
    return count is None or count > 0


def slice_details(slices: Sequence[Mapping[str, Any]] | None, limit: float | None) -> dict[str, str]:
    """The slice gate's detail, from the evaluation's slice rows (worst first): the slices
    that broke (the change's upper bound below ``-limit``) with a lost item each, else the worst."""
    if not slices:
        return {}
    broken = [s for s in slices if limit is not None and s["change"]["high"] < -limit]
    shown = [s["describe"] + _lost_example(s) for s in (broken or slices[:1])[:5]]
    head = f"{len(broken)} broken slice(s): " if broken else "worst slice: "
    return {SLICE_GATE: head + "; ".join(shown)}


def _lost_example(change: Mapping[str, Any]) -> str:
    """One item of a slice that the challenger lost, in words: the prompt and each side's answer."""
    if not change.get("examples"):
        return ""
    item = change["examples"][0]
    sides = ", ".join(f"{k} {str(v)[:60]!r}" for k, v in item.items() if k != "prompt")
    return f", e.g. {str(item['prompt'])[:80]!r}: {sides}"


# a "not clearly worse than the champion" gate -> (its metric, the disagreement behind it, its setting)
_POWER_OF = {
    "task_accuracy_vs_champion": (
        TASK_ACCURACY_VS_CHAMPION, TASK_DISAGREEMENT_VS_CHAMPION, "max_task_accuracy_regression"
    ),
    "reward_accuracy_vs_champion": (
        REWARD_ACCURACY_VS_CHAMPION, REWARD_DISAGREEMENT_VS_CHAMPION, "max_reward_accuracy_regression"
    ),
}  # fmt: skip
POWER = 0.8


def power_details(metrics: Mapping[str, float], config: PromotionConfig) -> dict[str, str]:
    """The power of each "not clearly worse" gate, in words: the pinned items it needs to tell
    its allowed drop from a tie (80% of the time, at the observed disagreement) against the
    items it had. Too few items: a challenger as good as the champion can fail by chance."""
    details = {}
    for gate, (metric, disagreement_key, setting) in _POWER_OF.items():
        drop, share, n = (
            getattr(config, setting),
            metric_number(metrics, disagreement_key),
            metric_number(metrics, metric + "/n"),
        )
        if not drop or share is None or not n:
            continue
        needed = items_to_tell(drop, share, POWER)
        enough = "enough" if n >= needed else "too few: a tie can fail by chance; grow the pinned set"
        details[gate] = (
            f"power: the two differ on {share:.1%} of {int(n)} items; telling a {drop:g} drop from a tie "
            f"{POWER:.0%} of the time needs {needed} ({enough})"
        )
    return details


def release_result(policy_promoted: bool) -> GateResult:
    """``release: together``: the reward model goes with its run's policy, or not at all."""
    value = 1.0 if policy_promoted else 0.0
    outcome = "passed" if policy_promoted else "failed"
    detail = "" if policy_promoted else "this run's policy was not promoted (promotion.release: together)"
    return GateResult(
        RELEASE_GATE, "promotion/policy_promoted", ">=", 1.0, "value", value, None, None, None,
        policy_promoted, outcome, detail,
    )  # fmt: skip


def random_weights_result() -> GateResult:
    """``model.weights: random``: a run for speed or plumbing, whatever its figures say."""
    detail = "started from random weights (model.weights: random): its figures say nothing of the real model"
    return GateResult(
        TRAINED_WEIGHTS_GATE, RANDOM_WEIGHTS, "<=", 0.0, "value", 1.0, None, None, None,
        False, "failed", detail,
    )  # fmt: skip


def decide(
    name: str,
    version: str,
    metrics: Mapping[str, float],
    config: PromotionConfig,
    role: Role,
    champion: str | None,
    judges: Sequence[str] = (),
    human: bool = False,
    details: Mapping[str, str] | None = None,
    policy_promoted: bool | None = None,
) -> PromotionDecision:
    """The decision alone (nothing is written): what ``promote`` and ``promote --dry-run`` show.

    ``human``: judge by live ratings alone (:data:`HUMAN_SCORE_GAIN`), as an A/B test does.
    ``details``: a line per gate name saying what its number is about (the slice it measured).
    ``policy_promoted`` (reward models, ``release: together``): whether the run's policy was.
    """
    has_champion = champion is not None and champion != str(version)
    has_answers = (metric_number(metrics, ANSWERS) or 0) > 0
    judged = {**metrics, INDEPENDENT_JUDGES: float(len(judges) + int(has_answers))}
    gates = gates_for(config, role, has_champion, judges, has_answers, human, _slices_judged(metrics, role))
    details = {
        **power_details(metrics, config),
        **rl_gain_details(metrics, judges),
        **loop_details(metrics),
        **(details or {}),
    }
    results = [
        replace(r, detail=details.get(r.name, r.detail))
        for r in check_gates(judged, gates, config.min_judged_rows)
    ]
    if role == "reward" and policy_promoted is False and config.release == "together":
        results.append(release_result(policy_promoted))  # shown only where it holds the model back
    if metric_number(metrics, RANDOM_WEIGHTS):
        results.append(random_weights_result())  # shown only where it holds the model back
    promoted = all(r.passed for r in results)
    answers = int(metric_number(metrics, ANSWERS) or 0) if role == "policy" else 0
    return PromotionDecision(name, str(version), promoted, tuple(results), champion, tuple(judges), answers)
