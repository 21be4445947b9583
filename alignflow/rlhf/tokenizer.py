"""The tokenizer a spec-002 snippet hands to ``FeedbackDataset`` and ``train_reward_model``.

A hub model brings its own tokenizer. The offline ``tiny`` preset has none until one is
trained on the data, so this trains it on the feedback's text, exactly as the pipeline's
tiny preset does (same texts, same vocabulary size), with no download.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from alignflow.models.model_config import TINY, ModelSpec
from alignflow.rlhf.feedback import feedback_records


def feedback_texts(feedbacks: Iterable[Any]) -> list[str]:
    """Every prompt and response text of the feedback (message lists: their contents)."""
    from alignflow.data.feedback import canonical_from_export
    from alignflow.data.pairing import corpus_texts

    return corpus_texts(canonical_from_export(r) for r in feedback_records(feedbacks))


def build_tokenizer(feedbacks: Iterable[Any], base_model: str = TINY, vocab_size: int | None = None) -> Any:
    """``base_model``'s tokenizer; for ``tiny``, one trained on ``feedbacks`` (offline)."""
    if base_model != TINY:
        from transformers import AutoTokenizer

        from alignflow.models.factory import resolve_model_source

        tokenizer = AutoTokenizer.from_pretrained(resolve_model_source(base_model))
    else:
        from alignflow.models.factory import train_tokenizer

        texts = feedback_texts(feedbacks)
        if not texts:
            raise ValueError("build_tokenizer: no feedback text to train the tiny tokenizer on")
        tokenizer = train_tokenizer(texts, vocab_size=vocab_size or ModelSpec().vocab_size)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
