"""Typed configuration of the data stage (validation thresholds, split, versioning)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from alignflow.data.normalize import label_key


class DataConfig(BaseModel):
    """How preference data is read, validated, split and versioned."""

    model_config = ConfigDict(extra="forbid")

    source: str | None = Field(None, description="input file or directory; None = generate the demo data")
    format: str | None = Field(None, description="reader override: jsonl, json, parquet, csv, tsv, datasets")
    column_mapping: dict[str, str] = Field(default_factory=dict, description="input column -> canonical")
    preferred_values: dict[str, Literal["a", "b", "tie"]] = Field(
        default_factory=dict,
        description="labelled pairs: which response each value of the preferred column names, e.g. "
        "{'0': 'a', '1': 'b'} for PKU-SafeRLHF's better_response_id or {'1': 'a', '0': 'b'} for SHP's "
        "labels; replaces the default reading (1/2, a/b, model_a/model_b, tie...)",
    )
    score_range: tuple[float, float] = Field(
        (0.0, 1.0),
        description="scored rows: the scale their score is on, e.g. [0, 4] for HelpSteer2's ratings or "
        "[1, 10] for UltraFeedback's; scores are rescaled to [0, 1] and rows outside the scale quarantined",
    )
    response_fields: dict[Literal["text", "score", "rank"], str] = Field(
        default_factory=dict,
        description="ranked rows whose responses are records: the key of each one's text and of its "
        "score (higher is better) or rank (1 is best), e.g. {text: answer, rank: rank} for Nectar; "
        "unset, the common names are looked for (response/answer/text..., score/overall_score/rank)",
    )
    max_bad_fraction: float = Field(0.05, ge=0.0, le=1.0, description="fail when more rows are bad")
    eval_fraction: float = Field(0.1, gt=0.0, lt=1.0)
    split_seed: int = 0
    max_chars: int = 20_000
    max_tokens: int | None = None
    data_dir: str = "data"
    remote: str | None = Field(None, description="DVC remote URL; None = a local remote under .alignflow/")
    demo_rows: int = 1500
    tokenizer: str | None = Field(None, description="tokenizer path for the max_tokens check")
    max_label_fraction: float = Field(0.9, gt=0.5, le=1.0, description="warn when one KTO label dominates")
    demo_scored_rows: int = 500
    label_check_max_gap: float | None = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="stop when the champion reward model's agreement with the new labels (upper bound) "
        "is more than this below its pinned-set accuracy; None = no check",
    )
    label_check_pairs: int = Field(
        2000,
        ge=1,
        description="new pairs the label check scores (a sample beyond this); enough that each slice of "
        "the new pairs (a problem across phrasings) has the pairs to be judged on its own",
    )
    demo_phrasings: int = Field(
        1, ge=1, le=6, description="ways each demo problem is asked (more: more eval prompts)"
    )
    demo_task: Literal["addition", "word_problems"] = Field(
        "addition",
        description="the built-in task: single-digit 'addition' (sized for the tiny model) or two-digit "
        "'word_problems' in English that state their answer format (for real pretrained models)",
    )

    @field_validator("column_mapping", mode="before")
    @classmethod
    def _dotted_sources(cls, mapping: object) -> object:
        # `--set data.column_mapping.question.full_text=prompt` arrives nested: a dotted source
        return dict(_flatten(mapping)) if isinstance(mapping, dict) else mapping

    @field_validator("score_range")
    @classmethod
    def _low_below_high(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = value
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"data.score_range must be [low, high], finite, low < high; got {list(value)}")
        return value

    @field_validator("response_fields")
    @classmethod
    def _one_order(cls, fields: dict[str, str]) -> dict[str, str]:
        if {"score", "rank"} <= set(fields):
            raise ValueError("data.response_fields names a score or a rank, not both")
        return fields

    @field_validator("preferred_values", mode="before")
    @classmethod
    def _values_as_keys(cls, values: object) -> object:
        # YAML reads `{0: a, 1: b}` with integer keys; rows are matched on label_key's spelling
        if isinstance(values, dict):
            return {label_key(k): v for k, v in values.items()}
        return values


def _flatten(mapping: dict, prefix: str = ""):
    """(dotted source, target) pairs of a column mapping that may nest its sources."""
    for key, value in mapping.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
