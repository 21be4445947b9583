"""Learning tests: each stage moves its metric the right way on the demo task."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_sft_lowers_eval_loss(sft_result):
    m = sft_result.metrics
    assert m["eval/loss"] < 0.5 * m["eval/before_loss"]
    assert (tmp := sft_result.model_dir) and (__import__("pathlib").Path(tmp) / "model.safetensors").exists()


def test_reward_model_ranks_held_out_pairs(sft_result, demo_snapshot, demo_config, tmp_path):
    from alignflow.models.reward_scorer import load_reward_scorer
    from alignflow.training.reward import run_reward

    config = demo_config("reward.save_steps=1000")
    result = run_reward(config, demo_snapshot, tmp_path, model_path=sft_result.model_dir)
    m = result.metrics
    assert m["eval/accuracy"] >= 0.8, m
    assert 0.0 <= m["eval/ece"] <= 1.0 and m["eval/margin_mean"] > 0
    scorer = load_reward_scorer(result.model_dir)
    assert scorer.meta.std == pytest.approx(m["train/reward_std"])
    good, bad = scorer(["What is 2 plus 3?"] * 2, ["The answer is 5.", "I think 9"])
    assert good > bad


def test_dpo_beats_its_sft_reference(sft_result, demo_snapshot, demo_config, task_accuracy_of, tmp_path):
    from alignflow.training.dpo import run_dpo

    result = run_dpo(
        demo_config("dpo.save_steps=1000"), demo_snapshot, tmp_path, model_path=sft_result.model_dir
    )
    assert result.metrics["eval/rewards/accuracies"] > 0.5
    assert result.metrics["eval/rewards/accuracies"] > result.metrics["eval/before_rewards/accuracies"]
    sft_acc, dpo_acc = task_accuracy_of(sft_result.model_dir), task_accuracy_of(result.model_dir)
    assert dpo_acc > sft_acc, (sft_acc, dpo_acc)


def test_reference_free_dpo_measures_against_a_zero_reference(
    sft_result, demo_snapshot, demo_config, tmp_path
):
    from alignflow.training.dpo import run_dpo

    config = demo_config("dpo.reference_free=true", "dpo.max_steps=20", "dpo.save_steps=1000")
    result = run_dpo(config, demo_snapshot, tmp_path, model_path=sft_result.model_dir)
    m = result.metrics
    # against the SFT reference an untrained policy's implicit rewards are exactly 0; against a
    # uniform reference they are beta * log-prob, below zero
    assert m["eval/before_rewards/chosen"] < -0.05 and m["eval/before_rewards/rejected"] < -0.05
    assert m["eval/rewards/margins"] > m["eval/before_rewards/margins"]


def test_grpo_raises_verifiable_reward(sft_result, demo_snapshot, demo_config, tmp_path):
    """Groups of 8 completions for 60 steps: with the demo's 4 for 40 steps the held-out reward
    fell on 1 of 6 seeds (the sampling stream decides); at these settings it rose by 0.11-0.25
    on all 6."""
    from alignflow.training.grpo import run_grpo

    config = demo_config("grpo.save_steps=1000", "grpo.num_generations=8", "grpo.max_steps=60")
    result = run_grpo(config, demo_snapshot, tmp_path, model_path=sft_result.model_dir)
    assert result.metrics["eval/reward"] > result.metrics["eval/before_reward"], result.metrics


def test_a_policy_trained_to_loop_is_refused_by_the_degeneration_gate(
    sft_result, demo_snapshot, demo_config, tmp_path
):
    """SFT on answers said over and over: the answers stay right, so only the loop figure sees it."""
    from alignflow.data.snapshot import load_split, write_split
    from alignflow.evaluation.config import EvaluationConfig
    from alignflow.evaluation.evaluate import evaluate_on_golden
    from alignflow.models import load_causal_lm
    from alignflow.promotion.gates import DEGENERATION_GATE, decide
    from alignflow.promotion.promotion_config import PromotionConfig
    from alignflow.training.sft import run_sft

    looping_data = tmp_path / "looping-data"
    for split in ("train", "eval"):
        rows = load_split(demo_snapshot, split)
        write_split(looping_data, split, [dict(r, chosen=" ".join([r["chosen"]] * 4)) for r in rows])
    config = demo_config("sft.max_steps=120", "sft.learning_rate=0.003", "sft.save_steps=1000")
    looper = run_sft(config, looping_data, tmp_path / "looper", model_path=sft_result.model_dir)

    reference, _ = load_causal_lm(sft_result.model_dir)
    pinned = load_split(demo_snapshot, "eval")
    settings = EvaluationConfig(max_prompts=60, kl_samples=0)

    def loop_gate(policy_dir):
        policy = load_causal_lm(policy_dir)
        metrics = evaluate_on_golden(pinned, policy, reference, None, config=settings).gate_metrics()
        decision = decide("p", "1", metrics, PromotionConfig(), "policy", champion=None)
        return metrics, next(r for r in decision.results if r.name == DEGENERATION_GATE)

    metrics, refused = loop_gate(looper.model_dir)
    assert metrics["golden/loop_rate"] > 0.8 and metrics["golden/reference_loop_rate"] < 0.1, metrics
    assert not refused.passed and refused.low > 0.5
    assert "greedy, at most 16 new tokens" in refused.detail
    assert metrics["golden/task_accuracy"] >= metrics["golden/reference_task_accuracy"] - 0.1
    _, same = loop_gate(sft_result.model_dir)  # the start against itself: no more loops than it had
    assert same.passed and same.value == 0.0
