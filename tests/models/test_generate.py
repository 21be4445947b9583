"""Batched generation: batches drawn by prompt length, answers returned in the caller's order."""

from __future__ import annotations

from alignflow.models import load_causal_lm
from alignflow.models.prompting import format_prompt, generate, longest_first

PROMPTS = [
    "What is 1 plus 2?",
    "Tell me a long story about numbers. " * 6 + "What is 4 plus 4?",
    "Hi?",
    "Please think carefully about the sum. What is 7 plus 0?",
    "What is 3 plus 5?",
]


def test_prompts_are_batched_longest_first(tiny_model_dir):
    _, tokenizer = load_causal_lm(tiny_model_dir)
    order = longest_first(tokenizer, PROMPTS)
    texts = [format_prompt(tokenizer, PROMPTS[i]) for i in order]
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    assert sorted(order) == list(range(len(PROMPTS)))
    assert lengths == sorted(lengths, reverse=True)
    assert order[0] == 1
    assert longest_first(tokenizer, []) == []


def test_batched_answers_come_back_in_the_callers_order(gpt2_policy_dir):
    model, tokenizer = load_causal_lm(gpt2_policy_dir)
    alone = [generate(model, tokenizer, [p], max_new_tokens=6)[0] for p in PROMPTS]
    batched = generate(model, tokenizer, PROMPTS, max_new_tokens=6, batch_size=2)
    assert batched == alone
    assert len(set(alone)) > 1  # distinct answers, so a shuffled order would show
