"""Sharing prefills: a batch that repeats its prompts (a GRPO group) decodes the same tokens
and logits as plain ``generate``, while each distinct prompt goes through the model once."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from alignflow.models.decoding import cpu_decoding
from alignflow.models.shared_prefill import (
    MIN_SHARED_OPENING,
    common_opening,
    distinct_rows,
    generate_sharing_prefix,
    opening_first,
    sharing_prefills,
)

GROUP = 4


def _tiny_lm() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50, hidden_size=24, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, pad_token_id=0,
    )  # fmt: skip
    return LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()


def _grouped_prompts(group: int = GROUP) -> dict[str, torch.Tensor]:
    """Three left-padded prompts of different lengths, each repeated ``group`` times in a
    row, as TRL's sampler lays out a GRPO batch."""
    prompts = torch.tensor([[0, 0, 0, 5, 6, 7], [8, 9, 10, 11, 12, 13], [0, 14, 15, 16, 17, 18]])
    ids = prompts.repeat_interleave(group, dim=0)
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def _sample(model: LlamaForCausalLM, batch: dict[str, torch.Tensor], **settings):
    torch.manual_seed(7)
    returned = {"output_logits": True, "return_dict_in_generate": True}
    return model.generate(**batch, max_new_tokens=8, pad_token_id=0, **returned, **settings)


def _prefill_calls(model: LlamaForCausalLM) -> list[tuple[int, int]]:
    """(rows, tokens) of every forward of the decoder that reads more than one token."""
    calls: list[tuple[int, int]] = []

    def record(_module, _args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] > 1:
            calls.append(tuple(ids.shape))

    model.model.register_forward_pre_hook(record, with_kwargs=True)
    return calls


@pytest.mark.parametrize("decoding", ["sdpa", "cpu_decoding"])
@pytest.mark.parametrize("settings", [{"do_sample": True, "temperature": 1.0}, {"do_sample": False}])
def test_grouped_prompts_decode_as_plain_generate(decoding, settings):
    """Same tokens and logits at every step, sampled (same seed) and greedy, with padding
    ahead of the shorter prompts (their positions start at their first real token)."""
    model, batch = _tiny_lm(), _grouped_prompts()
    with cpu_decoding(model) if decoding == "cpu_decoding" else torch.no_grad():
        plain = _sample(model, batch, **settings)
        with sharing_prefills(model):
            shared = _sample(model, batch, **settings)
    assert torch.equal(shared.sequences, plain.sequences)
    for ours, theirs in zip(shared.logits, plain.logits, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_each_distinct_prompt_is_prefilled_once():
    model, batch = _tiny_lm(), _grouped_prompts()
    calls = _prefill_calls(model)
    with sharing_prefills(model):
        _sample(model, batch, do_sample=True)
    width = batch["input_ids"].shape[1]
    assert calls == [(3, width - 1)]  # then one token a step for all 12 rows


@pytest.mark.parametrize(
    ("batch", "settings"),
    [
        (_grouped_prompts(group=1), {}),  # no prompt repeats
        (_grouped_prompts(), {"num_beams": 2}),
        (_grouped_prompts(), {"num_return_sequences": 2, "do_sample": True}),
        ({"input_ids": torch.tensor([[5], [5]]), "attention_mask": torch.ones(2, 1, dtype=torch.long)}, {}),
    ],
    ids=["distinct", "beams", "several-returns", "one-token"],
)
def test_calls_it_cannot_share_run_plain_generate(batch, settings):
    model = _tiny_lm()
    calls = _prefill_calls(model)
    plain = _sample(model, batch, **settings)
    with sharing_prefills(model):
        shared = _sample(model, batch, **settings)
    assert torch.equal(shared.sequences, plain.sequences)
    assert calls[len(calls) // 2 :] == calls[: len(calls) // 2]  # the same forwards both times


def test_distinct_rows_tell_masks_apart():
    """Rows with the same ids but a different mask are different prompts."""
    ids = torch.tensor([[0, 5, 6], [0, 5, 6], [0, 5, 6], [7, 8, 9]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1]])
    kept, rows = distinct_rows(ids, mask)
    assert sorted(kept.tolist()) == [0, 1, 3]
    assert torch.equal(kept[rows], torch.tensor([0, 1, 0, 3]))


def test_generate_is_restored_after_the_context():
    model = _tiny_lm()
    with sharing_prefills(model):
        assert "generate" in vars(model)
    assert "generate" not in vars(model)
    assert model.generate.__func__ is LlamaForCausalLM.generate


OPENING = list(range(20, 20 + MIN_SHARED_OPENING + 2))  # a system turn every prompt starts with


def _prompts_opening_alike() -> dict[str, torch.Tensor]:
    """Three distinct left-padded prompts that share their first ``len(OPENING)`` tokens."""
    rests = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14, 15]]
    width = len(OPENING) + max(map(len, rests))
    rows = [[0] * (width - len(OPENING) - len(r)) + OPENING + r for r in rests]
    ids = torch.tensor(rows)
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


@pytest.mark.parametrize("decoding", ["sdpa", "cpu_decoding"])
@pytest.mark.parametrize("settings", [{"do_sample": True, "temperature": 1.0}, {"do_sample": False}])
def test_a_common_opening_is_prefilled_once_and_decodes_as_plain_generate(decoding, settings):
    model, batch = _tiny_lm(), _prompts_opening_alike()
    width = batch["input_ids"].shape[1]
    calls = _prefill_calls(model)
    returned = {
        "output_logits": True,
        "return_dict_in_generate": True,
        "max_new_tokens": 8,
        "pad_token_id": 0,
    }
    with cpu_decoding(model) if decoding == "cpu_decoding" else torch.no_grad():
        torch.manual_seed(7)
        plain = model.generate(**batch, **returned, **settings)
        first_plain = len(calls)
        torch.manual_seed(7)
        shared = generate_sharing_prefix(
            model, batch["input_ids"], batch["attention_mask"], **returned, **settings
        )
    assert calls[:first_plain] == [(3, width)]
    assert calls[first_plain:] == [(1, len(OPENING)), (3, width - len(OPENING))]
    assert torch.equal(shared.sequences[:, width:], plain.sequences[:, width:])
    for ours, theirs in zip(shared.logits, plain.logits, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_the_common_opening_of_a_left_padded_batch():
    batch = _prompts_opening_alike()
    assert common_opening(batch["input_ids"], batch["attention_mask"]) == len(OPENING)
    ids = torch.tensor([[0, 4, 5, 6], [4, 5, 6, 7]])
    assert common_opening(ids, (ids != 0).long()) == 2  # the shorter row keeps a token of its own
    assert common_opening(ids, torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])) == 0  # padded on the right
    ids = torch.tensor([[4, 5, 6], [9, 5, 6]])
    assert common_opening(ids, torch.ones_like(ids)) == 0


def test_the_opening_moves_ahead_of_the_padding():
    ids = torch.tensor([[0, 0, 4, 5, 6], [4, 5, 6, 7, 8]])
    moved, mask = opening_first(ids, (ids != 0).long(), 2)
    assert moved.tolist() == [[4, 5, 0, 0, 6], [4, 5, 6, 7, 8]]
    assert mask.tolist() == [[1, 1, 0, 0, 1], [1, 1, 1, 1, 1]]
