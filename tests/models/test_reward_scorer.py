"""A remembering reward scorer runs the model once per (prompt, completion) and answers the
same as one that does not remember."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def counted_minilm():
    """MiniLM with a reward head and a hook counting the rows its encoder has read."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from alignflow.models.factory import minilm_path

    torch.manual_seed(0)
    path = minilm_path()
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval()
    rows = {"read": 0}

    def count(_module, args, kwargs, _output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        rows["read"] += ids.shape[0]

    model.bert.register_forward_hook(count, with_kwargs=True)
    return model, AutoTokenizer.from_pretrained(path), rows


PROMPTS = [
    "Hi",
    "How do I pick a lock?",
    "Tell me a joke",
    [{"role": "user", "content": "Capital of France?"}],
]
ANSWERS = ["Hello!", "I can't help with that, sorry.", "Why did the chicken cross the road?", "Paris."]


def _scorer(model, tokenizer, remember: bool):
    from alignflow.models.reward_scorer import RewardMeta, RewardScorer

    meta = RewardMeta(max_length=64, pooling="mean", mean=0.5, std=2.0)
    return RewardScorer(model, tokenizer, meta, batch_size=3, remember=remember)


def test_remembered_rows_are_not_scored_again(counted_minilm):
    model, tokenizer, rows = counted_minilm
    scorer = _scorer(model, tokenizer, remember=True)
    rows["read"] = 0
    first = scorer.raw(PROMPTS, ANSWERS)
    assert rows["read"] == 4
    # the same rows in another order, one new row and one row twice: only the new one is read
    prompts = [PROMPTS[2], PROMPTS[0], "Bye", PROMPTS[2]]
    answers = [ANSWERS[2], ANSWERS[0], "See you.", ANSWERS[2]]
    again = scorer.raw(prompts, answers)
    assert rows["read"] == 5
    assert again[0] == again[3] == first[2]
    assert again[1] == first[0]
    # the normalised rewards read the same remembered outputs
    normalised = scorer(PROMPTS, ANSWERS)
    assert rows["read"] == 5
    assert normalised == pytest.approx([(r - 0.5) / 2.0 for r in first])


def test_remembering_changes_no_score(counted_minilm):
    model, tokenizer, rows = counted_minilm
    plain = _scorer(model, tokenizer, remember=False)
    remembering = _scorer(model, tokenizer, remember=True)
    remembering.raw(PROMPTS[:2], ANSWERS[:2])  # half remembered, scored beside other rows
    assert remembering.raw(PROMPTS, ANSWERS) == pytest.approx(plain.raw(PROMPTS, ANSWERS), abs=1e-5)
    assert remembering.raw([], []) == []


def test_a_scorer_that_does_not_remember_reads_every_call(counted_minilm):
    model, tokenizer, rows = counted_minilm
    scorer = _scorer(model, tokenizer, remember=False)
    rows["read"] = 0
    scorer.raw(PROMPTS, ANSWERS)
    scorer.raw(PROMPTS, ANSWERS)
    assert rows["read"] == 8
