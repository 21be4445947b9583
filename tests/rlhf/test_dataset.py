"""FeedbackDataset (encoding, score scale, split by prompt), PPODataset and the offline tokenizer."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pytest
import torch

from alignflow.models.reward_scorer import encode_for_reward
from alignflow.rlhf import FeedbackDataset, PPODataset, build_tokenizer


@pytest.fixture(scope="module")
def tokenizer(feedback_list):
    return build_tokenizer(feedback_list, "tiny")


def test_rows_are_encoded_as_the_reward_stage_encodes_them(feedback_list, tokenizer):
    dataset = FeedbackDataset(feedback_list, tokenizer, max_length=16)
    assert len(dataset) == len(feedback_list)
    for i in (0, 1, 5):
        item = dataset[i]
        row = feedback_list[i]
        expected = encode_for_reward(tokenizer, row["prompt"], row["response"], 16)
        assert item["input_ids"].tolist() == expected and len(expected) <= 16
        assert item["attention_mask"].tolist() == [1] * len(expected)
    assert dataset[0]["labels"].dtype == torch.float32


def test_minmax_maps_the_observed_range_onto_0_1_and_back(tokenizer):
    rows = [{"prompt": f"p{i}", "response": "r", "score": s} for i, s in enumerate([0.2, 0.5, 0.8])]
    dataset = FeedbackDataset(rows, tokenizer)
    assert dataset.scale.method == "minmax"
    assert dataset.targets == pytest.approx([0.0, 0.5, 1.0])
    assert [dataset.scale.inverse(t) for t in dataset.targets] == pytest.approx(dataset.scores)
    assert [float(dataset[i]["labels"]) for i in range(3)] == pytest.approx([0.0, 0.5, 1.0])


def test_zscore_and_none(tokenizer, feedback_list):
    z = FeedbackDataset(feedback_list, tokenizer, normalization="zscore")
    assert statistics.fmean(z.targets) == pytest.approx(0.0, abs=1e-9)
    assert statistics.pstdev(z.targets) == pytest.approx(1.0)
    assert [z.scale.inverse(t) for t in z.targets] == pytest.approx(z.scores)
    assert FeedbackDataset(feedback_list, tokenizer, normalization="none").targets == z.scores
    constant = [{"prompt": "p", "response": "r", "score": 0.7}] * 2
    assert FeedbackDataset(constant, tokenizer).targets == [0.0, 0.0]  # no division by zero
    with pytest.raises(ValueError, match="normalization"):
        FeedbackDataset(feedback_list, tokenizer, normalization="rank")


def test_split_keeps_each_prompt_on_one_side_and_every_row(feedback_list, tokenizer):
    dataset = FeedbackDataset(feedback_list, tokenizer)
    train, val = dataset.split(val_fraction=0.25, seed=1)
    assert set(train.prompts).isdisjoint(val.prompts)
    assert len(set(val.prompts)) == 4 and len(train) + len(val) == len(dataset)
    assert sorted(r["id"] for r in train.records + val.records) == sorted(r["id"] for r in dataset.records)
    assert train.scale == val.scale == dataset.scale  # one scale: targets mean the same on both sides
    again, _ = dataset.split(val_fraction=0.25, seed=1)
    assert again.prompts == train.prompts
    assert dataset.split(val_fraction=0.25, seed=2)[1].prompts != val.prompts


def test_feedback_objects_and_bad_rows(tokenizer):
    @dataclass
    class Feedback:
        prompt: str
        response: str
        score: float

    assert len(FeedbackDataset([Feedback("Hi", "OK.", 0.9)], tokenizer)) == 1
    bad = [
        ({"prompt": "p", "response": "r", "score": 1.5}, r"feedback\[1\]: 'score' must be in \[0, 1\]"),
        ({"prompt": "p", "response": "r", "score": "high"}, r"feedback\[1\]: 'score' must be a number"),
        ({"prompt": "", "response": "r", "score": 0.5}, r"feedback\[1\]: 'prompt' must be"),
        ({"prompt": "p", "score": 0.5}, r"feedback\[1\]: 'response' must be a string"),
        ({"prompt": "p", "text": "r"}, r"feedback\[1\]: neither a rating"),
        ({"prompt": "p", "chosen": "a", "rejected": "b"}, r"feedback\[1\]: FeedbackDataset holds ratings"),
    ]
    for row, message in bad:
        with pytest.raises(ValueError, match=message):
            FeedbackDataset([{"prompt": "q", "response": "r", "score": 0.1}, row], tokenizer)


def test_collate_pads_a_batch(feedback_list, tokenizer):
    dataset = FeedbackDataset(feedback_list, tokenizer)
    batch = dataset.collate([dataset[0], dataset[1]])
    lengths = [len(dataset[0]["input_ids"]), len(dataset[1]["input_ids"])]
    assert batch["input_ids"].shape == (2, max(lengths))
    assert batch["attention_mask"].sum(-1).tolist() == lengths
    assert batch["labels"].tolist() == pytest.approx(dataset.targets[:2])


def test_ppo_dataset_holds_distinct_prompts_in_order(feedback_list, comparison_list, tokenizer):
    prompts = PPODataset(feedback_list)
    assert len(prompts) == 16 and prompts[0] == {"prompt": "Say OK if you know about rivers."}
    assert PPODataset(comparison_list).prompts == prompts.prompts
    item = PPODataset(feedback_list, tokenizer)[1]
    assert item["query"].startswith("<|user|>Say OK if you know about stars.")
    assert item["input_ids"].tolist() == tokenizer(item["query"], add_special_tokens=False)["input_ids"]


def test_the_tiny_tokenizer_is_the_one_the_pipeline_builds(feedback_list, tokenizer, tmp_path):
    """Trained offline on the feedback's text, exactly as the tiny preset trains its own."""
    from transformers import AutoTokenizer

    from alignflow.data.feedback import canonical_from_export
    from alignflow.data.pairing import corpus_texts
    from alignflow.models import ModelSpec, prepare_base_model
    from alignflow.rlhf.feedback import feedback_records

    records = [canonical_from_export(r) for r in feedback_records(feedback_list)]
    built = AutoTokenizer.from_pretrained(prepare_base_model(ModelSpec(), corpus_texts(records), tmp_path))
    assert tokenizer.get_vocab() == built.get_vocab()
    text = "Say OK if you know about rivers. OK."
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
