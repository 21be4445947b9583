"""Gated promotion in the MLflow registry: ``champion`` moves only when every gate passes.

The decision itself is :func:`alignflow.promotion.gates.decide`, pure code over numbers;
here it is fed from the store (the champion, the metrics a version was judged on) and
recorded there: the outcome as tags on the model version and as its description
(:mod:`alignflow.registry.decision_card`), and in the model card beside its weights
(:mod:`alignflow.registry.model_card`), so the registry itself explains why a version
was or was not promoted; the champion history lives in the ``champion.previous`` tag chain
that :func:`rollback` walks back. Times are ISO 8601 (UTC).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric

from alignflow.evaluation.cost import cost_line
from alignflow.evaluation.embedding_judge import judge_line
from alignflow.evaluation.judge_registry import OUTSIDE_JUDGE
from alignflow.evaluation.metric_names import ANSWERS, HANDED_ON_STEP, TASK_ACCURACY_GAIN, stage_figure
from alignflow.evaluation.rl_stage import rl_gain_line
from alignflow.kill_points import kill_point
from alignflow.promotion.gates import GateResult, JudgeAudit, PromotionDecision, Role, decide, metric_number
from alignflow.promotion.promotion_config import PromotionConfig
from alignflow.registry.decision_card import (
    MAX_DESCRIPTION,
    JudgedOn,
    decision_sentence,
    version_description,
)
from alignflow.registry.decision_tags import (  # noqa: F401 (the names promotion keeps, read here)
    DECIDED_AT_TAG,
    DECISION_TAG,
    FAILED_GATES_TAG,
    GATE_TAG_PREFIX,
    GATES_TAG,
    JUDGE_AUDIT_TAG,
    JUDGES_TAG,
    MAX_TAG_VALUE,
    OUTCOME_FAILED_TAG,
    OUTCOME_REASON_TAG,
    OUTCOME_TAG,
    PREVIOUS_CHAMPION_TAG,
    PROMOTED_AT_TAG,
    REASON_TAG,
    SYSTEM_METRICS,
)
from alignflow.registry.model_card import write_model_card
from alignflow.registry.models import CHAMPION, version_by_alias
from alignflow.registry.pipeline_record import run_cost


def record_metrics(tracking_uri: str, name: str, version: str, metrics: Mapping[str, float]) -> None:
    """Keep the metrics a version is judged on as metrics of the run that logged it, for later
    re-judging: as version tags (``metric.*``, over a hundred) they buried the decision on
    the version's page. Versions registered from one run share its metrics; a version
    registered from no run keeps none."""
    client = MlflowClient(tracking_uri)
    run_id = client.get_model_version(name, version).run_id
    if not run_id:
        return
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(key, float(value), now, 0) for key, value in metrics.items()])


def recorded_metrics(tracking_uri: str, name: str, version: str) -> dict[str, float]:
    """The metrics of the run that logged the version (as :func:`record_metrics` keeps them),
    less the machine's own (``system/*``: what registering cost, not what was judged)."""
    client = MlflowClient(tracking_uri)
    run_id = client.get_model_version(name, version).run_id
    if not run_id:
        return {}
    metrics = client.get_run(run_id).data.metrics
    return {key: value for key, value in metrics.items() if not key.startswith(SYSTEM_METRICS)}


def _results_json(results: list[GateResult]) -> str:
    return json.dumps([asdict(r) for r in results], sort_keys=True)


def _set_tags(client: MlflowClient, name: str, version: str, tags: Mapping[str, str]) -> None:
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)


def now_iso() -> str:
    """The current time as the registry's tags keep it: ISO 8601 in UTC, to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def outcome_tags(outcome: str, sentence: str, reason: str | None = None) -> dict[str, str]:
    """A decision as tags: the short ``decision*`` ones the version page shows first, and the
    ``promotion.*`` ones that scripts read (``reason``: the detailed one, else the sentence)."""
    return {
        OUTCOME_TAG: outcome,
        OUTCOME_REASON_TAG: sentence[:MAX_TAG_VALUE],
        DECIDED_AT_TAG: now_iso(),
        DECISION_TAG: outcome,
        REASON_TAG: (reason or sentence)[:MAX_TAG_VALUE],
    }


def set_champion(tracking_uri: str, name: str, version: str, reason: str) -> str | None:
    """Move ``champion`` to ``version``, remembering the one it replaces; returns that one."""
    client = MlflowClient(tracking_uri)
    current = version_by_alias(tracking_uri, name, CHAMPION)
    previous = str(current.version) if current is not None else None
    if previous == str(version):
        return previous
    history = {PREVIOUS_CHAMPION_TAG: previous or "", PROMOTED_AT_TAG: now_iso()}
    _set_tags(client, name, str(version), history | outcome_tags("promoted", reason))
    client.set_registered_model_alias(name, CHAMPION, str(version))
    return previous


def add_to_description(tracking_uri: str, name: str, version: str, sentence: str) -> None:
    """Put a later decision (by hand, a rollback) on top of a version's page, dated, keeping
    the gated decision below it: the page reads as the version's history, newest first."""
    client = MlflowClient(tracking_uri)
    earlier = client.get_model_version(name, version).description or ""
    text = f"**{sentence}** ({now_iso()})" + (f"\n\n---\n\n{earlier}" if earlier else "")
    client.update_model_version(name, version, description=text[:MAX_DESCRIPTION])


def promote_by_hand(tracking_uri: str, name: str, version: str) -> str | None:
    """Move ``champion`` to ``version`` without checking gates (``promote --force``), saying so
    on the version; returns the version it replaced."""
    previous = version_by_alias(tracking_uri, name, CHAMPION)
    if previous is not None and str(previous.version) == str(version):
        return str(version)  # already the champion: nothing moves, nothing to record
    replaced = f", replacing version {previous.version}" if previous is not None else ""
    sentence = f"Promoted to champion by hand, gates not checked{replaced}."
    result = set_champion(tracking_uri, name, str(version), sentence)
    add_to_description(tracking_uri, name, str(version), sentence)
    write_model_card(tracking_uri, name, str(version))
    return result


def audit_tag(audits: Mapping[str, JudgeAudit]) -> dict[str, str]:
    """Each preference judge's audit, as one tag: how the judges that counted were validated."""
    if not audits:
        return {}
    text = json.dumps({j: a.reason for j, a in audits.items()}, sort_keys=True)
    return {JUDGE_AUDIT_TAG: text[:MAX_TAG_VALUE]}


def decision_tags(decision: PromotionDecision) -> dict[str, str]:
    """What the registry keeps of a decision: every gate with its interval and n, the judges."""
    tags = {
        GATES_TAG: _results_json(list(decision.results))[:MAX_TAG_VALUE],
        JUDGES_TAG: ",".join(decision.judges) or "none",
    }
    for r in decision.results:
        tags[GATE_TAG_PREFIX + r.name] = f"{r.outcome}: {r.describe()}"[:MAX_TAG_VALUE]
    return tags


def promote(
    tracking_uri: str,
    name: str,
    version: str,
    metrics: Mapping[str, float],
    config: PromotionConfig,
    role: Role,
    judges: Sequence[str] = (),
    tags: Mapping[str, str] | None = None,
    human: bool = False,
    details: Mapping[str, str] | None = None,
    policy_promoted: bool | None = None,
    audits: Mapping[str, JudgeAudit] | None = None,
) -> PromotionDecision:
    """Judge ``version`` by its metrics; move ``champion`` only if every gate passes.

    Either way the version is tagged with the decision, each gate's value, interval and
    judged rows, the judges that counted and ``tags`` (the pinned set's version); a
    rejected version also gets ``promotion.failed_gates`` naming the gates it failed. Its
    description says the same for people (:func:`~alignflow.registry.decision_card.version_description`).
    """
    from alignflow.registry.lineage import champion_before_run

    client = MlflowClient(tracking_uri)
    version = str(version)
    champion = champion_before_run(tracking_uri, name, version=version)  # a rerun: as first found
    decision = decide(name, version, metrics, config, role, champion, judges, human, details, policy_promoted)
    record_metrics(tracking_uri, name, version, metrics)
    _set_tags(client, name, version, {**(tags or {}), **decision_tags(decision), **audit_tag(audits or {})})
    kill_point("promote.tagged")
    if decision.promoted:
        set_champion(tracking_uri, name, version, decision_sentence(decision))
    else:
        failed = {
            r.name: {"outcome": r.outcome, "value": r.value, "low": r.low, "high": r.high, "n": r.n,
                     "bound": r.bound, "op": r.op, "threshold": r.threshold,
                     **({"detail": r.detail} if r.detail else {})}
            for r in decision.failed
        }  # fmt: skip
        _set_tags(
            client,
            name,
            version,
            {
                **outcome_tags("rejected", decision_sentence(decision), decision.reason),
                OUTCOME_FAILED_TAG: ",".join(failed),
                FAILED_GATES_TAG: json.dumps(failed, sort_keys=True)[:MAX_TAG_VALUE],
            },
        )
    kill_point("promote.decided")
    describe_version(tracking_uri, decision, metrics, role)
    kill_point("promote.described")
    write_model_card(tracking_uri, name, version)  # now that the decision is known: see model_card
    return decision


def judged_on(
    tracking_uri: str, name: str, version: str, metrics: Mapping[str, float], role: Role = "policy"
) -> JudgedOn:
    """What a version was judged on, from its tags (data and pinned-set versions) and the
    pipeline run that registered it; for a policy, what its RL stage added over its start."""
    from alignflow.registry.lineage import producing_pipeline_run
    from alignflow.registry.runs import ACCEPTED_UNJUDGED_TAG, DATA_VERSION_TAG, GOLDEN_VERSION_TAG

    client = MlflowClient(tracking_uri)
    registered = client.get_model_version(name, version)
    pipeline = producing_pipeline_run(tracking_uri, registered)
    return JudgedOn(
        data_version=registered.tags.get(DATA_VERSION_TAG),
        golden_version=registered.tags.get(GOLDEN_VERSION_TAG),
        pipeline_run_id=pipeline,
        experiment_id=client.get_run(pipeline).info.experiment_id if pipeline else None,
        answers=int(metric_number(metrics, ANSWERS) or 0),
        accepted_unjudged=registered.tags.get(ACCEPTED_UNJUDGED_TAG),
        rl_stage=rl_gain_line(metrics) if role == "policy" else None,
        cost=cost_said(tracking_uri, pipeline, metrics, role) if pipeline else None,
        outside_judge=judge_line(metrics, OUTSIDE_JUDGE, win_rates=role == "policy"),
        handed_on=handed_on_said(tracking_uri, pipeline) if pipeline and role == "policy" else None,
    )


def handed_on_said(tracking_uri: str, pipeline_run_id: str) -> str | None:
    """The policy stage's handed-on step, as its run logged it (``ppo.hand_on``,
    ``grpo.hand_on``, ``dpo.hand_on``); None where it drew no held-out curve to choose from."""
    from alignflow.registry.model_card import stage_runs

    run = stage_runs(tracking_uri, pipeline_run_id).get("policy")
    step = stage_figure(run.data.metrics, HANDED_ON_STEP) if run is not None else None
    if run is None or step is None:
        return None
    last = stage_figure(run.data.metrics, "global_step")
    of = f" of {int(last)}" if last is not None else ""
    start = " (the start: no later step beat it)" if step == 0 else ""
    curve = "its held-out curve: plots/learning_curves.png"
    return f"Handed on: step {int(step)}{of} of the policy stage{start}; {curve}"


def cost_said(
    tracking_uri: str, pipeline_run_id: str, metrics: Mapping[str, float], role: Role
) -> str | None:
    """The pipeline run's cost, as its stage runs logged it; a policy's priced per +0.01 of
    the gated task accuracy gain over the reference. None where no stage logged a cost."""
    spent, reused = run_cost(tracking_uri, pipeline_run_id)
    if not spent:
        return None
    gain = metric_number(metrics, TASK_ACCURACY_GAIN) if role == "policy" else None
    return cost_line(spent, gain, reused)


def describe_version(
    tracking_uri: str, decision: PromotionDecision, metrics: Mapping[str, float], role: Role = "policy"
) -> None:
    """Write the decision as the version's description: what its page in the UI shows first."""
    context = judged_on(tracking_uri, decision.name, decision.version, metrics, role)
    MlflowClient(tracking_uri).update_model_version(
        decision.name, decision.version, description=version_description(decision, context)
    )


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
    reason = f"Rolled back: champion returned to version {previous}."
    _set_tags(client, name, str(current.version), outcome_tags("rolled_back", reason))
    add_to_description(tracking_uri, name, str(current.version), reason)
    write_model_card(tracking_uri, name, str(current.version))
    return str(current.version), previous


def champion_judge(
    tracking_uri: str, project: str, out_root: Path, role: str, pipeline_run: str | None = None
) -> dict[str, Any] | None:
    """A local copy of ``role``'s champion and the pinned-set accuracy it was promoted on, for
    judging new data's labels; None when there is no champion or no recorded accuracy. Given the
    ``pipeline_run`` asking, the champion as that run first found it."""
    from alignflow.evaluation.metric_names import REWARD_ACCURACY, REWARD_ACCURACY_EVAL
    from alignflow.registry import models as registry_models
    from alignflow.registry.lineage import champion_copy

    model_dir, version = champion_copy(tracking_uri, project, out_root, role, pipeline_run)
    if model_dir is None:
        return None
    metrics = recorded_metrics(tracking_uri, registry_models.registered_name(project, role), version)
    accuracy = metrics.get(REWARD_ACCURACY, metrics.get(REWARD_ACCURACY_EVAL))
    return None if accuracy is None else {"model_dir": model_dir, "accuracy": accuracy}
