"""A two-layer Llama with grouped key/value heads and the batches the CPU attention and
decoding tests share."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_lm(attention: str, kv_heads: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50, hidden_size=24, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=kv_heads,
    )  # fmt: skip
    return LlamaForCausalLM._from_config(config, attn_implementation=attention).eval()


def left_padded() -> dict[str, torch.Tensor]:
    ids = torch.tensor([[0, 0, 0, 5, 6, 7], [8, 9, 10, 11, 12, 13], [0, 14, 15, 16, 17, 18]])
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def greedy_with_logits(model: LlamaForCausalLM, batch: dict[str, torch.Tensor]):
    return model.generate(
        **batch,
        do_sample=False,
        max_new_tokens=6,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
