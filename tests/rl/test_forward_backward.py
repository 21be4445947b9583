"""ForwardBackwardPipeline / AsyncTrainingClient: accumulation, ordering, real overlap, losses, state."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from alignflow.models import load_causal_lm
from alignflow.rl.forward_backward import AsyncTrainingClient, ForwardBackwardPipeline


@pytest.fixture()
def lm(tiny_model_dir):
    torch.manual_seed(0)
    return load_causal_lm(tiny_model_dir)


def batch_of(tokenizer, texts):
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    n = min(len(i) for i in ids)
    return torch.tensor([i[:n] for i in ids])


TEXTS = [f"What is {a} plus {b}? The answer is {a + b}." for a, b in [(1, 2), (3, 4), (5, 1), (2, 2)]]


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def test_accumulated_micro_batches_equal_one_big_batch(tiny_model_dir):
    big_model, tok = load_causal_lm(tiny_model_dir)
    micro_model, _ = load_causal_lm(tiny_model_dir)
    batch = batch_of(tok, TEXTS)

    big = ForwardBackwardPipeline(big_model)
    opt_big = torch.optim.SGD(big_model.parameters(), lr=0.5)
    big.forward_backward(batch).result()
    assert big.optim_step(opt_big).result().metrics["applied"] == 1.0

    micro = ForwardBackwardPipeline(micro_model, gradient_accumulation_steps=4)
    opt_micro = torch.optim.SGD(micro_model.parameters(), lr=0.5)
    for i in range(3):
        micro.forward_backward(batch[i : i + 1])
    early = micro.optim_step(opt_micro).result()
    assert early.metrics == {"applied": 0.0, "accumulated": 3.0} and early.step == 0
    micro.forward_backward(batch[3:4])
    out = micro.optim_step(opt_micro).result()
    assert out.step == 1 and out.metrics["applied"] == 1.0 and out.grad_norm > 0
    for a, b in zip(params_of(big_model), params_of(micro_model), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    big.shutdown()
    micro.shutdown()


def test_forced_early_step_uses_the_mean_of_what_was_accumulated(tiny_model_dir):
    a_model, tok = load_causal_lm(tiny_model_dir)
    b_model, _ = load_causal_lm(tiny_model_dir)
    batch = batch_of(tok, TEXTS)
    plain = ForwardBackwardPipeline(a_model)
    plain.forward_backward(batch[:2])
    plain.optim_step(torch.optim.SGD(a_model.parameters(), lr=0.5)).result()
    acc = ForwardBackwardPipeline(b_model, gradient_accumulation_steps=4)
    acc.forward_backward(batch[:1])
    acc.forward_backward(batch[1:2])
    acc.optim_step(torch.optim.SGD(b_model.parameters(), lr=0.5), force=True).result()
    for a, b in zip(params_of(a_model), params_of(b_model), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_passes_overlap_but_steps_are_barriers(lm):
    model, tok = lm
    batch = batch_of(tok, TEXTS)
    events: dict[str, tuple[float, float]] = {}

    def timed(name):
        def loss_fn(model, inputs, outputs, **kwargs):
            start = time.perf_counter()
            time.sleep(0.3)
            events[name] = (start, time.perf_counter())
            return outputs.logits.float().mean()

        return loss_fn

    pipe = ForwardBackwardPipeline(model, max_workers=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    f1 = pipe.forward_backward_custom(batch, timed("fb1"))
    f2 = pipe.forward_backward_custom(batch, timed("fb2"))
    step = pipe.optim_step(opt)
    f3 = pipe.forward_backward_custom(batch, timed("fb3"))
    assert not step.done()  # returned at once, work still queued
    f3.result()
    assert f1.done() and f2.done() and step.done()
    (s1, e1), (s2, e2), (s3, _) = events["fb1"], events["fb2"], events["fb3"]
    assert s2 < e1 and s1 < e2, "passes between two steps should run at the same time"
    assert s3 >= max(e1, e2), "a pass queued after a step must wait for it"
    assert step.result().step == 1
    pipe.shutdown()


def test_pass_after_step_sees_updated_weights(lm):
    model, tok = lm
    batch = batch_of(tok, TEXTS)
    pipe = ForwardBackwardPipeline(model, max_workers=2)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = pipe.forward_backward(batch)
    pipe.optim_step(opt)
    after = pipe.forward(batch)
    assert after.result().loss < before.result().loss
    pipe.shutdown()


def test_cancel_withdraws_queued_work_and_the_next_step_still_runs(lm):
    model, tok = lm
    batch = batch_of(tok, TEXTS)
    gate = threading.Event()

    def blocked(model, inputs, outputs, **kwargs):
        gate.wait(10)
        return outputs.logits.float().mean()

    pipe = ForwardBackwardPipeline(model, max_workers=1)
    first = pipe.forward_backward_custom(batch, blocked)
    second = pipe.forward_backward(batch)
    assert second.cancel() and second.done()
    gate.set()
    out = pipe.optim_step(torch.optim.SGD(model.parameters(), lr=0.1)).result()
    assert first.result().loss is not None and out.metrics["accumulated"] == 1.0
    assert not first.cancel()
    pipe.shutdown()


def test_custom_loss_receives_its_kwargs_and_errors_surface_in_the_future(lm):
    model, tok = lm
    batch = batch_of(tok, TEXTS)
    seen = {}

    def loss_fn(model, inputs, outputs, my_param):
        seen["my_param"] = my_param
        seen["keys"] = sorted(inputs)
        return outputs.logits.float().pow(2).mean()

    pipe = ForwardBackwardPipeline(model)
    pipe.forward_backward_custom(batch, loss_fn, my_param=42).result()
    assert seen == {"my_param": 42, "keys": ["attention_mask", "input_ids"]}
    with pytest.raises(ValueError, match="old_logprobs and advantages"):
        pipe.forward_backward(batch, loss_fn="ppo").result()
    with pytest.raises(ValueError, match="unknown loss_fn"):
        pipe.forward_backward(batch, loss_fn="hinge")
    pipe.shutdown()


@pytest.mark.parametrize("loss_name", ["ppo", "importance_sampling"])
def test_policy_losses_raise_logprob_of_positive_advantage_sequences(lm, loss_name):
    model, tok = lm
    batch = batch_of(tok, ["The answer is 7.", "I think 12 maybe"])
    pipe = ForwardBackwardPipeline(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    old = pipe.forward(batch).result().logprobs
    advantages = torch.tensor([1.0, -1.0])
    for _ in range(2):
        pipe.forward_backward(batch, loss_fn=loss_name, old_logprobs=old, advantages=advantages)
        pipe.optim_step(opt)
    new = pipe.forward(batch).result().logprobs
    delta = (new - old).sum(-1)
    assert delta[0] > 0 > delta[1]
    pipe.shutdown()


def test_sample_logprobs_match_a_forward_pass_and_stop_at_stop_tokens(lm):
    model, tok = lm
    pipe = ForwardBackwardPipeline(model)
    prompt = tok("What is 2 plus 3?", add_special_tokens=False)["input_ids"]
    out = pipe.sample(prompt, max_tokens=12, temperature=0.7, top_k=50, top_p=0.9, seed=1)
    assert out["prompt"] == prompt and 1 <= len(out["tokens"]) <= 12
    full = torch.tensor([prompt + out["tokens"]])
    forward = pipe.forward(full).result().logprobs[0, len(prompt) - 1 :]
    torch.testing.assert_close(torch.tensor(out["logprobs"]), forward, atol=1e-4, rtol=1e-4)
    assert pipe.sample(prompt, max_tokens=12, temperature=0.7, seed=1) == pipe.sample(
        prompt, max_tokens=12, temperature=0.7, seed=1
    )
    stop = out["tokens"][2]
    cut = pipe.sample(prompt, max_tokens=12, temperature=0.7, top_k=50, top_p=0.9, seed=1, stop=[stop])
    assert cut["tokens"] == out["tokens"][: out["tokens"].index(stop) + 1]
    pipe.shutdown()


def test_reference_forward_is_frozen_while_the_policy_trains(tiny_model_dir):
    model, tok = load_causal_lm(tiny_model_dir)
    ref, _ = load_causal_lm(tiny_model_dir)
    batch = batch_of(tok, TEXTS)
    client = AsyncTrainingClient(model, reference_model=ref)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    ref_before = client.forward({"input_ids": batch}, use_reference=True).result().logprobs
    client.forward_backward({"input_ids": batch}, loss_fn="cross_entropy")
    client.optim_step(opt, max_grad_norm=1.0).result()
    ref_after = client.forward({"input_ids": batch}, use_reference=True).result().logprobs
    policy = client.forward({"input_ids": batch}).result().logprobs
    torch.testing.assert_close(ref_before, ref_after)
    assert not torch.allclose(policy, ref_after)
    assert not any(p.requires_grad for p in ref.parameters())
    client.shutdown()


def _run_steps(pipe, opt, sched, batch, n):
    losses = []
    for _ in range(n):
        fut = pipe.forward_backward(batch)
        pipe.optim_step(opt, sched, max_grad_norm=1.0)
        losses.append(fut.result().loss)
    return losses


def test_save_and_load_state_resume_exactly(tmp_path, tiny_model_dir):
    model, tok = load_causal_lm(tiny_model_dir)
    batch = batch_of(tok, TEXTS)

    def make(m):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        return opt, torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.1, total_iters=10)

    pipe = ForwardBackwardPipeline(model, checkpoint_dir=tmp_path)
    opt, sched = make(model)
    _run_steps(pipe, opt, sched, batch, 3)
    info = pipe.save_state("checkpoint_3")
    assert {"path", "model_path", "optimizer_path", "state_path"} <= set(info)
    assert not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.bin"))
    torch.manual_seed(123)
    expected_rand = torch.rand(3)
    continued = _run_steps(pipe, opt, sched, batch, 3)

    fresh, _ = load_causal_lm(tiny_model_dir)
    pipe2 = ForwardBackwardPipeline(fresh, checkpoint_dir=tmp_path)
    opt2, sched2 = make(fresh)
    state = pipe2.load_state(tmp_path / "checkpoint_3", opt2, sched2)
    assert state["step"] == 3 and pipe2.step_count == 3
    assert sched2.last_epoch == 3 and opt2.state_dict()["state"]  # Adam moments came back
    torch.manual_seed(123)
    torch.testing.assert_close(torch.rand(3), expected_rand)
    resumed = _run_steps(pipe2, opt2, sched2, batch, 3)
    assert resumed == pytest.approx(continued, rel=1e-5)
    pipe.shutdown()
    pipe2.shutdown()


def test_load_state_without_optimizer_applies_it_at_the_next_step(tmp_path, tiny_model_dir):
    model, tok = load_causal_lm(tiny_model_dir)
    batch = batch_of(tok, TEXTS)
    pipe = ForwardBackwardPipeline(model, checkpoint_dir=tmp_path)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _run_steps(pipe, opt, None, batch, 2)
    pipe.save_state("ck")
    fresh, _ = load_causal_lm(tiny_model_dir)
    pipe2 = ForwardBackwardPipeline(fresh)
    pipe2.load_state(tmp_path / "ck")
    opt2 = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    assert not opt2.state_dict()["state"]
    pipe2.forward_backward(batch)
    pipe2.optim_step(opt2).result()
    assert int(opt2.state_dict()["state"][0]["step"]) == 3


def test_a_prompt_past_the_position_table_is_a_clear_error(gpt2_policy_dir):
    """A GPT-2-style model has 48 positions here: the caller's ids are never silently cut."""
    from alignflow.errors import InputError

    model, tok = load_causal_lm(gpt2_policy_dir)
    pipe = ForwardBackwardPipeline(model)
    prompt = list(range(5, 50))  # 45 tokens
    with pytest.raises(InputError, match="a prompt of 45 tokens plus max_tokens 8 exceeds the 48 positions"):
        pipe.sample(prompt, max_tokens=8)
    assert len(pipe.sample(prompt[-40:], max_tokens=8, temperature=0)["tokens"]) <= 8
    pipe.shutdown()
