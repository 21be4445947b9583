"""Decoding with a fixed cache gives ``generate``'s tokens (greedy, through its logits
processors, with rows that end), and leaves to ``generate`` every call it cannot honour."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel, MistralConfig

from alignflow.models import decode_attention
from alignflow.models.decoding import cpu_decoding
from alignflow.models.fixed_cache_decoding import (
    attends_whole_context,
    fixed_cache_decoding,
    fixed_cache_plan,
)
from tests.models.tiny_llama import tiny_lm

NEW = 8


def _grouped_prompts() -> dict[str, torch.Tensor]:
    """Left-padded prompts of three lengths, each twice in a row (a GRPO group)."""
    prompts = torch.tensor([[0, 0, 0, 5, 6, 7], [8, 9, 10, 11, 12, 13], [0, 14, 15, 16, 17, 18]])
    ids = prompts.repeat_interleave(2, dim=0)
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def _settings(**changes) -> GenerationConfig:
    return GenerationConfig(**{"max_new_tokens": NEW, "pad_token_id": 0, "do_sample": False, **changes})


def _both(model, batch, config: GenerationConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(plain generate's output, the fixed cache's) for one call."""
    with torch.no_grad():
        plain = model.generate(**batch, generation_config=config)
        with fixed_cache_decoding(model):
            ours = model.generate(**batch, generation_config=config)
    return plain, ours


def _taken(model, batch, config: GenerationConfig) -> bool:
    return fixed_cache_plan(model, batch["input_ids"], {**batch, "generation_config": config}) is not None


@pytest.mark.parametrize("matmuls", [True, False], ids=["matmuls", "sdpa"])
@pytest.mark.parametrize("kv_heads", [2, 6])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_greedy_decodes_the_tokens_of_generate(kv_heads, attention, matmuls, monkeypatch):
    """Every row, padded or not, grouped keys or not, the same tokens as plain generate,
    whichever kernel the decode step takes on this CPU."""
    monkeypatch.setattr(decode_attention, "matmuls_faster", lambda *shape: matmuls)
    model, batch = tiny_lm(attention, kv_heads), _grouped_prompts()
    assert _taken(model, batch, _settings())
    plain, ours = _both(model, batch, _settings())
    assert ours.shape == plain.shape == (6, 6 + NEW)
    assert torch.equal(ours, plain)


def test_rows_that_end_are_padded_and_decoding_stops_when_all_have_ended():
    model, batch = tiny_lm("sdpa"), _grouped_prompts()
    with torch.no_grad():
        free = model.generate(**batch, generation_config=_settings())
    ends = int(free[0, 6 + 2])  # row 0's third new token ends its answer
    plain, ours = _both(model, batch, _settings(eos_token_id=ends))
    assert torch.equal(ours, plain)
    assert int(ours[0, 6 + 2]) == ends and bool((ours[0, 6 + 3 :] == 0).all())
    every_row_ends = [int(token) for token in free[:, 6]]  # each row's first new token
    plain, ours = _both(model, batch, _settings(eos_token_id=every_row_ends))
    assert ours.shape == plain.shape == (6, 6 + 1)
    assert torch.equal(ours, plain)


@pytest.mark.parametrize(
    "changes",
    [
        {"do_sample": True, "top_k": 1},  # sampling from the one token top-k leaves: greedy
        {"repetition_penalty": 3.0},  # a processor that reads the tokens so far
        {"min_new_tokens": 4, "eos_token_id": 10},  # row 0 would end at once without it
    ],
)
def test_tokens_go_through_the_logits_processors_of_the_call(changes):
    model, batch = tiny_lm("sdpa"), _grouped_prompts()
    plain, ours = _both(model, batch, _settings(**changes))
    assert torch.equal(ours, plain)
    greedy, _ = _both(model, batch, _settings())
    if "top_k" in changes:
        assert torch.equal(ours, greedy)
    else:  # the processor changed the answers: a path that skipped it would not match
        assert not torch.equal(ours, greedy)


def test_sampling_draws_each_row_on_its_own():
    """Sampled at temperature 1 the rows of a group differ (one shared draw would copy them),
    and under cpu_decoding the draw is its categorical one."""
    model, batch = tiny_lm("sdpa"), _grouped_prompts()
    torch.manual_seed(0)
    with torch.no_grad(), cpu_decoding(model):
        out = model.generate(**batch, generation_config=_settings(do_sample=True, top_k=0))
    assert out.shape == (6, 6 + NEW)
    assert not torch.equal(out[0], out[1]) or not torch.equal(out[2], out[3])


@pytest.mark.parametrize(
    "changes",
    [{"num_beams": 2}, {"do_sample": True, "num_return_sequences": 2}, {"return_dict_in_generate": True}],
)
def test_calls_it_cannot_honour_go_to_generate(changes):
    model, batch = tiny_lm("sdpa"), _grouped_prompts()
    assert not _taken(model, batch, _settings(**changes))
    with torch.no_grad():
        torch.manual_seed(0)
        plain = model.generate(**batch, generation_config=_settings(**changes))
        torch.manual_seed(0)
        with fixed_cache_decoding(model):
            ours = model.generate(**batch, generation_config=_settings(**changes))
    if isinstance(plain, torch.Tensor):
        assert torch.equal(ours, plain)
    else:
        assert torch.equal(ours.sequences, plain.sequences)


def test_a_caller_cache_or_hook_goes_to_generate():
    model, batch = tiny_lm("sdpa"), _grouped_prompts()
    ids = batch["input_ids"]
    assert not fixed_cache_plan(model, ids, {**batch, "past_key_values": None, "streamer": object()})
    assert fixed_cache_plan(model, ids, {**batch, "max_new_tokens": 3}).max_new_tokens == 3
    assert fixed_cache_plan(model, ids, {**batch, "generation_config": _settings()}).max_new_tokens == NEW


def test_other_architectures_and_short_windows_go_to_generate():
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=24, n_layer=2, n_head=2, n_positions=32)).eval()
    batch = _grouped_prompts()
    assert not _taken(gpt2, batch, _settings())
    windowed = MistralConfig(sliding_window=10)
    assert not attends_whole_context(windowed, 6 + NEW)
    assert attends_whole_context(windowed, 10)
    assert attends_whole_context(MistralConfig(sliding_window=None), 10_000)
    assert attends_whole_context(tiny_lm("sdpa").config, 10_000)


def test_generate_is_restored_after_the_context():
    model = tiny_lm("sdpa")
    before = model.generate
    with fixed_cache_decoding(model):
        assert model.generate != before
    assert "generate" not in vars(model)
    assert model.generate == before
