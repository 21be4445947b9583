"""PPO: GAE and the adaptive KL rule against references, the learning signal, exact resume."""

from __future__ import annotations

import random

import pytest
import torch

from alignflow.data.answers import format_answer
from alignflow.data.demo import make_prompt
from alignflow.models import load_causal_lm
from alignflow.rl.environments import create_math_problem_env
from alignflow.rl.ppo import AdaptiveKLController, PPOConfig, PPOModel, PPOTrainer, compute_gae


def gae_plain_loop(rewards, values, lengths, gamma, lam):
    """Textbook GAE, one sequence and one step at a time."""
    advantages = torch.zeros_like(rewards)
    for i, n in enumerate(lengths):
        last = 0.0
        for t in reversed(range(n)):
            next_value = values[i, t + 1].item() if t + 1 < n else 0.0
            delta = rewards[i, t].item() + gamma * next_value - values[i, t].item()
            last = delta + gamma * lam * last
            advantages[i, t] = last
    returns = (advantages + values) * (torch.arange(rewards.size(1))[None] < torch.tensor(lengths)[:, None])
    return advantages, returns


@pytest.mark.parametrize(("gamma", "lam"), [(0.99, 0.95), (1.0, 1.0), (0.9, 0.0)])
def test_gae_equals_a_plain_loop(gamma, lam):
    torch.manual_seed(0)
    lengths = [7, 3, 1, 5]
    rewards, values = torch.randn(4, 7), torch.randn(4, 7)
    mask = (torch.arange(7)[None] < torch.tensor(lengths)[:, None]).float()
    adv, ret = compute_gae(rewards * mask, values, mask, gamma, lam)
    ref_adv, ref_ret = gae_plain_loop(rewards, values, lengths, gamma, lam)
    torch.testing.assert_close(adv, ref_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret, ref_ret, atol=1e-5, rtol=1e-5)


def test_adaptive_kl_update_equals_hand_computed_values():
    ctl = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000)
    # KL 9 is 50% over target: error clipped to +0.2; factor 1 + 0.2 * 256 / 10000 = 1.00512
    assert ctl.update(9.0, 256) == pytest.approx(0.201024, rel=1e-12)
    # KL 5.4: error -0.1; factor 1 - 0.1 * 0.0256 = 0.99744
    assert ctl.update(5.4, 256) == pytest.approx(0.20050937856, rel=1e-12)
    # KL 0: error clipped to -0.2; factor 1 - 0.2 * 1000 / 10000 = 0.98
    assert ctl.update(0.0, 1000) == pytest.approx(0.1964991909888, rel=1e-12)
    restored = AdaptiveKLController(1.0, 1.0, 1)
    restored.load_state_dict(ctl.state_dict())
    assert restored.update(6.0, 10) == ctl.value  # on target: unchanged


def test_config_accepts_both_spec_spellings_and_rejects_typos():
    cfg = PPOConfig(
        ppo_epochs=2, lam=0.9, clip_ratio=0.1, kl_penalty_coef=0.01, kl_target=0.02, value_coef=0.3
    )
    assert (cfg.num_epochs, cfg.gae_lambda, cfg.clip_param) == (2, 0.9, 0.1)
    assert (cfg.kl_coef, cfg.target_kl, cfg.value_loss_coef) == (0.01, 0.02, 0.3)
    with pytest.raises(ValueError, match="clip_prm"):
        PPOConfig(clip_prm=0.1)
    with pytest.raises(ValueError, match="batch_size"):
        PPOConfig(batch_size=0)


def test_ppo_model_value_head_round_trips_through_safetensors(tmp_path, tiny_model_dir):
    base, tok = load_causal_lm(tiny_model_dir)
    model = PPOModel(base)
    torch.nn.init.normal_(model.value_head.net[2].weight)
    ids = torch.tensor([tok("What is 1 plus 2?")["input_ids"]])
    out = model(ids)
    assert out.value.shape == ids.shape and out.logits.shape[:2] == ids.shape
    model.save_pretrained(tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").glob("*.safetensors")) == [
        "model.safetensors",
        "value_head.safetensors",
    ]
    again = PPOModel.from_pretrained(tmp_path / "m")
    torch.testing.assert_close(again(ids).value, out.value)


def sft(model, tokenizer, steps=200, seed=0):
    """Brief supervised warm-up: mostly sloppy answers, some formatted, so PPO has room to improve."""
    rng = random.Random(seed)
    texts = []
    for _ in range(2000):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        response = format_answer(a + b) if rng.random() < 0.3 else f"I think {a + b}"
        texts.append(f"{make_prompt(a, b)} {response}{tokenizer.eos_token}")
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokenizer.padding_side = "right"
    for step in range(steps):
        chunk = texts[(step * 32) % len(texts) :][:32]
        enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        model(**enc, labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    return model


@pytest.fixture(scope="module")
def sft_model(tiny_model_dir):
    model, tok = load_causal_lm(tiny_model_dir)
    return sft(model, tok), tok


def math_config(**overrides):
    base = dict(
        learning_rate=5e-4,
        batch_size=32,
        mini_batch_size=16,
        num_epochs=2,
        max_new_tokens=8,
        kl_coef=0.2,
        target_kl=1.5,
        kl_horizon=200,
        entropy_coef=0.0,
        seed=0,
    )
    return PPOConfig(**{**base, **overrides})


@pytest.mark.slow
def test_ppo_on_the_math_env_raises_reward_while_kl_tracks_its_target(sft_model):
    model, tok = sft_model
    import copy

    trainer = PPOTrainer(math_config(), copy.deepcopy(model), tok)
    env = create_math_problem_env(tok, num_problems=100)
    trained = trainer.train(env, num_iterations=40)
    assert isinstance(trained, PPOModel)
    history = trainer.history
    assert len(history) == 40
    rewards = [h["reward/mean"] for h in history]
    kls = [h["objective/kl"] for h in history]
    # a batch mean of 32 rewards in {0, .5, 1, 1.5} varies by ~0.09, so a mean over 10
    # iterations by ~0.03: a rise of 0.1 between the first and last ten is learning, not noise
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.1, f"mean reward did not rise: {first:.3f} -> {last:.3f}"
    late_kl = sum(kls[-15:]) / 15
    assert 0.5 * 1.5 < late_kl < 2 * 1.5, f"KL {late_kl:.3f} strayed from its target 1.5"
    # the controller moved the coefficient in the direction the KL error asked for
    for before, after in zip(history, history[1:], strict=False):
        if before["objective/kl"] > 1.5 * 1.2:
            assert after["objective/kl_coef"] > before["objective/kl_coef"]
        elif before["objective/kl"] < 1.5 * 0.8:
            assert after["objective/kl_coef"] < before["objective/kl_coef"]
    # every component of the multi-objective reward was reported
    assert {"env/reward_correctness", "env/reward_formatting"} <= set(history[-1])


def test_train_on_prompts_passes_metadata_and_checks_the_reward_fn(tiny_model_dir):
    model, tok = load_causal_lm(tiny_model_dir)
    prompts = [make_prompt(a, 1) for a in range(6)]
    metadata = [{"answer": a + 1} for a in range(6)]
    calls = []

    def reward_fn(batch_prompts, responses, meta):
        calls.append((list(batch_prompts), list(responses), list(meta)))
        return [float(len(r)) for r in responses]

    cfg = PPOConfig(batch_size=4, mini_batch_size=2, num_epochs=1, max_new_tokens=4, learning_rate=1e-4)
    reported = []
    trainer = PPOTrainer(cfg, model, tok, on_iteration=reported.append)
    history = trainer.train(prompts, reward_fn, num_iterations=2, prompt_metadata=metadata)
    assert [h["iteration"] for h in history] == [1, 2]
    assert reported == history, "the caller's hook sees each iteration's metrics as recorded"
    for batch_prompts, responses, meta in calls:
        assert len(batch_prompts) == len(responses) == 4
        assert all(m["answer"] == int(p.split()[2]) + 1 for p, m in zip(batch_prompts, meta, strict=True))
    assert history[0]["reward/mean"] == pytest.approx(sum(len(r) for r in calls[0][1]) / 4)
    with pytest.raises(ValueError, match="returned 1 rewards for 4 responses"):
        trainer.train(prompts, lambda p, r, m: [0.0], num_iterations=3)


@pytest.mark.slow
def test_checkpoint_resume_restores_optimizer_rng_and_kl_state(tmp_path, tiny_model_dir):
    prompts = [make_prompt(a, b) for a in range(3) for b in range(3)]

    def reward_fn(batch_prompts, responses, meta):
        return [1.0 if "answer" in r else -0.1 * len(r) for r in responses]

    def trainer(out):
        model, tok = load_causal_lm(tiny_model_dir)
        cfg = PPOConfig(
            batch_size=4,
            mini_batch_size=2,
            num_epochs=2,
            max_new_tokens=5,
            learning_rate=1e-3,
            kl_coef=0.3,
            target_kl=0.01,
            kl_horizon=20,
            save_every=2,
            output_dir=str(out),
            seed=3,
        )
        return PPOTrainer(cfg, model, tok)

    full = trainer(tmp_path / "full")
    full.train(prompts, reward_fn, num_iterations=4)
    ckpt = tmp_path / "full" / "checkpoint-2"
    assert not list(ckpt.rglob("*.pt")) and not list(ckpt.rglob("*.bin")) and not list(ckpt.rglob("*.pkl"))

    resumed = trainer(tmp_path / "resumed")
    state = resumed.load_checkpoint(ckpt)
    assert resumed.iteration == 2 and state["kl_controller"]["value"] != 0.3
    assert resumed.kl_ctl.value == pytest.approx(full.history[2]["objective/kl_coef"])
    resumed.train(prompts, reward_fn, num_iterations=4)
    for a, b in zip(full.history, resumed.history, strict=True):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6)
    assert resumed.kl_ctl.value == pytest.approx(full.kl_ctl.value)
    for p, q in zip(full.model.parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)
    opt_a, opt_b = full.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    torch.testing.assert_close(opt_a[0]["exp_avg_sq"], opt_b[0]["exp_avg_sq"], atol=1e-9, rtol=1e-5)

    latest = trainer(tmp_path / "full")
    latest.train(prompts, reward_fn, num_iterations=4, resume_from="latest")
    assert latest.iteration == 4 and len(latest.history) == 4  # nothing left to do after checkpoint-4


def test_checkpoints_land_whole_every_save_every_and_after_the_last_iteration(tmp_path, tiny_model_dir):
    prompts = [make_prompt(a, b) for a in range(3) for b in range(3)]
    model, tok = load_causal_lm(tiny_model_dir)
    cfg = PPOConfig(
        batch_size=2, mini_batch_size=2, num_epochs=1, max_new_tokens=3, save_every=2,
        save_total_limit=2, output_dir=str(tmp_path), lr_scheduler_type="linear", seed=0,
    )  # fmt: skip
    trainer = PPOTrainer(cfg, model, tok)
    assert trainer.scheduler is not None and trainer.scheduler.get_last_lr()[0] == pytest.approx(
        cfg.learning_rate
    )
    trainer.train(prompts, lambda p, r, m: [0.0] * len(r), num_iterations=5)
    # 2 and 4 by save_every, 5 as the last; the oldest beyond the limit removed; no staging left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4", "checkpoint-5"]
    assert trainer.scheduler.get_last_lr()[0] < cfg.learning_rate  # the linear schedule ran down


def test_an_evaluate_hook_replaces_the_held_out_measure_and_holds_no_prompt_out(tiny_model_dir):
    prompts = [make_prompt(a, b) for a in range(3) for b in range(3)]
    model, tok = load_causal_lm(tiny_model_dir)
    trainer = PPOTrainer(
        PPOConfig(batch_size=9, mini_batch_size=9, num_epochs=1, max_new_tokens=3, eval_every=2), model, tok
    )
    seen: list[str] = []
    history = trainer.train(
        prompts,
        lambda p, r, m: seen.extend(p) or [0.0] * len(r),
        num_iterations=2,
        evaluate=lambda: {"accuracy": 0.25, "eval/n": 3.0},
    )
    assert history[1]["eval/accuracy"] == 0.25 and history[1]["eval/n"] == 3.0
    assert "eval/accuracy" not in history[0] and "eval/reward_mean" not in history[1]
    assert set(seen) == set(prompts)  # every prompt trained: none held out for the measure


def test_prompts_longer_than_a_gpt2_policy_reads_are_cut_from_the_left(gpt2_policy_dir):
    """48 positions: 60-token prompts plus 4 new tokens crashed generation with IndexError."""
    model, tok = load_causal_lm(gpt2_policy_dir)
    prompts = ["Some background that runs on and on. " * 8 + make_prompt(a, 1) for a in range(4)]
    assert min(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts) > 48
    cfg = PPOConfig(batch_size=4, mini_batch_size=2, num_epochs=1, max_new_tokens=4, learning_rate=1e-4)
    trainer = PPOTrainer(cfg, model, tok)
    seen = []

    def reward_fn(batch_prompts, responses, meta):
        seen.extend(batch_prompts)
        return [0.0] * len(responses)

    history = trainer.train(prompts, reward_fn, num_iterations=1)
    assert [h["iteration"] for h in history] == [1]
    assert sorted(seen) == sorted(prompts), "the reward function still reads the whole prompts"
    assert tok.truncation_side == "right"
