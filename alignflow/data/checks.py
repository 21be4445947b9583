"""Row checks that great-expectations does not express well, each with its own reason code.

Checks run on canonical records (see :mod:`alignflow.data.normalize`). Each returns the
first problem found as a :class:`RowError`-like tuple so one row carries one reason.
Cross-row checks (duplicates, leakage, label balance) keep state in small helpers.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from alignflow.data.issues import Reason
from alignflow.data.normalize import RowError

TEXT_FIELDS = {
    "pair": ("prompt", "chosen", "rejected"),
    "scored": ("prompt", "completion"),
    "unpaired": ("prompt", "completion"),
    "prompt": ("prompt",),
}
CHAT_ROLES = {"system", "user", "assistant", "tool"}
_SURROGATES = re.compile("[\ud800-\udfff]")
# C0 controls except tab/newline/carriage return, DEL and C1 controls
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_NOT_WORD = re.compile(r"[\W_]+")
_MINUS = re.compile(r"(?<!\w)-(?=\d)")


def check_record(record: dict[str, Any], tokenizer: Any = None, max_tokens: int | None = None) -> None:
    """Raise RowError for the first problem in one canonical record."""
    fields = TEXT_FIELDS[record["kind"]]
    shapes = {f: check_field(record.get(f), f) for f in fields}
    if len(set(shapes.values())) > 1:
        raise RowError(Reason.BAD_CHAT, "mixes plain text and chat-message fields", "prompt")
    if record["kind"] == "pair" and record["chosen"] == record["rejected"]:
        raise RowError(Reason.CHOSEN_EQUALS_REJECTED, "chosen and rejected are identical", "chosen")
    if tokenizer is not None and max_tokens is not None:
        check_tokens(record, fields, tokenizer, max_tokens)


def check_field(value: Any, field: str) -> str:
    """Validate one text field (string or chat-message list); returns 'text' or 'chat'."""
    if value is None:
        raise RowError(Reason.MISSING_FIELD, f"{field!r} is missing", field)
    if isinstance(value, str):
        check_text(value, field)
        return "text"
    if isinstance(value, list):
        check_messages(value, field)
        return "chat"
    raise RowError(
        Reason.NON_STRING_FIELD, f"{field!r} is {type(value).__name__}, expected text or messages", field
    )


def check_text(text: str, field: str) -> None:
    if not text.strip():
        raise RowError(Reason.EMPTY_FIELD, f"{field!r} is empty", field)
    if _SURROGATES.search(text):
        raise RowError(Reason.INVALID_UTF8, f"{field!r} holds bytes that are not valid UTF-8", field)
    match = _CONTROL.search(text)
    if match:
        raise RowError(
            Reason.CONTROL_CHARS,
            f"{field!r} holds control character U+{ord(match.group()):04X} at {match.start()}",
            field,
        )


def check_messages(messages: list, field: str) -> None:
    if not messages:
        raise RowError(Reason.BAD_CHAT, f"{field!r} is an empty message list", field)
    for turn, message in enumerate(messages):
        where = f"{field}[{turn}]"
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise RowError(Reason.BAD_CHAT, f"{where} is not a {{role, content}} message", field)
        if message["role"] not in CHAT_ROLES:
            raise RowError(Reason.BAD_CHAT, f"{where} has unknown role {message['role']!r}", field)
        content = message["content"]
        if not isinstance(content, str):
            raise RowError(Reason.BAD_CHAT, f"{where} content is {type(content).__name__}, not text", field)
        if not content.strip():
            raise RowError(Reason.BAD_CHAT, f"{where} is an empty turn", field)
        check_text(content, field)


def check_tokens(record: dict[str, Any], fields: tuple[str, ...], tokenizer: Any, max_tokens: int) -> None:
    for field in fields:
        n_tokens = len(tokenizer(as_text(record[field]), add_special_tokens=False)["input_ids"])
        if n_tokens > max_tokens:
            raise RowError(Reason.TOO_LONG_TOKENS, f"{field!r} has {n_tokens} tokens > {max_tokens}", field)


def as_text(value: Any) -> str:
    """Text as is; message lists as their JSON text (what length limits and hashes see)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def near_key_text(text: str) -> str:
    """Case, whitespace and punctuation folded away: 'The answer is 7.' == 'the answer is 7'."""
    return " ".join(_NOT_WORD.sub(" ", _MINUS.sub(" minus ", text.casefold())).split())


class DuplicateIndex:
    """Remembers content already seen; the first occurrence is kept, later ones are flagged."""

    def __init__(self) -> None:
        self.exact: dict[tuple, str] = {}
        self.near: dict[tuple, str] = {}

    def check(self, record: dict[str, Any], where: str) -> None:
        content = tuple(as_text(record.get(f)) for f in TEXT_FIELDS[record["kind"]])
        exact = (record["kind"], content, record.get("score"), record.get("label"))
        near = (
            record["kind"],
            tuple(near_key_text(c) for c in content),
            record.get("score"),
            record.get("label"),
        )
        if exact in self.exact:
            raise RowError(Reason.DUPLICATE_EXACT, f"same content as {self.exact[exact]}", "prompt")
        if near in self.near:
            raise RowError(
                Reason.DUPLICATE_NEAR,
                f"same text up to case/spacing/punctuation as {self.near[near]}",
                "prompt",
            )
        self.exact[exact] = where
        self.near[near] = where


def label_imbalance(labels: list[bool], max_fraction: float, min_rows: int = 20) -> str | None:
    """A warning when one unpaired (KTO) label dominates beyond ``max_fraction``."""
    if len(labels) < min_rows:
        return None
    value, count = Counter(labels).most_common(1)[0]
    fraction = count / len(labels)
    if fraction > max_fraction:
        return (
            f"{fraction:.1%} of {len(labels)} unpaired rows are labelled {value}; "
            f"above the {max_fraction:.0%} limit (KTO needs both desirable and undesirable examples)"
        )
    return None
