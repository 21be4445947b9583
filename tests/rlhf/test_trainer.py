"""RLHFTrainer's behaviour: it learns, its numbers come from what ran, and it resumes."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest

from alignflow.rlhf import RewardModel, RewardModelConfig, RLHFTrainer, TrainingConfig, TrainingResult


def _config(**changes) -> TrainingConfig:
    settings = dict(
        base_model="tiny",
        max_steps=2,
        batch_size=16,
        mini_batch_size=8,
        ppo_epochs=2,
        learning_rate=1e-3,
        max_new_tokens=6,
        init_kl_coef=0.05,
        reward=RewardModelConfig(base_model="tiny", use_lora=False, learning_rate=1e-3, num_epochs=10),
    )
    return TrainingConfig(**{**settings, **changes})


@pytest.fixture(scope="module")
def learned(tmp_path_factory, feedback_list) -> tuple[Path, TrainingResult]:
    out = tmp_path_factory.mktemp("learned")
    return out, RLHFTrainer(_config(max_steps=20)).train(feedback_list, out)


def test_ppo_raises_the_reward_on_held_out_prompts(learned):
    from alignflow.evaluation.policy_reward import policy_reward
    from alignflow.training.chain import held_out_prompts

    out, result = learned
    prompts = [row["prompt"] for row in held_out_prompts(out / "data")]
    train_prompts = {json.loads(line)["prompt"] for line in (out / "feedback.jsonl").read_text().splitlines()}
    assert prompts and result.final_reward_n == len(prompts) < len(train_prompts)
    before = policy_reward(out / "ppo_stage" / "base-model", out / "reward_model", prompts, max_new_tokens=6)
    assert result.final_reward_mean > before.mean + 0.05, (before.mean, result.final_reward_mean)
    history = result.reward_history
    assert statistics.fmean(history[-5:]) > statistics.fmean(history[:5]) + 0.1, history


def test_histories_have_one_entry_per_iteration_from_the_stage(learned):
    out, result = learned
    stage = out / "ppo_stage"
    history = [json.loads(line) for line in (stage / "history.jsonl").read_text().splitlines()]
    state = json.loads((stage / "checkpoints" / "checkpoint-20" / "trainer_state.json").read_text())
    assert result.training_steps == state["iteration"] == len(history) == 20
    assert [h["iteration"] for h in history] == list(range(1, 21))
    assert result.reward_history == [h["reward/mean"] for h in history]
    assert result.kl_history == [h["objective/kl"] for h in history]
    assert result.loss_history == [h["loss/total"] for h in history]
    assert len(result.value_loss_history) == 20
    assert TrainingResult.load(out / "training_results.json") == result


def test_training_steps_are_the_iterations_that_ran_across_a_resume(tmp_path, feedback_list):
    """A second call on the same folder continues from the checkpoint: 2 iterations, then 2 more."""

    @dataclass
    class Feedback:  # feedback may be any object with the fields as attributes
        prompt: str
        response: str
        score: float

    feedbacks = [Feedback(f["prompt"], f["response"], f["score"]) for f in feedback_list]
    first = RLHFTrainer(_config(max_steps=2)).train(feedbacks, tmp_path)
    assert first.training_steps == 2 and first.resumed_from is None
    second = RLHFTrainer(_config(max_steps=4)).train(feedbacks, tmp_path)
    assert second.training_steps == 4 and second.resumed_from.endswith("checkpoint-2")
    assert len(second.reward_history) == len(second.kl_history) == len(second.loss_history) == 4
    assert second.reward_history[:2] == first.reward_history
    assert second.loss_history[:2] == first.loss_history


def test_comparisons_train_a_bradley_terry_reward_model(tmp_path, comparison_list):
    result = RLHFTrainer(_config(max_steps=1)).train(comparison_list, tmp_path)
    assert result.reward_mode == "pairwise" and result.feedback_count == 16
    assert RewardModel.from_pretrained(result.reward_model_path).meta.mode == "pairwise"
    assert result.training_steps == 1 and len(result.reward_history) == 1


def test_every_feedback_row_is_in_the_snapshot(learned, feedback_list):
    out, result = learned
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    counts = manifest["counts"]
    assert counts["input"] == result.feedback_count == len(feedback_list)
    assert counts["train"] + counts["eval"] + counts["quarantine"] == counts["input"]
    assert manifest["data_version"] == result.data_version


def test_bad_feedback_is_refused_before_anything_trains(tmp_path, feedback_list):
    trainer = RLHFTrainer(_config())
    with pytest.raises(ValueError, match=r"9 feedback rows; training needs at least 10"):
        trainer.train(feedback_list[:9], tmp_path / "few")
    with pytest.raises(ValueError, match=r"feedback\[3\]: 'score' must be in \[0, 1\], got 7"):
        trainer.train([*feedback_list[:3], {"prompt": "p", "response": "r", "score": 7}], tmp_path / "bad")
    with pytest.raises(ValueError, match="not both"):
        trainer.train(feedback_list, tmp_path / "both", reward_model_path="x", reward_model=object())
    with pytest.raises(TypeError, match="reward_model must be a RewardModel, got str"):
        trainer.train(feedback_list, tmp_path / "type", reward_model="models/reward")
    with pytest.raises(FileNotFoundError, match="not a saved reward model"):
        trainer.train(feedback_list, tmp_path / "missing", reward_model_path=tmp_path / "nowhere")
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_model_that_cannot_be_loaded_offline_is_named_before_anything_runs(
    monkeypatch, tmp_path, feedback_list
):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    missing = "no-such-org/no-such-model"
    with pytest.raises(ValueError, match=rf"^TrainingConfig\.base_model='{missing}' cannot be loaded"):
        RLHFTrainer(_config(base_model=missing)).train(feedback_list, tmp_path / "policy")
    reward = RewardModelConfig(base_model=missing)
    with pytest.raises(ValueError, match=r"^RewardModelConfig\.base_model="):
        RLHFTrainer(_config(reward=reward)).train(feedback_list, tmp_path / "reward")
    assert not any(tmp_path.iterdir())


def test_result_save_and_load_round_trip(tmp_path):
    result = TrainingResult(
        model_path="m/policy",
        reward_model_path=None,
        feedback_count=12,
        final_reward_mean=0.8,
        final_reward_std=0.1,
        training_steps=3,
        reward_history=[0.1, 0.2, 0.3],
        kl_history=[0.0, 0.5, 0.7],
        loss_history=[1.0, 0.9, 0.8],
    )
    path = result.save(tmp_path / "training_results.json")
    assert TrainingResult.load(path) == result
    assert TrainingResult.load(tmp_path) == result  # a folder holding training_results.json
    data = json.loads(path.read_text())
    data["added_by_a_newer_version"] = 1
    path.write_text(json.dumps(data))
    assert TrainingResult.load(path) == result
