"""CPU decoding: one query token attends over the key/value heads as stored, giving what
eager and SDPA attention give; tokens are drawn from the same distribution as by
``torch.multinomial``; the context changes the model and torch only while open, only on a CPU."""

from __future__ import annotations

import pytest
import torch

from alignflow.models.cpu_attention import CPU_ATTENTION
from alignflow.models.decoding import categorical_draw, categorical_draws, cpu_decoding
from tests.models.tiny_llama import greedy_with_logits, left_padded, tiny_lm


def test_the_context_switches_attention_on_a_cpu_and_restores_it():
    model = tiny_lm("sdpa")
    with cpu_decoding(model):
        assert model.config._attn_implementation == CPU_ATTENTION
        ids = model.generate(torch.tensor([[1, 2, 3]]), do_sample=True, max_new_tokens=4, pad_token_id=0)
    assert ids.shape == (1, 7)
    assert model.config._attn_implementation == "sdpa"

    with pytest.raises(RuntimeError), cpu_decoding(model):
        raise RuntimeError("a failed generate")
    assert model.config._attn_implementation == "sdpa"


def test_a_model_off_the_cpu_is_left_alone():
    with torch.device("meta"):
        model = tiny_lm("sdpa")
    with cpu_decoding(model):
        assert model.config._attn_implementation == "sdpa"


def test_draws_follow_each_rows_probabilities_and_never_a_zero_entry():
    probs = torch.tensor(
        [[0.1, 0.0, 0.6, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0], [0.25, 0.25, 0.25, 0.25, 0.0]]
    )
    torch.manual_seed(0)
    draws = torch.cat([categorical_draw(probs, 1) for _ in range(20_000)], dim=1)
    assert draws.shape == (3, 20_000)
    for row, expected in zip(draws, probs, strict=True):
        frequencies = torch.bincount(row, minlength=5).float() / len(row)
        assert frequencies[expected == 0].sum() == 0
        assert frequencies == pytest.approx(expected, abs=0.015)


def test_unnormalised_weights_are_drawn_in_proportion():
    torch.manual_seed(1)
    draws = torch.cat([categorical_draw(torch.tensor([[2.0, 6.0]]), 1) for _ in range(10_000)], dim=1)
    assert (draws == 1).float().mean().item() == pytest.approx(0.75, abs=0.02)


def test_a_draw_rounded_up_to_the_total_takes_the_last_entry_that_can_be_drawn(monkeypatch):
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.ones(*shape))
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.2, 0.0, 0.8, 0.0]])
    assert categorical_draw(probs, 1).flatten().tolist() == [1, 2]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_probabilities_torch_refuses_are_refused(bad):
    with pytest.raises(RuntimeError, match="probability tensor"):
        categorical_draw(torch.tensor([[0.5, bad, 0.5]]), 1)


def test_calls_other_than_one_draw_per_row_go_to_torch():
    torch.manual_seed(2)
    two = categorical_draw(torch.tensor([[0.5, 0.5, 0.0]]), 2)
    assert sorted(two.flatten().tolist()) == [0, 1]  # without replacement: both entries
    assert categorical_draw(torch.tensor([0.0, 1.0]), 1).tolist() == [1]
    probs = torch.softmax(torch.arange(8.0).repeat(3, 1), -1)
    ours = categorical_draw(probs, 1, generator=torch.Generator().manual_seed(5))
    assert torch.equal(ours, torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(5)))


def test_the_draws_swap_torch_multinomial_only_while_any_user_is_inside():
    original = torch.multinomial
    with categorical_draws():
        with categorical_draws():
            assert torch.multinomial is categorical_draw
        assert torch.multinomial is categorical_draw  # the outer user is still inside
    assert torch.multinomial is original
    with pytest.raises(RuntimeError), categorical_draws():
        raise RuntimeError("a failed generate")
    assert torch.multinomial is original


def test_the_head_reads_a_contiguous_input_while_decoding_and_sampling_is_seeded():
    """The batched prefill slices its last position before the head: inside the context the head
    gets it contiguous, with the same logits; outside, the model is as it was."""
    model = tiny_lm("sdpa")
    batch = left_padded()
    seen: list[bool] = []
    model.lm_head.register_forward_hook(lambda module, args, out: seen.append(args[0].is_contiguous()))
    plain = greedy_with_logits(model, batch)
    assert not all(seen)  # the prefill's slice
    seen.clear()
    with cpu_decoding(model):
        ours = greedy_with_logits(model, batch)
        sampled = []
        for _ in range(2):
            torch.manual_seed(4)
            sampled.append(model.generate(**batch, do_sample=True, max_new_tokens=5, pad_token_id=0))
    assert all(seen)
    assert torch.equal(ours.sequences, plain.sequences)
    assert torch.stack(ours.logits) == pytest.approx(torch.stack(plain.logits), abs=1e-5)
    assert torch.equal(sampled[0], sampled[1])
    assert len(model.lm_head._forward_pre_hooks) == 0
