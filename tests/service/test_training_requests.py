"""What a training request may ask for, what the feedback decides, ?wait=true, the estimate."""

from __future__ import annotations

import pytest

from alignflow.service.estimate import (
    ALGORITHM_TAG,
    JOB_SECONDS_METRIC,
    MODEL_SIZE_TAG,
    POLICY_SECONDS_METRIC,
    STEPS_METRIC,
    model_size,
)
from alignflow.training.feedback_plan import FeedbackCounts, PlanError, plan_for

from .conftest import auth
from .test_api import FEEDBACK, TRAIN, pair_bodies, scored_bodies
from .test_training import GatedLauncher, wait_for_job


def distinct_scored(n: int) -> list[dict]:
    """One rating for each of ``n`` prompts: spec 002's shape, no pair anywhere."""
    return [
        {
            "prompt": f"What is {i} plus {i + 1}?",
            "response": f"The answer is {2 * i + 1}.",
            "score": (i % 5) / 4,
        }
        for i in range(n)
    ]


def post_all(client, agent: str, bodies: list[dict]) -> None:
    for body in bodies:
        assert client.post(FEEDBACK.format(agent), json=body, headers=auth()).status_code == 201


# ---------------------------------------------------------------- the plan follows the data


@pytest.mark.parametrize(
    ("counts", "mode", "algorithm", "sft"),
    [
        (FeedbackCounts(scored=12), "regression", "ppo", False),
        (FeedbackCounts(pairwise=12), "pairwise", "dpo", True),
        (FeedbackCounts(scored=12, pairwise=3), "mixed", "ppo", False),
    ],
)
def test_the_reward_model_and_algorithm_follow_the_feedback(counts, mode, algorithm, sft):
    plan = plan_for(counts)
    assert (plan.reward_mode, plan.algorithm, plan.run_sft) == (mode, algorithm, sft)
    assert f"policy.algorithm={algorithm}" in plan.overrides()


def test_a_named_algorithm_wins_unless_the_data_cannot_feed_it():
    assert plan_for(FeedbackCounts(pairwise=5), "grpo").algorithm == "grpo"
    # ratings of one prompt with different scores form pairs: DPO can use them (no SFT: nothing chosen)
    formed = FeedbackCounts.of([{"prompt": "p", "score": 0.1}, {"prompt": "p", "score": 0.9}])
    assert formed.formed_pairs == 1
    assert (plan_for(formed, "dpo").algorithm, plan_for(formed, "dpo").run_sft) == ("dpo", False)
    with pytest.raises(PlanError, match="dpo.*no two of them"):
        plan_for(FeedbackCounts.of(distinct_scored(12)), "dpo")


# ---------------------------------------------------------------- the request reaches the job


def test_request_fields_reach_the_job_and_the_dry_run_echoes_them(make_client):
    launcher = GatedLauncher()
    launcher.release.set()
    client = make_client(launcher)
    post_all(client, "agent-r", pair_bodies(12))
    fields = {
        "maxSteps": 7,
        "learningRate": 0.002,
        "batchSize": 4,
        "useLora": True,
        "loraR": 4,
        "loraAlpha": 8,
    }
    fields["loraDropout"] = 0.2
    dry = client.post(TRAIN.format("agent-r"), json={"dryRun": True, **fields}, headers=auth()).json()
    assert dry["modelConfig"] == {
        "base_model": "tiny",
        "use_lora": True,
        "lora_r": 4,
        "lora_alpha": 8,
        "lora_dropout": 0.2,
        "learning_rate": 0.002,
        "max_steps": 7,
        "batch_size": 4,
        "algorithm": "dpo",
        "reward_mode": "pairwise",
        "run_sft": True,
    }
    started = client.post(TRAIN.format("agent-r"), json={**fields, "algorithm": "ppo"}, headers=auth())
    assert started.status_code == 202, started.text
    wait_for_job(client, started.json()["jobId"])
    request = launcher.requests[0]
    assert request.algorithm == "ppo" and request.max_steps == 7 and request.learning_rate == 0.002
    for item in (
        "policy.algorithm=ppo",
        "ppo.max_steps=7",
        "ppo.learning_rate=0.002",
        "ppo.per_device_train_batch_size=4",
        "model.lora.enabled=true",
        "model.lora.r=4",
        "model.lora.alpha=8",
        "model.lora.dropout=0.2",
    ):
        assert item in request.overrides, (item, request.overrides)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"maxSteps": 5, "epochs": 3}, "epochs"),  # unknown field
        ({"maxSteps": 0}, "maxSteps"),
        ({"learningRate": -1}, "learningRate"),
        ({"loraR": 8}, "useLora"),  # LoRA settings without LoRA
        ({"algorithm": "reinforce"}, "algorithm"),
        ({"baseModel": "no-such-org/no-such-model"}, "baseModel"),
        ({"algorithm": "dpo"}, "dpo"),  # ratings of distinct prompts: no pair to learn from
        ({"algorithm": "grpo", "batchSize": 5}, "num_generations"),  # the config says why
    ],
)
def test_a_request_that_cannot_train_is_a_422_naming_the_field(make_client, body, message):
    launcher = GatedLauncher()
    client = make_client(launcher)
    post_all(client, "agent-x", distinct_scored(12))
    for dry_run in (True, False):
        response = client.post(TRAIN.format("agent-x"), json={**body, "dryRun": dry_run}, headers=auth())
        assert response.status_code == 422, response.text
        assert message in response.text
    assert launcher.requests == []


# ---------------------------------------------------------------- ?wait=true


def test_wait_answers_with_the_trained_policy(make_client):
    launcher = GatedLauncher()
    launcher.release.set()
    client = make_client(launcher)
    post_all(client, "agent-w", scored_bodies(12))
    response = client.post(TRAIN.format("agent-w") + "?wait=true", json={"maxSteps": 3}, headers=auth())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "trained"
    spec_fields = {"policyId", "version", "modelPath", "rewardModelPath", "feedbackCount", "trainingSteps"}
    assert spec_fields | {"rewardMean", "rewardStd"} <= set(body)
    assert body["trainingSteps"] == 3 and body["feedbackCount"] == 12 and body["rewardMean"] == 0.5
    # the service's default can be the spec's synchronous shape, for clients that never say ?wait
    sync = make_client(launcher, training={"wait_by_default": True})
    post_all(sync, "agent-v", scored_bodies(12))
    assert sync.post(TRAIN.format("agent-v"), json={}, headers=auth()).json()["status"] == "trained"
    assert sync.post(TRAIN.format("agent-v") + "?wait=false", json={}, headers=auth()).status_code == 202


def test_wait_on_a_failing_job_is_an_error_never_a_half_filled_success(make_client):
    launcher = GatedLauncher(fail=True)
    launcher.release.set()
    client = make_client(launcher)
    post_all(client, "agent-f", scored_bodies(12))
    response = client.post(TRAIN.format("agent-f") + "?wait=true", json={}, headers=auth())
    assert response.status_code == 500
    assert "failed: ValueError: reward stage diverged" in response.json()["detail"]
    assert "policyId" not in response.json() and "status" not in response.json()


# ---------------------------------------------------------------- the estimate


def test_the_estimate_uses_measured_runs_of_the_same_model_size(make_client, make_settings):
    import mlflow
    from mlflow import MlflowClient

    from alignflow.config import load_config

    client = make_client()
    post_all(client, "agent-e", distinct_scored(12))
    first = client.post(
        TRAIN.format("agent-e"), json={"dryRun": True, "maxSteps": 100}, headers=auth()
    ).json()
    assert first["estimateBasis"].startswith("default:")
    default = make_settings().training
    assert first["estimatedTimeMinutes"] == pytest.approx(
        (100 * default.seconds_per_step + default.overhead_seconds) / 60, abs=0.01
    )

    uri = make_settings().tracking_uri
    mlflow_client = MlflowClient(uri)
    experiment = mlflow_client.create_experiment("earlier-jobs")
    size = model_size(load_config(None).model)  # the service's embedded pipeline config
    # two earlier PPO jobs of the tiny model: 0.2 and 0.4 s/step, 30 and 50 s elsewhere;
    # a DPO job and a job of another size must not count
    for algorithm, model, steps, policy_s, job_s in (
        ("ppo", size, 50, 10.0, 40.0),
        ("ppo", size, 100, 40.0, 90.0),
        ("dpo", size, 10, 100.0, 200.0),
        ("ppo", "qwen2.5-7b", 10, 500.0, 900.0),
    ):
        run = mlflow_client.create_run(experiment, tags={MODEL_SIZE_TAG: model, ALGORITHM_TAG: algorithm})
        for key, value in (
            (STEPS_METRIC, steps),
            (POLICY_SECONDS_METRIC, policy_s),
            (JOB_SECONDS_METRIC, job_s),
        ):
            mlflow_client.log_metric(run.info.run_id, key, value)
    mlflow.set_tracking_uri(None)
    second = client.post(
        TRAIN.format("agent-e"), json={"dryRun": True, "maxSteps": 100}, headers=auth()
    ).json()
    assert second["estimateBasis"].startswith("measured: median of 2 earlier ppo job(s)"), second
    assert second["estimatedTimeMinutes"] == pytest.approx((100 * 0.3 + 40) / 60, abs=0.01)
