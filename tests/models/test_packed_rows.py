"""A padded batch's forward over packed rows gives the padded forward's hidden states and
gradients at every real token, and packs only what it can pack exactly."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2Model, MistralConfig, MistralModel

from alignflow.models.packed_rows import can_pack, first_fit_bins, last_hidden_state, pack_plan
from tests.models.tiny_llama import tiny_lm


def _ragged() -> dict[str, torch.Tensor]:
    """Rows padded on the right, on the left and on both sides, and one full row."""
    torch.manual_seed(1)
    ids = torch.randint(1, 50, (6, 10))
    mask = torch.ones(6, 10, dtype=torch.long)
    mask[0, 4:] = 0
    mask[1, 2:] = 0
    mask[2, :3] = 0
    mask[3, :1] = 0
    mask[3, 6:] = 0
    mask[4, 7:] = 0
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_hidden_states_are_the_padded_ones(attention):
    body, batch = tiny_lm(attention).model.float(), _ragged()
    plan = pack_plan(batch["attention_mask"])
    assert plan is not None and plan.packed_rows < 6  # the batch really is packed
    with torch.no_grad():
        padded = body(**batch).last_hidden_state
        packed = last_hidden_state(body, **batch)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(packed[real], padded[real], rtol=1e-5, atol=1e-5)
    assert not packed[~real].any()  # padding slots hold zeros


def test_given_positions_are_kept():
    body, batch = tiny_lm("sdpa").model.float(), _ragged()
    positions = torch.arange(10).expand(6, 10) * 2  # spread out: rotary sees other distances
    with torch.no_grad():
        padded = body(**batch, position_ids=positions).last_hidden_state
        packed = last_hidden_state(body, **batch, position_ids=positions)
        column_numbered = last_hidden_state(body, **batch)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(packed[real], padded[real], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(column_numbered[real], padded[real], atol=1e-3)  # positions matter here


def test_gradients_through_packed_rows_are_the_padded_ones():
    batch = _ragged()
    real = batch["attention_mask"].bool()
    weights = torch.randn(6, 10, 24)

    def grads(forward) -> list[torch.Tensor]:
        body = tiny_lm("sdpa").model.float()
        (forward(body)[real] * weights[real]).sum().backward()
        return [p.grad.clone() for p in body.parameters()]

    padded = grads(lambda body: body(**batch).last_hidden_state)
    packed = grads(lambda body: last_hidden_state(body, **batch))
    for a, b in zip(packed, padded, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_first_fit_places_the_longest_rows_first():
    assert first_fit_bins([3, 9, 4, 6, 1], 10) == [[1, 4], [3, 2], [0]]
    assert first_fit_bins([12, 2], 10) == [[0], [1]]  # a row wider than a bin gets its own


def test_a_batch_that_would_not_shrink_is_left_alone():
    assert pack_plan(torch.ones(4, 8, dtype=torch.long)) is None
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, 5:] = 0
    assert pack_plan(mask) is None  # 5 + 8 tokens do not fit one row of 8
    mask[1, 3:] = 0
    assert pack_plan(mask) is not None


def test_calls_it_cannot_pack_exactly_are_refused():
    body, batch = tiny_lm("sdpa").model, _ragged()
    assert can_pack(body, batch)
    assert not can_pack(body, {**batch, "use_cache": True})
    assert not can_pack(body, {**batch, "inputs_embeds": torch.zeros(6, 10, 24)})
    assert not can_pack(body, {"input_ids": batch["input_ids"]})  # no padding marked
    gpt2 = GPT2Model(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    assert not can_pack(gpt2, batch)
    config = MistralConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=4,
    )  # fmt: skip
    assert not can_pack(MistralModel(config), batch)  # a window shorter than the rows
