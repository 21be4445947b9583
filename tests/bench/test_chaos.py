"""The chaos bench's promise on the tiny demo: SIGKILLed in training, between "version made" and
"challenger", and between "champion moved" and "described", each time rerun plainly, the run
ends as an uninterrupted one: the same champion weights, nothing doubled, nothing undecided."""

from __future__ import annotations

import pytest

from bench import chaos_bench as chaos
from tests.flows.conftest import TINY_FLOW

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
DEMO = [*TINY_FLOW, "project=chaos", "dpo.max_steps=8", "dpo.save_steps=2"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return chaos.reference_run(tmp_path_factory.mktemp("chaos"), DEMO)


def test_the_reference_has_both_champions(reference):
    assert set(reference["names"]) == {"policy", "reward"}, reference["summary"]["promotions"]


def test_killed_in_training_and_between_registry_writes_the_reruns_finish_the_same_job(reference, tmp_path):
    workspace = tmp_path / "killed"

    def policy_checkpointed() -> bool:  # mid-training, whatever the machine's speed
        return any(workspace.glob("outputs/chaos/policy-*/checkpoints/checkpoint-4"))

    assert chaos.kill_when(workspace, DEMO, policy_checkpointed) == "policy"
    # each plain rerun goes on from where the one before it died, and is itself killed
    assert chaos.kill_at_point(workspace, DEMO, "register.versioned") == "register"
    assert chaos.kill_at_point(workspace, DEMO, "promote.decided") == "promote"
    _, summary = chaos.run_to_end(workspace, DEMO)

    checks, notes = chaos.check(workspace, summary, reference)
    failed = [name for name, ok in checks.items() if not ok]
    assert not failed, f"{failed}: {notes}"
    stages = {s["name"]: s for s in summary["stages"]}
    assert stages["policy"]["cached"] and stages["register"]["cached"]  # finished by the runs before
    assert summary["promotions"]["policy"]["promoted"]


def test_the_checks_see_a_doubled_version_and_an_undecided_one(reference, tmp_path):
    """The same checks on a store where a rerun registered the model a second time without a
    decision: they must say so (else the test above proves nothing)."""
    import shutil

    from mlflow import MlflowClient

    shutil.copy(reference["workspace"] / "mlflow.db", tmp_path / "mlflow.db")
    uri = chaos.tracking_uri(tmp_path)
    client = MlflowClient(uri)
    name = reference["names"]["policy"]
    first = client.get_model_version(name, "1")
    client.create_model_version(name, source=str(tmp_path), run_id=first.run_id)  # logged again, by a rerun
    checks, _ = chaos.registry_checks(uri)
    assert not checks["one version per model"] and not checks["every version decided"]


def test_a_killed_prefect_worker_leaves_a_crashed_run_and_the_next_run_resumes(reference, tmp_path):
    """``alignflow serve`` (a local process worker) on a Prefect server of its own, SIGKILLed with
    the flow run it was training: the new worker marks that run crashed, and the deployment's
    next run resumes the policy from its checkpoint to the uninterrupted champion."""
    from mlflow import MlflowClient

    from alignflow.registry.runs import STAGE_TAG

    workspace = tmp_path / "worker"

    def policy_checkpointed() -> bool:
        return any(workspace.glob("outputs/chaos/policy-*/checkpoints/checkpoint-4"))

    with chaos.prefect_server(tmp_path / "prefect") as api:
        outcome = chaos.kill_worker_and_rerun(workspace, DEMO, api, policy_checkpointed)
    assert outcome.processes_killed >= 2, "the worker and its flow run's process"
    assert outcome.killed_state == "RUNNING"
    assert outcome.crashed_state == "CRASHED", outcome
    assert "killed" in outcome.crashed_message and outcome.worker_lines, outcome
    assert outcome.rerun_state == "COMPLETED", (workspace / "worker.log").read_text()[-3000:]

    uri = chaos.tracking_uri(workspace)
    summary = chaos.parent_summary(uri)
    checks, notes = chaos.check(workspace, summary, reference)
    failed = [name for name, ok in checks.items() if not ok]
    assert not failed, f"{failed}: {notes}"
    policy = next(r for r in chaos.stage_runs(uri) if r.data.tags.get(STAGE_TAG) == "policy")
    assert "checkpoint-" in policy.data.tags.get("dpo.resumed_from", ""), policy.data.tags
    assert policy.data.tags.get("dpo.resume_exact") == "yes", "deterministic kernels on this CPU"
    assert MlflowClient(uri).get_run(summary["parent_run_id"]).info.status == "FINISHED"
