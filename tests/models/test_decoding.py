"""CPU decoding: one query token attends over the key/value heads as stored, giving what
eager and SDPA attention give; the context switches attention only while open, only on a CPU."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from alignflow.models.decoding import CPU_DECODE_ATTENTION, MATMUL_PREFILL_TOKENS, cpu_decoding


def _tiny_lm(attention: str, kv_heads: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50, hidden_size=24, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=kv_heads,
    )  # fmt: skip
    return LlamaForCausalLM._from_config(config, attn_implementation=attention).eval()


def _left_padded() -> dict[str, torch.Tensor]:
    ids = torch.tensor([[0, 0, 0, 5, 6, 7], [8, 9, 10, 11, 12, 13], [0, 14, 15, 16, 17, 18]])
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def _unpadded() -> dict[str, torch.Tensor]:
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _long_prompts() -> dict[str, torch.Tensor]:
    """Wider than MATMUL_PREFILL_TOKENS: the prefill goes to SDPA, the steps do not."""
    ids = torch.randint(1, 50, (2, MATMUL_PREFILL_TOKENS + 20), generator=torch.Generator().manual_seed(3))
    ids[1, :30] = 0
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def _greedy_with_logits(model: LlamaForCausalLM, batch: dict[str, torch.Tensor]):
    return model.generate(
        **batch,
        do_sample=False,
        max_new_tokens=6,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )


@pytest.mark.parametrize(
    ("kv_heads", "prompts"),
    [(1, _left_padded), (2, _left_padded), (6, _left_padded), (2, _unpadded), (2, _long_prompts)],
)
def test_decoding_steps_score_as_eager_and_sdpa_attention(kv_heads, prompts):
    """Every step's logits of a greedy continuation, prefill included: left-padded, unpadded
    and long prompts, grouped (3 and 6 query heads per key/value head) and plain multi-head
    attention."""
    batch = prompts()
    model = _tiny_lm("eager", kv_heads)
    generated = _greedy_with_logits(model, batch)
    eager = torch.stack(generated.logits)
    for attention in ("sdpa", CPU_DECODE_ATTENTION):
        model.set_attn_implementation(attention)
        again = _greedy_with_logits(model, batch)
        assert torch.equal(again.sequences, generated.sequences)
        assert torch.stack(again.logits) == pytest.approx(eager, abs=1e-5)


def test_a_padded_position_is_not_read():
    """Changing a padding token's id changes nothing the real tokens see."""
    model = _tiny_lm(CPU_DECODE_ATTENTION)
    batch = _left_padded()
    first = model.generate(**batch, do_sample=False, max_new_tokens=4, pad_token_id=0)
    batch["input_ids"][0, 0] = 3  # still masked out
    second = model.generate(**batch, do_sample=False, max_new_tokens=4, pad_token_id=0)
    assert torch.equal(first[:, 6:], second[:, 6:])


def test_the_context_switches_attention_on_a_cpu_and_restores_it():
    model = _tiny_lm("sdpa")
    with cpu_decoding(model):
        assert model.config._attn_implementation == CPU_DECODE_ATTENTION
        ids = model.generate(torch.tensor([[1, 2, 3]]), do_sample=True, max_new_tokens=4, pad_token_id=0)
    assert ids.shape == (1, 7)
    assert model.config._attn_implementation == "sdpa"

    with pytest.raises(RuntimeError), cpu_decoding(model):
        raise RuntimeError("a failed generate")
    assert model.config._attn_implementation == "sdpa"


def test_a_model_off_the_cpu_is_left_alone():
    with torch.device("meta"):
        model = _tiny_lm("sdpa")
    with cpu_decoding(model):
        assert model.config._attn_implementation == "sdpa"


def test_a_training_forward_through_the_grouped_attention_scores_as_sdpa():
    model = _tiny_lm(CPU_DECODE_ATTENTION).train()
    ids = torch.tensor([[1, 2, 3, 4]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    reference = _tiny_lm("sdpa").train()
    assert loss.item() == pytest.approx(reference(input_ids=ids, labels=ids).loss.item(), abs=1e-6)
