"""SmolLM2 through every stage of the flow, a few steps each: the wiring of a real model.

``configs/smollm2-math.yaml`` cut to a handful of steps: SFT and GRPO with LoRA on bf16
weights, a MiniLM reward model, evaluation on the word problems' pinned set against SmolLM2
itself, registration and promotion in a real MLflow store. Whether it *learns* is measured
by the full config (README: "Aligning SmolLM2 on 2 CPU cores"), not here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient

from alignflow.flows.retrain import retrain
from alignflow.models.loading import load_tokenizer
from alignflow.registry.models import CHALLENGER, alias_version

# 1 min 50 s of both cores on a quiet machine (7.5 min loaded): the default suite (11.7 min) would
# sit at its 15-min budget, so it is opted into by anyone changing the model path
OPT_IN = "ALIGNFLOW_REAL_MODEL_TESTS"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        os.environ.get(OPT_IN) != "1", reason=f"SmolLM2 through the flow: set {OPT_IN}=1 to run it"
    ),
]
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "smollm2-math.yaml"
FEW_STEPS = [
    "data.demo_rows=160",
    "data.demo_scored_rows=40",
    "sft.max_steps=2",
    "sft.save_steps=2",
    "reward.max_steps=2",
    "reward.save_steps=2",
    "grpo.max_steps=1",
    "grpo.save_steps=1",
    "grpo.per_device_train_batch_size=4",
    "grpo.num_generations=4",
    "grpo.max_completion_length=8",
    "evaluation.max_new_tokens=8",
    "evaluation.max_prompts=16",
    "evaluation.kl_samples=4",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workspace = tmp_path_factory.mktemp("smollm2")
    uri = f"sqlite:///{workspace / 'mlflow.db'}"
    summary = retrain(str(CONFIG), [*FEW_STEPS, f"tracking.uri={uri}"], repo_dir=str(workspace))
    return workspace, uri, summary


def test_every_stage_ran_on_the_real_model_and_both_roles_were_registered(run):
    _, uri, summary = run
    by_name = {stage["name"]: stage for stage in summary["stages"]}
    assert {"sft", "reward", "policy", "evaluate", "register", "promote"} <= set(by_name)
    assert not any(stage["cached"] for stage in summary["stages"])
    assert summary["golden"]["answers"] >= 200, "the word problems' pinned set"
    for role in ("policy", "reward"):
        assert alias_version(uri, f"smollm2-math-{role}", CHALLENGER) == "1"


def test_the_registered_policy_is_smollm2_with_its_chat_template_and_lora_merged(run, tmp_path):
    from alignflow.models import load_causal_lm
    from alignflow.registry.models import download_model_dir

    _, uri, _ = run
    folder = download_model_dir(uri, "smollm2-math-policy", "1", tmp_path / "policy")
    assert not (Path(folder) / "adapter_config.json").exists(), "adapters merged into the weights"
    model, tokenizer = load_causal_lm(folder)
    assert model.config.model_type == "llama" and model.config.vocab_size == 49152
    assert "<|im_start|>" in (load_tokenizer(folder).chat_template or "")
    assert sum(p.numel() for p in model.parameters()) > 100e6


def test_evaluation_judged_the_policy_against_smollm2_itself(run):
    workspace, _, summary = run
    report = next(Path(workspace).rglob("eval_report.json"))
    metrics = json.loads(report.read_text())["metrics"]
    answered = min(16, summary["golden"]["answers"])  # evaluation.max_prompts=16 above
    assert metrics["golden/task_accuracy/n"] == answered
    assert "golden/reference_task_accuracy" in metrics and "golden/task_accuracy_gain" in metrics
    evaluate = next(stage for stage in summary["stages"] if stage["name"] == "evaluate")
    assert evaluate["metrics"], "the gates' figures reached the summary"


def test_the_reward_model_scores_through_its_pyfunc(run):
    _, uri, _ = run
    mlflow.set_tracking_uri(uri)
    try:
        scorer = mlflow.pyfunc.load_model("models:/smollm2-math-reward/1")
        scores = scorer.predict(
            pd.DataFrame({"prompt": ["What is 12 plus 30?"] * 2, "response": ["42", "41"]})
        )
    finally:
        mlflow.set_tracking_uri(None)
    assert list(scores.columns) == ["reward"] and scores["reward"].notna().all()
    assert MlflowClient(uri).get_registered_model("smollm2-math-reward").name == "smollm2-math-reward"
