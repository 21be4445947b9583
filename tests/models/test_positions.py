"""Prompts longer than a policy's position table are cut from the left instead of crashing it."""

from __future__ import annotations

import pytest
import torch

from alignflow.models import load_causal_lm
from alignflow.models.positions import position_limit, prompt_token_budget
from alignflow.models.prompting import cut_prompt_text, format_prompt, generate, prompt_batch, prompts_cut

LONG = "Please read all of this carefully. " * 20 + "What is 2 plus 3?"


def test_a_long_prompt_is_answered_from_its_last_tokens(gpt2_policy_dir):
    model, tokenizer = load_causal_lm(gpt2_policy_dir)
    assert position_limit(model, tokenizer) == 48
    ids = tokenizer(format_prompt(tokenizer, LONG), add_special_tokens=False)["input_ids"]
    assert len(ids) > 48  # without the cut: IndexError, index out of range in self

    budget = prompt_token_budget(tokenizer, 8, model)
    assert budget == 40
    [answer] = generate(model, tokenizer, [LONG], max_new_tokens=8)
    with torch.no_grad():  # the same greedy answer from the prompt's last 40 tokens, by hand
        tail = torch.tensor([ids[-budget:]])
        out = model.generate(
            tail,
            attention_mask=torch.ones_like(tail),
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    assert answer == tokenizer.decode(out[0, budget:], skip_special_tokens=True)
    assert prompts_cut(tokenizer, [LONG, "Hi?"], budget) == 1


def test_short_prompts_and_rotary_models_are_left_alone(gpt2_policy_dir, tiny_model_dir):
    model, tokenizer = load_causal_lm(gpt2_policy_dir)
    batch = prompt_batch(tokenizer, ["Hi?", LONG], prompt_token_budget(tokenizer, 8, model))
    short = tokenizer(format_prompt(tokenizer, "Hi?"), add_special_tokens=False)["input_ids"]
    assert batch["input_ids"].shape[1] == 40 and batch["input_ids"][0, -len(short) :].tolist() == short
    assert tokenizer.truncation_side == "right" and tokenizer.padding_side == "right"  # restored

    llama, llama_tokenizer = load_causal_lm(tiny_model_dir)  # rotary: no table, nothing cut
    assert prompt_token_budget(llama_tokenizer, 8, llama) is None
    assert prompts_cut(llama_tokenizer, [LONG], None) == 0


def test_no_room_for_a_prompt_is_a_clear_error(gpt2_policy_dir, tiny_model_dir):
    model, tokenizer = load_causal_lm(gpt2_policy_dir)
    with pytest.raises(ValueError, match="max_new_tokens 48 leaves no room for a prompt in 48 positions"):
        generate(model, tokenizer, ["Hi?"], max_new_tokens=48)
    llama, _ = load_causal_lm(tiny_model_dir)  # of two models, the smaller table counts
    assert prompt_token_budget(tokenizer, 8, llama, model) == 40


def test_prompt_text_is_cut_from_the_left_to_the_budget(gpt2_policy_dir):
    _, tokenizer = load_causal_lm(gpt2_policy_dir)
    text = format_prompt(tokenizer, LONG)
    cut = cut_prompt_text(tokenizer, text, 20)
    assert len(tokenizer(cut)["input_ids"]) <= 20 < len(tokenizer(text)["input_ids"])
    assert text.endswith(cut.strip()) and len(cut) > 20, "the tail of the prompt, as text"
    assert cut_prompt_text(tokenizer, "Hi?", 20) == "Hi?"
