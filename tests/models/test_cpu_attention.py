"""CPU attention: plain matmuls over the key/value heads as stored give what eager and SDPA
attention give, in decoding, prefills and training; a model on a CPU is switched to it for
training, and its saved config does not remember it."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, BertConfig, BertModel

from alignflow.models.cpu_attention import (
    CPU_ATTENTION,
    MATMUL_ATTENTION_TOKENS,
    MATMUL_TRAINING_SCORES,
    matmuls_win,
    use_cpu_attention,
)
from tests.models.tiny_llama import greedy_with_logits, left_padded, tiny_lm


def _unpadded() -> dict[str, torch.Tensor]:
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _long_prompts() -> dict[str, torch.Tensor]:
    """Wider than MATMUL_ATTENTION_TOKENS: the prefill goes to SDPA, the steps do not."""
    ids = torch.randint(1, 50, (2, MATMUL_ATTENTION_TOKENS + 20), generator=torch.Generator().manual_seed(3))
    ids[1, :30] = 0
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


@pytest.mark.parametrize(
    ("kv_heads", "prompts"),
    [(1, left_padded), (2, left_padded), (6, left_padded), (2, _unpadded), (2, _long_prompts)],
)
def test_decoding_steps_score_as_eager_and_sdpa_attention(kv_heads, prompts):
    """Every step's logits of a greedy continuation, prefill included: left-padded, unpadded
    and long prompts, grouped (3 and 6 query heads per key/value head) and plain multi-head
    attention."""
    batch = prompts()
    model = tiny_lm("eager", kv_heads)
    generated = greedy_with_logits(model, batch)
    eager = torch.stack(generated.logits)
    for attention in ("sdpa", CPU_ATTENTION):
        model.set_attn_implementation(attention)
        again = greedy_with_logits(model, batch)
        assert torch.equal(again.sequences, generated.sequences)
        assert torch.stack(again.logits) == pytest.approx(eager, abs=1e-5)


def test_a_padded_position_is_not_read():
    """Changing a padding token's id changes nothing the real tokens see."""
    model = tiny_lm(CPU_ATTENTION)
    batch = left_padded()
    first = model.generate(**batch, do_sample=False, max_new_tokens=4, pad_token_id=0)
    batch["input_ids"][0, 0] = 3  # still masked out
    second = model.generate(**batch, do_sample=False, max_new_tokens=4, pad_token_id=0)
    assert torch.equal(first[:, 6:], second[:, 6:])


def test_a_training_forward_through_the_grouped_attention_scores_as_sdpa():
    model = tiny_lm(CPU_ATTENTION).train()
    ids = torch.tensor([[1, 2, 3, 4]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    reference = tiny_lm("sdpa").train()
    assert loss.item() == pytest.approx(reference(input_ids=ids, labels=ids).loss.item(), abs=1e-6)


def test_a_training_backward_through_the_matmuls_gives_sdpas_gradients():
    """Left-padded rows, scored on the tokens after each row's first (a padding position's
    output, which the two compute differently, predicts none of them)."""
    batch = left_padded()
    first_real = batch["attention_mask"].cumsum(1) == 1
    labels = batch["input_ids"].masked_fill((batch["attention_mask"] == 0) | first_real, -100)
    grads = {}
    for attention in ("sdpa", CPU_ATTENTION):
        model = tiny_lm(attention).train()
        model(**batch, labels=labels).loss.backward()
        grads[attention] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert grads[CPU_ATTENTION] == pytest.approx(grads["sdpa"], abs=1e-5)


def test_a_bidirectional_encoder_is_not_masked_causally():
    """An encoder's attention reads every position: with no mask given, none is made up."""
    config = BertConfig(
        vocab_size=50, hidden_size=24, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
        attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = BertModel(config, add_pooling_layer=False).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        sdpa = model(input_ids=ids).last_hidden_state
        model.set_attn_implementation(CPU_ATTENTION)
        ours = model(input_ids=ids).last_hidden_state
    assert ours == pytest.approx(sdpa, abs=1e-5)


class _Layer(torch.nn.Module):
    pass


def _shapes(rows: int, queries: int, keys: int, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    query = torch.zeros(rows, 4, queries, 2, requires_grad=grad)
    return query, torch.zeros(rows, 2, keys, 2)


def test_matmuls_take_decoding_short_prefills_and_training_within_the_memory_bound():
    layer = _Layer()
    long = MATMUL_ATTENTION_TOKENS + 1
    assert matmuls_win(layer, *_shapes(2, 1, 4 * long, grad=False), dropout=0.0)  # a decoding step
    assert matmuls_win(layer, *_shapes(2, 100, 100, grad=False), dropout=0.0)
    assert not matmuls_win(layer, *_shapes(2, long, long, grad=False), dropout=0.0)
    assert matmuls_win(layer, *_shapes(2, 100, 100, grad=True), dropout=0.0)
    rows_over_bound = MATMUL_TRAINING_SCORES // (4 * 100 * 100) + 1
    assert not matmuls_win(layer, *_shapes(rows_over_bound, 100, 100, grad=True), dropout=0.0)
    with torch.no_grad():  # nothing kept for a backward: no bound
        assert matmuls_win(layer, *_shapes(rows_over_bound, 100, 100, grad=True), dropout=0.0)
    layer.train()
    assert not matmuls_win(layer, *_shapes(2, 100, 100, grad=True), dropout=0.1)


def test_a_model_on_a_cpu_trains_with_the_matmuls_and_saves_no_trace_of_them(tmp_path):
    model = get_peft_model(tiny_lm("sdpa"), LoraConfig(r=2, target_modules="all-linear"))
    assert use_cpu_attention(model)
    assert model.get_base_model().config._attn_implementation == CPU_ATTENTION
    assert use_cpu_attention(model)  # already switched
    merged = model.merge_and_unload()
    merged.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert CPU_ATTENTION not in json.dumps(saved)
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config._attn_implementation == "sdpa"


def test_models_off_the_cpu_or_outside_the_attention_interface_are_left_alone():
    with torch.device("meta"):
        on_meta = tiny_lm("sdpa")
    assert not use_cpu_attention(on_meta)
    assert on_meta.config._attn_implementation == "sdpa"
    own_kernel = tiny_lm("sdpa")
    own_kernel.config._attn_implementation = "flash_attention_2"  # as a GPU run would load it
    assert not use_cpu_attention(own_kernel)
    assert not use_cpu_attention(torch.nn.Linear(2, 2))
