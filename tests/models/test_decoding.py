"""CPU decoding: the context swaps attention to eager only while it is open, only on a CPU
and only for short prompt batches."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from alignflow.models.decoding import EAGER_PROMPT_TOKENS, cpu_decoding


def _tiny_lm(attention: str) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2,
    )  # fmt: skip
    return LlamaForCausalLM._from_config(config, attn_implementation=attention)


def test_the_context_swaps_sampling_and_attention_on_a_cpu_and_restores_them():
    model = _tiny_lm("sdpa")
    with cpu_decoding(model, prompt_tokens=3):
        assert model.config._attn_implementation == "eager"
        ids = model.generate(torch.tensor([[1, 2, 3]]), do_sample=True, max_new_tokens=4, pad_token_id=0)
    assert ids.shape == (1, 7)
    assert model.config._attn_implementation == "sdpa"

    with pytest.raises(RuntimeError), cpu_decoding(model, prompt_tokens=3):
        raise RuntimeError("a failed generate")
    assert model.config._attn_implementation == "sdpa"


def test_a_model_off_the_cpu_is_left_alone():
    with torch.device("meta"):
        model = _tiny_lm("sdpa")
    with cpu_decoding(model, prompt_tokens=3):
        assert model.config._attn_implementation == "sdpa"


def test_long_prompts_keep_sdpa():
    model = _tiny_lm("sdpa")
    with cpu_decoding(model, prompt_tokens=EAGER_PROMPT_TOKENS + 1):
        assert model.config._attn_implementation == "sdpa"
