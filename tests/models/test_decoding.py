"""CPU decoding: inverse-CDF draws follow torch.multinomial's distribution; the context
swaps sampling and attention only while it is open and only on a CPU."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from alignflow.models.decoding import EAGER_PROMPT_TOKENS, cpu_decoding, inverse_cdf_multinomial


def test_inverse_cdf_draws_follow_the_probabilities_unnormalised_weights_too():
    generator = torch.Generator().manual_seed(0)
    weights = torch.softmax(torch.randn(3, 40, generator=generator) * 2, -1) * torch.tensor(
        [[1.0], [3.0], [0.5]]
    )
    weights[0, 7] = 0.0  # an impossible token is never drawn
    n = 40_000
    draws = torch.cat([inverse_cdf_multinomial(weights, 1, generator=generator) for _ in range(n)], dim=1)
    assert draws.shape == (3, n) and draws.dtype == torch.int64
    expected = weights / weights.sum(-1, keepdim=True)
    observed = torch.stack([torch.bincount(row, minlength=40) for row in draws]).float() / n
    # 5 standard errors of a frequency
    assert ((observed - expected).abs() <= 5 * (expected * (1 - expected) / n).sqrt() + 1e-4).all()
    assert observed[0, 7] == 0


def test_other_requests_go_to_torch():
    torch.manual_seed(0)
    probs = torch.rand(2, 10)
    assert inverse_cdf_multinomial(probs, 3).shape == (2, 3)  # several draws per row
    assert inverse_cdf_multinomial(probs[0], 1).shape == (1,)  # one row


def _tiny_lm(attention: str) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2,
    )  # fmt: skip
    return LlamaForCausalLM._from_config(config, attn_implementation=attention)


def test_the_context_swaps_sampling_and_attention_on_a_cpu_and_restores_them():
    model = _tiny_lm("sdpa")
    original = torch.multinomial
    with cpu_decoding(model, prompt_tokens=3):
        assert torch.multinomial is inverse_cdf_multinomial
        assert model.config._attn_implementation == "eager"
        ids = model.generate(torch.tensor([[1, 2, 3]]), do_sample=True, max_new_tokens=4, pad_token_id=0)
    assert ids.shape == (1, 7)
    assert torch.multinomial is original and model.config._attn_implementation == "sdpa"

    with pytest.raises(RuntimeError), cpu_decoding(model, prompt_tokens=3):
        raise RuntimeError("a failed generate")
    assert torch.multinomial is original and model.config._attn_implementation == "sdpa"


def test_a_model_off_the_cpu_is_left_alone():
    with torch.device("meta"):
        model = _tiny_lm("sdpa")
    with cpu_decoding(model, prompt_tokens=3):
        assert torch.multinomial is not inverse_cdf_multinomial
        assert model.config._attn_implementation == "sdpa"


def test_long_prompts_keep_sdpa_and_still_sample_by_inverse_cdf():
    model = _tiny_lm("sdpa")
    with cpu_decoding(model, prompt_tokens=EAGER_PROMPT_TOKENS + 1):
        assert model.config._attn_implementation == "sdpa"
        assert torch.multinomial is inverse_cdf_multinomial
