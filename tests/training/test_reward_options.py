"""Reward-stage options of issue #15 part 3: pooling, length debiasing, frozen lower layers."""

from __future__ import annotations

import pytest
import torch


def _pair(chosen: str, rejected: str) -> dict:
    return {"prompt": "Q?", "chosen": chosen, "rejected": rejected}


def test_length_prior_reads_which_length_wins():
    from alignflow.training.reward import fit_length_prior

    shorter_wins = [_pair("no", "no, and here is why at length")] * 8 + [_pair("long answer here", "ok")] * 2
    longer_wins = [_pair(r["rejected"], r["chosen"]) for r in shorter_wins]
    assert fit_length_prior(shorter_wins) < -0.1
    assert fit_length_prior(longer_wins) == pytest.approx(-fit_length_prior(shorter_wins))
    balanced = [_pair("a", "a much longer one"), _pair("a much longer one", "a")]
    assert fit_length_prior(balanced) == pytest.approx(0.0, abs=1e-9)


def test_length_split_accuracy():
    from alignflow.training.reward import length_split_accuracy

    pairs = [_pair("short", "much longer"), _pair("much longer", "short"), _pair("long one", "tiny")]
    pairs.append(_pair("same", "same"))  # equal lengths count on neither side
    out = length_split_accuracy(pairs, [1.0, 0.0, 2.0, 5.0], [0.0, 1.0, 1.0, 0.0])
    assert out["n_chosen_shorter"] == 1 and out["n_chosen_longer"] == 2
    assert out["accuracy_chosen_shorter"] == 1.0
    assert out["accuracy_chosen_longer"] == 0.5
    assert out["length_gap"] == pytest.approx(-0.5)


def _train_minilm_and_score(demo_config, demo_snapshot, tmp_path, *overrides: str, rows: int):
    """A few steps of the reward stage on MiniLM, then the saved model's scores on ``rows`` eval pairs."""
    from alignflow.data.snapshot import load_split
    from alignflow.models.reward_scorer import load_reward_scorer
    from alignflow.training.reward import run_reward

    common = ("reward.backbone=minilm", "reward.per_device_train_batch_size=4", "reward.max_length=48")
    common += (f"reward.eval_max_rows={rows}", "reward.stats_max_rows=8", "reward.save_steps=1000")
    result = run_reward(demo_config(*common, *overrides), demo_snapshot, tmp_path)
    scorer = load_reward_scorer(result.model_dir, normalize=False)
    pairs = load_split(demo_snapshot, "eval", kind="pair")[:rows]
    prompts = [p["prompt"] for p in pairs]
    chosen = torch.tensor(scorer.raw(prompts, [p["chosen"] for p in pairs]))
    rejected = torch.tensor(scorer.raw(prompts, [p["rejected"] for p in pairs]))
    return result, scorer, pairs, chosen, rejected


def test_mean_pooled_debiased_minilm_scores_at_inference_as_in_training(demo_config, demo_snapshot, tmp_path):
    """A saved model scored by the scorer (any consumer) reproduces the stage's own held-out metrics."""
    from safetensors.torch import load_file

    from alignflow.models.factory import minilm_path

    result, scorer, _, chosen, rejected = _train_minilm_and_score(
        demo_config,
        demo_snapshot,
        tmp_path,
        "reward.pooling=mean",
        "reward.length_debias=1.0",
        "reward.freeze_layers=2",
        "reward.max_steps=4",
        "reward.learning_rate=0.001",
        rows=24,
    )
    assert scorer.meta.pooling == "mean"
    m = result.metrics
    assert float((chosen > rejected).float().mean()) == pytest.approx(m["eval/accuracy"])
    assert float((chosen - rejected).mean()) == pytest.approx(m["eval/margin_mean"], abs=1e-5)
    assert "eval/length_gap" in m or min(m["eval/n_chosen_longer"], m["eval/n_chosen_shorter"]) == 0

    # the frozen embeddings and two lowest layers left training untouched; the top layer moved
    before = load_file(str(minilm_path() / "model.safetensors"))
    after = load_file(f"{result.model_dir}/model.safetensors")
    for key in ("embeddings.word_embeddings.weight", "encoder.layer.1.attention.self.query.weight"):
        assert torch.equal(after[f"bert.{key}"], before[key]), key
    top = "encoder.layer.5.attention.self.query.weight"
    assert not torch.equal(after[f"bert.{top}"], before[top])


def test_length_debias_needs_one_pairwise_objective():
    from pydantic import ValidationError

    from alignflow.training.reward_config import RewardConfig

    assert RewardConfig(length_debias=1.0).length_debias == 1.0
    for bad in ({"mode": "mixed"}, {"objectives": [{"name": "a"}, {"name": "b"}]}):
        with pytest.raises(ValidationError, match="length_debias"):
            RewardConfig(length_debias=1.0, **bad)


def test_answer_pooled_minilm_scores_at_inference_as_in_training(demo_config, demo_snapshot, tmp_path):
    """Pooling over the answer's tokens trains through TRL's trainer and scores the same way after."""
    from alignflow.rlhf.reward_model import RewardModel

    result, scorer, pairs, chosen, rejected = _train_minilm_and_score(
        demo_config, demo_snapshot, tmp_path, "reward.pooling=answer", "reward.max_steps=3", rows=16
    )
    assert scorer.meta.pooling == "answer"
    prompts = [p["prompt"] for p in pairs]
    assert float((chosen - rejected).mean()) == pytest.approx(result.metrics["eval/margin_mean"], abs=1e-5)
    # spec 002's module reads the same saved model the same way
    research = RewardModel.from_pretrained(result.model_dir)
    assert research.score(prompts, [p["chosen"] for p in pairs]) == pytest.approx(chosen.tolist(), abs=1e-4)


def test_heads_batches_carry_each_rows_answer_span():
    from alignflow.training.reward import heads_collator

    rating = {"input_ids": [1, 5, 6, 2], "chosen_ids": [], "rejected_ids": [], "targets": [0.5]}
    rating |= {"span": [1, 3], "chosen_span": [0, 0], "rejected_span": [0, 0]}
    pair = {"input_ids": [], "chosen_ids": [1, 7, 2], "rejected_ids": [1, 8, 9, 9, 2], "targets": [1.0]}
    pair |= {"span": [0, 0], "chosen_span": [1, 2], "rejected_span": [2, 4]}
    batch = heads_collator(pad_id=0)([pair, rating])
    # rows are rating, chosen, rejected; each mask is 1 on its own answer only
    assert batch["answer_mask"].tolist() == [[0, 1, 1, 0, 0], [0, 1, 0, 0, 0], [0, 0, 1, 1, 0]]
    without_spans = {k: v for k, v in rating.items() if "span" not in k}
    assert "answer_mask" not in heads_collator(pad_id=0)([without_spans])


def test_a_max_length_beyond_the_backbones_positions_is_refused_before_training(
    demo_config, demo_snapshot, tmp_path
):
    from alignflow.training.reward import run_reward

    config = demo_config("reward.backbone=minilm", "reward.max_length=1024")
    with pytest.raises(ValueError, match="reward.max_length 1024 exceeds the 512 positions"):
        run_reward(config, demo_snapshot, tmp_path)
    assert not (tmp_path / "model").exists()


def test_disjoint_data_trains_the_reward_model_on_its_half_only(demo_config, demo_snapshot, tmp_path):
    from alignflow.data.halves import prompt_half
    from alignflow.data.pairing import load_pairs
    from alignflow.training.reward import run_reward

    quick = ("reward.max_steps=2", "reward.per_device_train_batch_size=4", "reward.save_steps=1000")
    quick += ("reward.eval_max_rows=8", "reward.stats_max_rows=8")
    config = demo_config(*quick, "policy.reward_data=disjoint")
    result = run_reward(config, demo_snapshot, tmp_path)
    every = load_pairs(demo_snapshot, "train")
    expected = [p for p in every if prompt_half(p["prompt"]) == 0]
    assert result.metrics["train/pairs_used"] == len(expected) < len(every)


@pytest.mark.parametrize("fastest", [torch.bfloat16, torch.float32])
def test_minilm_multiplies_in_bf16_only_where_fastest_resolves_to_bf16(
    fastest, monkeypatch, demo_config, demo_snapshot, tmp_path
):
    """A backbone of its own keeps fp32 weights; its products run under bf16 autocast where the
    run's ``model.dtype: fastest`` picks bf16 on this CPU. The answer pooling calls the encoder
    past the forward accelerate wraps, so the flag alone would change nothing."""
    from safetensors.torch import load_file

    import alignflow.training.reward as reward

    monkeypatch.setattr("alignflow.models.factory.fastest_cpu_dtype", lambda: fastest)
    seen: list[torch.dtype | None] = []
    plain = reward.reward_logits

    def recording(*args, **kwargs):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)
        return plain(*args, **kwargs)

    monkeypatch.setattr(reward, "reward_logits", recording)
    result, *_ = _train_minilm_and_score(
        demo_config,
        demo_snapshot,
        tmp_path,
        "model.dtype=fastest",
        "reward.pooling=answer",
        "reward.max_steps=2",
        rows=8,
    )
    assert seen, "the stage never scored a batch through reward_logits"
    assert set(seen) == ({torch.bfloat16} if fastest == torch.bfloat16 else {None})
    weights = load_file(f"{result.model_dir}/model.safetensors")
    assert {w.dtype for w in weights.values() if w.is_floating_point()} == {torch.float32}
