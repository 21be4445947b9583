"""A padded batch's forward over packed rows, shared prefixes computed once, gives the padded
forward's hidden states and gradients at every real token, and packs only what it can pack
exactly."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2Model, LlamaConfig, MistralConfig, MistralModel

from alignflow.models.cpu_attention import CPU_ATTENTION, MATMUL_ATTENTION_TOKENS, MATMUL_TRAINING_SCORES
from alignflow.models.packed_rows import (
    SCORE_OVERHEAD_FLOPS,
    attention_share,
    can_pack,
    first_fit_bins,
    given_arguments,
    last_hidden_state,
    layer_variant,
    pack_plan,
    packed_forward,
    packing_counts,
    padded_plan,
    prefix_groups,
)
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


def _grouped() -> dict[str, torch.Tensor]:
    """GRPO's layout: two prompts left-padded to one width, each followed by several
    completions right-padded to another (three and two of them), and a row of its own."""
    a, b = [3, 4, 5, 6, 7], [8, 9, 10]
    completions = [[11, 12, 13], [11, 14], [15, 16, 17, 18], [19, 20, 21], [22]]
    rows = [[0, 0, 27, 28, 29, 23, 24, 25, 26]] + [
        [0] * (5 - len(prompt)) + prompt + done + [0] * (4 - len(done))
        for prompt, done in zip([a, a, a, b, b], completions, strict=True)
    ]
    ids = torch.tensor(rows)
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def _nested() -> dict[str, torch.Tensor]:
    """DPO's layout (flush left): every row opens with the same two tokens (a chat template's
    system turn), pairs share a prompt after them, and each pair's answers share a first word."""
    rows = [
        [1, 2, 3, 4, 5, 6, 7, 8, 0],
        [1, 2, 3, 4, 5, 6, 9, 10, 11],
        [1, 2, 12, 13, 14, 15, 16, 0, 0],
        [1, 2, 12, 13, 14, 17, 0, 0, 0],
        [1, 2, 18, 19, 20, 21, 0, 0, 0],
    ]
    ids = torch.tensor(rows)
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


BATCHES = {"ragged": _ragged, "grouped": _grouped, "nested": _nested}


def _shared_tokens(batch: dict[str, torch.Tensor]) -> int:
    """How many of the batch's real tokens the packing computes once for several rows."""
    plan = pack_plan(batch["attention_mask"], batch["input_ids"])
    assert plan is not None
    return int(batch["attention_mask"].sum()) - len(plan.fill_target)


@pytest.mark.parametrize("attention", ["sdpa", "eager", CPU_ATTENTION])
@pytest.mark.parametrize("name", list(BATCHES))
def test_packed_hidden_states_are_the_padded_ones(attention, name):
    body, batch = tiny_lm(attention).model.float(), BATCHES[name]()
    rows, width = batch["input_ids"].shape
    plan = pack_plan(batch["attention_mask"], batch["input_ids"])
    assert plan is not None and plan.packed_rows * plan.packed_width < rows * width  # really packed
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


def test_rows_that_open_alike_are_computed_once():
    assert _shared_tokens(_ragged()) == 0
    # the second and third of prompt a take its 5 tokens and one more (11), the second of b 3
    assert _shared_tokens(_grouped()) == 5 + 6 + 3
    # a pair's prompt and answers' first word, and nothing across pairs (2 of 6 or 9 tokens)
    assert _shared_tokens(_nested()) == 6 + 5


def test_equal_ids_at_other_positions_are_not_shared():
    batch = _grouped()
    positions = torch.arange(9).expand(6, 9).clone()
    positions[2] += 1  # a row numbered from 1: its tokens sit elsewhere for the rotary embedding
    plan = pack_plan(batch["attention_mask"], batch["input_ids"], positions)
    assert plan is not None
    assert int(batch["attention_mask"].sum()) - len(plan.fill_target) == 5 + 3  # row 2 shares nothing
    body = tiny_lm("sdpa").model.float()
    with torch.no_grad():
        padded = body(**batch, position_ids=positions).last_hidden_state
        packed = last_hidden_state(body, **batch, position_ids=positions)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(packed[real], padded[real], rtol=1e-5, atol=1e-5)


def test_rows_join_a_group_when_they_share_half_of_the_shorter():
    tokens = [[(1, 0), (2, 1), (3, 2), (4, 3)], [(1, 0), (2, 1), (3, 2), (5, 3)], [(1, 0), (6, 1), (7, 2)]]
    lengths, commons = [len(t) for t in tokens], [0, 3, 1]  # row 2 shares one token with row 1
    groups, shared = prefix_groups(lengths, commons, capacity=8)
    assert groups == [[0, 1], [2]] and shared == [0, 3, 0]  # one token of three is not worth a group
    groups, shared = prefix_groups(lengths, commons, capacity=4)
    assert groups == [[0], [1], [2]] and shared == [0, 0, 0]  # 4 + 1 tokens would overflow a row of 4


def test_a_wide_attention_window_is_weighed_against_the_rows_it_saves():
    batch = _grouped()  # rows of 9
    free = pack_plan(batch["attention_mask"], batch["input_ids"], attention_share=0.0)
    assert free is not None and free.packed_width > 9  # whole groups, prompts shared once
    # where attending cost as much as a hundred tokens' weights, rows wider than the batch's do
    # not pay: its groups are split to fit rows of 9 (a prompt and a completion and a half)
    costly = pack_plan(batch["attention_mask"], batch["input_ids"], attention_share=100.0)
    assert costly is not None and costly.packed_width == 9 and costly.packed_rows < 6
    body = tiny_lm("sdpa").model
    config = body.config  # 6 heads of 4 over 24, two key/value heads, a 32-wide MLP
    weights = 24 * 4 * (12 + 4) + 3 * 24 * 32
    assert attention_share(config) == pytest.approx(6 * (4 * 4 + SCORE_OVERHEAD_FLOPS) / (2 * weights))


@pytest.mark.parametrize("attention", ["sdpa", CPU_ATTENTION])
@pytest.mark.parametrize("name", list(BATCHES))
def test_gradients_through_packed_rows_are_the_padded_ones(attention, name):
    batch = BATCHES[name]()
    real = batch["attention_mask"].bool()
    weights = torch.randn(*batch["input_ids"].shape, 24)

    def grads(forward) -> list[torch.Tensor]:
        body = tiny_lm(attention).model.float()
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
    """Where attention costs as much as the weights' products at a row's width, rows twice as
    wide cost more than they save: only rows as wide as the batch's may hold two of them."""
    share = 1 / 8
    assert pack_plan(torch.ones(4, 8, dtype=torch.long), attention_share=share) is None
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, 5:] = 0
    assert pack_plan(mask, attention_share=share) is None  # 5 + 8 tokens do not fit one row of 8
    assert pack_plan(mask, attention_share=0.0).packed_width == 13  # where attention were free
    mask[1, 3:] = 0
    assert pack_plan(mask, attention_share=share).packed_width == 8


def test_packed_rows_keep_the_layer_variant_of_the_batch():
    batch = _grouped()  # rows of 9; the prompts' groups hold 14 and 10 tokens
    free = pack_plan(batch["attention_mask"], batch["input_ids"], attention_share=0.0)
    assert free is not None and free.packed_width > 9

    def narrow(rows: int, width: int) -> bool:  # a kernel for rows up to 12 wide, another past
        return width <= 12

    capped = pack_plan(batch["attention_mask"], batch["input_ids"], attention_share=0.0, variant=narrow)
    assert capped is not None and capped.packed_width <= 12
    wide = torch.ones(3, 20, dtype=torch.long)
    wide[1:, 6:] = 0  # 20, 6 and 6 tokens: the batch itself is past 12, so may its packed rows be
    assert pack_plan(wide, attention_share=0.0, variant=narrow).packed_width == 32
    scores = pack_plan(wide, attention_share=0.0, variant=lambda rows, width: rows * width * width > 1100)
    assert scores is None  # 3 x 20 x 20 scores, over 1100: no packing (32 x 32, 2 x 20 x 20) is


def test_alignflows_cpu_attention_says_which_kernel_a_batch_takes():
    kernel = layer_variant(tiny_lm(CPU_ATTENTION).model.config)  # 6 heads
    assert kernel(1, MATMUL_ATTENTION_TOKENS) != kernel(1, MATMUL_ATTENTION_TOKENS + 1)
    rows = MATMUL_TRAINING_SCORES // (6 * 100 * 100)  # the most rows of 100 kept as plain matmuls
    assert kernel(rows, 100) != kernel(rows + 1, 100)
    # SDPA either way, but down two branches that a compiled layer guards on apart
    assert kernel(rows + 1, 100) != kernel(1, MATMUL_ATTENTION_TOKENS + 1)
    with torch.no_grad():  # nothing kept for a backward: only the keys count
        kernel = layer_variant(tiny_lm(CPU_ATTENTION).model.config)
        assert kernel(rows, 100) == kernel(rows + 1, 100)
    sdpa = layer_variant(tiny_lm("sdpa").model.config)  # no branches; a single row is its own graph
    assert sdpa(2, 1000) == sdpa(16, 10) != sdpa(1, 10)


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


def _looks(value: object) -> object:
    """What a compiled layer guards on of an argument: kind, rank, dtype, layout, and its base's."""
    if not isinstance(value, torch.Tensor):
        return type(value)
    base = value._base
    layout = None if base is None else (base.dim(), base.is_contiguous())
    return value.dim(), value.dtype, value.is_contiguous(), layout


def test_a_batch_not_worth_packing_is_called_as_a_packed_one_is():
    """The same arguments, alike down to their strides and bases, whichever way a batch goes: a
    compiled layer guards on them (SmolLM2's DPO bench compiled again in step 2, ~11 s a layer
    variant, where a packed step 1 met a padded step 2). The hidden states stay the padded ones."""
    body, batch = tiny_lm("sdpa").model.float(), _ragged()
    seen = []
    body.register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs), with_kwargs=True)
    full = {"input_ids": batch["input_ids"], "attention_mask": torch.ones_like(batch["attention_mask"])}
    with torch.no_grad():
        plain = body(**batch).last_hidden_state
        plain_full = body(**full).last_hidden_state
        padded = last_hidden_state(body, **full, inputs_embeds=None)  # nothing to pack
        packed = last_hidden_state(body, **batch)
    padded_call, packed_call = seen[2], seen[3]
    assert set(padded_call) == set(packed_call) and "inputs_embeds" not in padded_call
    assert {k: _looks(v) for k, v in padded_call.items()} == {k: _looks(v) for k, v in packed_call.items()}
    torch.testing.assert_close(padded, plain_full, rtol=1e-5, atol=1e-5)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(packed[real], plain[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(BATCHES))
def test_rows_left_as_they_are_give_the_padded_hidden_states(name):
    """The padded plan moves each row's tokens to its front (left padding included), with their
    positions: nothing shared, nothing packed, the padded forward's hidden states."""
    body, batch = tiny_lm("sdpa").model.float(), BATCHES[name]()
    plan = padded_plan(batch["attention_mask"])
    assert (plan.packed_rows, plan.packed_width) == tuple(batch["input_ids"].shape)
    assert len(plan.fill_target) == int(batch["attention_mask"].sum())
    with torch.no_grad():
        plain = body(**batch).last_hidden_state
        ours = packed_forward(body, plan, batch["input_ids"], None)
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[real], plain[real], rtol=1e-5, atol=1e-5)
    assert not ours[~real].any()


def test_a_wrappers_unset_arguments_still_pack():
    """PEFT calls the body with every argument it knows, None or false where nobody set it."""
    body, batch = tiny_lm("sdpa").model, _grouped()
    unset = {
        "inputs_embeds": None,
        "output_attentions": None,
        "output_hidden_states": False,
        "return_dict": None,
    }
    assert can_pack(body, given_arguments({**batch, **unset, "use_cache": False}))
    assert not can_pack(body, given_arguments({**batch, **unset, "output_attentions": True}))


def test_long_rows_sharing_half_stay_apart_at_smollm2s_attention_cost():
    """Two rows of 1,000 tokens sharing 500: one packed row of 1,500 saves a quarter of the
    weights' products but sees 1.5x the keys. Counting a score's softmax (SmolLM2's shapes) that
    does not pay; counting its products alone, it would."""
    config = LlamaConfig(
        hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3
    )
    ids = torch.randint(1, 100, (2, 1000), generator=torch.Generator().manual_seed(0))
    ids[1, :500] = ids[0, :500]
    mask = torch.ones_like(ids)
    assert pack_plan(mask, ids, attention_share=attention_share(config)) is None
    products_only = 9 * 4 * 64 / (2 * (576 * 64 * (18 + 6) + 3 * 576 * 1536))
    assert pack_plan(mask, ids, attention_share=products_only).packed_width == 1500


def test_every_forward_is_counted_and_only_the_packed_ones_save_tokens():
    body, shared = tiny_lm("sdpa").model, _nested()
    full = {"input_ids": shared["input_ids"], "attention_mask": torch.ones_like(shared["attention_mask"])}
    with torch.no_grad():
        last_hidden_state(body, **full)  # nothing to pack: computed as it stands
        counts = packing_counts(body)
        assert (counts.forwards, counts.packed, counts.describe()) == (1, 0, "off")
        assert counts.computed == counts.tokens == full["input_ids"].numel()
        last_hidden_state(body, **shared)
    real = int(shared["attention_mask"].sum())
    assert (counts.forwards, counts.packed, counts.tokens) == (2, 1, full["input_ids"].numel() + real)
    assert counts.computed < counts.tokens and counts.computed_share < 1  # the prompts once
    assert counts.describe().startswith("on (1 of 2 forwards, ")
