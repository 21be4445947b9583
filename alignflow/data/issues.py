"""Reason codes and the issue record shared by readers, checks and the report.

Every problem found in the input, from a truncated file to a duplicated pair, becomes an
:class:`Issue` with one stable reason code, so reports and quarantine can be counted and
grepped by code rather than by message text.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Reason(StrEnum):
    # files and rows that cannot be read
    FILE_NOT_FOUND = "file_not_found"
    FILE_UNREADABLE = "file_unreadable"
    FILE_TRUNCATED = "file_truncated"
    FILE_EMPTY = "file_empty"
    INVALID_JSON = "invalid_json"
    NOT_AN_OBJECT = "not_an_object"
    MALFORMED_CSV = "malformed_csv"  # e.g. an unbalanced quote: the record is set aside, not merged
    # shape and fields
    UNKNOWN_SHAPE = "unknown_shape"
    MISSING_FIELD = "missing_field"
    EMPTY_FIELD = "empty_field"
    NON_STRING_FIELD = "non_string_field"
    INVALID_UTF8 = "invalid_utf8"
    CONTROL_CHARS = "control_chars"
    BAD_CHAT = "bad_chat_structure"
    HH_UNSPLITTABLE = "hh_unsplittable"
    # values
    CHOSEN_EQUALS_REJECTED = "chosen_equals_rejected"
    SCORE_OUT_OF_RANGE = "score_out_of_range"
    SCORE_INVALID = "score_invalid"
    BAD_LABEL = "bad_label"
    TIE = "tie"  # a labelled pair that prefers neither response: nothing for a pairwise loss
    TOO_LONG_CHARS = "too_long_chars"
    TOO_LONG_TOKENS = "too_long_tokens"
    # across rows
    DUPLICATE_EXACT = "duplicate_exact"
    DUPLICATE_NEAR = "duplicate_near"
    PROMPT_LEAKAGE = "prompt_leakage"
    # dataset-level warnings (never quarantine a row on their own)
    LABEL_IMBALANCE = "label_imbalance"
    FILE_SKIPPED = "file_skipped"  # a directory's README, licence...: not data, not read
    # great-expectations failures without a more specific code
    EXPECTATION_FAILED = "expectation_failed"


# file-level reasons that mean nothing (or not everything) could be read from a file
UNREADABLE_FILE_REASONS = {Reason.FILE_NOT_FOUND, Reason.FILE_UNREADABLE, Reason.FILE_EMPTY}


@dataclass
class Issue:
    """One problem: what (code, message), where (file, row, field) and the row as it came in."""

    code: Reason
    message: str
    file: str
    row: int | None = None
    field: str | None = None
    original: Any = None

    def location(self) -> str:
        where = self.file if self.row is None else f"{self.file}:{self.row}"
        return f"{where} [{self.field}]" if self.field else where

    def describe(self) -> str:
        return f"{self.location()}: {self.code}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": str(self.code),
            "file": self.file,
            "row": self.row,
            "field": self.field,
            "message": self.message,
        }
