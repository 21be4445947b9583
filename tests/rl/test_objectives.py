"""compute_rl_loss against explicit loop computations with torch.distributions."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from alignflow.rl.objectives import compute_rl_loss, sequence_response_logprob

PROMPT_LEN = 3


def _model(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=23,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    return LlamaForCausalLM(config).eval()


def _batch():
    torch.manual_seed(1)
    return torch.randint(0, 23, (3, 7))


def _response_logprobs(model, ids, prompt_len=PROMPT_LEN):
    """List (per row) of the response tokens' log-probs, one token at a time."""
    logits = model(input_ids=ids).logits
    rows = []
    for b in range(ids.size(0)):
        dist = torch.distributions.Categorical(logits=logits[b])
        row = [dist.log_prob(ids[b].roll(-1))[t] for t in range(prompt_len - 1, ids.size(1) - 1)]
        rows.append(torch.stack(row))
    return rows, logits


def _whiten(x):
    return (x - x.mean()) / torch.sqrt(x.var(unbiased=True) + 1e-8)


def test_reinforce_equals_reward_weighted_mean_logprob():
    model, ids = _model(), _batch()
    rewards = [1.0, 0.0, 2.0]
    loss, stats = compute_rl_loss(model, ids, PROMPT_LEN, rewards, mode="reinforce")
    rows, _ = _response_logprobs(model, ids)
    seq = torch.stack([r.mean() for r in rows])
    expected = -(_whiten(torch.tensor(rewards)) * seq).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert stats["mean_reward"] == pytest.approx(1.0)
    assert stats["mean_seq_logprob"] == pytest.approx(seq.mean().item(), rel=1e-5)
    raw, _ = compute_rl_loss(model, ids, PROMPT_LEN, rewards, mode="reinforce", normalize_adv=False)
    torch.testing.assert_close(raw, -(torch.tensor(rewards) * seq).mean(), rtol=1e-5, atol=1e-6)


def test_kl_mode_adds_the_mean_token_log_ratio_to_the_reference():
    model, ref, ids = _model(0), _model(7), _batch()
    rewards = [1.0, 0.0, 2.0]
    loss, stats = compute_rl_loss(model, ids, PROMPT_LEN, rewards, mode="kl", ref_model=ref, kl_coef=0.3)
    rows, _ = _response_logprobs(model, ids)
    ref_rows, _ = _response_logprobs(ref, ids)
    kl = torch.cat([r - q for r, q in zip(rows, ref_rows, strict=True)]).mean()
    seq = torch.stack([r.mean() for r in rows])
    expected = -(_whiten(torch.tensor(rewards)) * seq).mean() + 0.3 * kl
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert stats["kl_mean"] == pytest.approx(kl.item(), rel=1e-4)
    _, same = compute_rl_loss(model, ids, PROMPT_LEN, rewards, mode="kl", ref_model=copy.deepcopy(model))
    assert same["kl_mean"] == pytest.approx(0.0, abs=1e-6)


def test_ppo_mode_clips_the_sequence_ratio():
    model, ids = _model(), _batch()
    rewards = [1.0, -1.0, 0.5]
    current = sequence_response_logprob(model, ids, PROMPT_LEN)
    # old log-probs chosen so the ratios are 1.5, 0.5 and 1.1
    old = current - torch.log(torch.tensor([1.5, 0.5, 1.1]))
    loss, stats = compute_rl_loss(
        model, ids, PROMPT_LEN, rewards, mode="ppo", old_logprobs=old, cliprange=0.2, normalize_adv=False
    )
    # A=+1, r=1.5 -> -1.2 ; A=-1, r=0.5 -> +0.8 ; A=0.5, r=1.1 -> -0.55
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 0.55) / 3, rel=1e-4)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1) / 3, rel=1e-4)
    assert stats["clip_fraction"] == pytest.approx(2 / 3)


def test_token_mode_weights_each_response_token_by_its_reward():
    model, ids = _model(), _batch()
    response_len = ids.size(1) - PROMPT_LEN
    token_rewards = torch.arange(3 * response_len, dtype=torch.float32).reshape(3, response_len) / 10
    loss, stats = compute_rl_loss(model, ids, PROMPT_LEN, token_rewards, mode="token")
    rows, _ = _response_logprobs(model, ids)
    expected = -sum((r * w).sum() for r, w in zip(rows, token_rewards, strict=True)) / (3 * response_len)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert "mean_resp_logprob" in stats


def test_entropy_regularisation_subtracts_response_entropy():
    model, ids = _model(), _batch()
    base, _ = compute_rl_loss(model, ids, PROMPT_LEN, [1.0, 0.0, 2.0])
    reg, stats = compute_rl_loss(model, ids, PROMPT_LEN, [1.0, 0.0, 2.0], ent_coef=0.05)
    logits = model(input_ids=ids).logits[:, PROMPT_LEN - 1 : -1]
    entropy = torch.distributions.Categorical(logits=logits).entropy().mean()
    torch.testing.assert_close(reg, base - 0.05 * entropy, rtol=1e-5, atol=1e-6)
    assert stats["entropy"] == pytest.approx(entropy.item(), rel=1e-5)


def test_padding_is_excluded_through_the_attention_mask():
    model, ids = _model(), _batch()
    attention = torch.ones_like(ids)
    attention[0, -2:] = 0  # row 0 ends two tokens early (right padding)
    loss, _ = compute_rl_loss(
        model, ids, PROMPT_LEN, [1.0, 0.0, 2.0], attention_mask=attention, normalize_adv=False
    )
    logits = model(input_ids=ids, attention_mask=attention).logits
    seq = []
    for b, end in zip(range(3), [ids.size(1) - 2, ids.size(1), ids.size(1)], strict=True):
        dist = torch.distributions.Categorical(logits=logits[b, PROMPT_LEN - 1 : end - 1])
        seq.append(dist.log_prob(ids[b, PROMPT_LEN:end]).mean())
    expected = -(torch.tensor([1.0, 0.0, 2.0]) * torch.stack(seq)).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)


def test_single_sequence_uses_the_raw_reward_and_gradients_flow():
    model, ids = _model(), _batch()[:1]
    loss, _ = compute_rl_loss(model, ids, PROMPT_LEN, [2.0], mode="reinforce")
    seq = sequence_response_logprob(model, ids, PROMPT_LEN)
    assert loss.item() == pytest.approx(-(2.0 * seq).item(), rel=1e-5)
    loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_bad_calls_raise_clear_errors():
    model, ids = _model(), _batch()
    with pytest.raises(ValueError, match="Unknown mode"):
        compute_rl_loss(model, ids, PROMPT_LEN, [1.0, 0.0, 2.0], mode="a2c")
    with pytest.raises(ValueError, match="ref_model required"):
        compute_rl_loss(model, ids, PROMPT_LEN, [1.0, 0.0, 2.0], mode="kl")
    with pytest.raises(ValueError, match="old_logprobs required"):
        compute_rl_loss(model, ids, PROMPT_LEN, [1.0, 0.0, 2.0], mode="ppo")
    with pytest.raises(ValueError, match="token rewards have shape"):
        compute_rl_loss(model, ids, PROMPT_LEN, torch.ones(3, 2), mode="token")
    with pytest.raises(ValueError, match="prompt_len"):
        compute_rl_loss(model, ids, ids.size(1), [1.0, 0.0, 2.0])
    with pytest.raises(ValueError, match="one reward per sequence"):
        compute_rl_loss(model, ids, PROMPT_LEN, [1.0, 0.0])


def test_reinforce_steps_raise_the_likelihood_of_rewarded_responses():
    model, ids = _model(), _batch()
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    rewards = [1.0, -1.0, 0.0]
    before = sequence_response_logprob(model, ids, PROMPT_LEN)
    for _ in range(20):
        loss, _ = compute_rl_loss(model, ids, PROMPT_LEN, rewards, mode="reinforce", normalize_adv=False)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = sequence_response_logprob(model, ids, PROMPT_LEN)
    assert after[0] > before[0] + 0.5
    assert after[1] < before[1] - 0.5
