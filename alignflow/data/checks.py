"""Row checks that great-expectations does not express well, each with its own reason code.

Checks run on canonical records (see :mod:`alignflow.data.normalize`). Each returns the
first problem found as a :class:`RowError`-like tuple so one row carries one reason.
Cross-row checks (duplicates, leakage, label balance) keep state in small helpers.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any, overload

import numpy as np

from alignflow.data.issues import Reason
from alignflow.data.normalize import RowError

TEXT_FIELDS = {
    "pair": ("prompt", "chosen", "rejected"),
    "scored": ("prompt", "completion"),
    "unpaired": ("prompt", "completion"),
    "prompt": ("prompt",),
    "ranked": ("prompt",),  # and each of its responses, see response_fields
}
CHAT_ROLES = {"system", "user", "assistant", "tool"}
# the file:row a record came from, set on the copies handed to a data check (never stored)
RECORD_WHERE = "_where"
_SURROGATES = re.compile("[\ud800-\udfff]")
# C0 controls except tab/newline/carriage return, DEL and C1 controls
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_NOT_WORD = re.compile(r"[\W_]+")
_MINUS = re.compile(r"(?<!\w)-(?=\d)")


def check_record(
    record: Mapping[str, Any],
    tokenizer: Any = None,
    max_tokens: int | None = None,
    max_chars: int | None = None,
) -> None:
    """Raise RowError for the first problem in one canonical record.

    ``max_chars`` bounds a ranked row's responses (great-expectations bounds the other fields).
    """
    fields = TEXT_FIELDS[record["kind"]]
    shapes = {f: check_field(record.get(f), f) for f in fields}
    if record["kind"] == "ranked":
        shapes |= check_responses(record["responses"], max_chars)
    if len(set(shapes.values())) > 1:
        raise RowError(Reason.BAD_CHAT, "mixes plain text and chat-message fields", "prompt")
    if record["kind"] == "pair" and record["chosen"] == record["rejected"]:
        raise RowError(Reason.CHOSEN_EQUALS_REJECTED, "chosen and rejected are identical", "chosen")
    if record["kind"] == "ranked" and not _ranks_two_texts(record["responses"], record["scores"]):
        message = "every response is identical to each one ranked differently: no preference between texts"
        raise RowError(Reason.CHOSEN_EQUALS_REJECTED, message, "responses")
    if tokenizer is not None and max_tokens is not None:
        check_tokens(record, fields, tokenizer, max_tokens)
        if record["kind"] == "ranked":
            check_response_tokens(record["responses"], tokenizer, max_tokens)


def check_responses(responses: list, max_chars: int | None) -> dict[str, str]:
    """Each response of a ranked row, checked as a field of its own; their shapes by place."""
    shapes = {}
    for i, response in enumerate(responses):
        where = f"responses[{i}]"
        try:
            shapes[where] = check_field(response, where)
        except RowError as error:
            raise RowError(error.code, str(error), "responses") from None
        if max_chars is not None and len(as_text(response)) > max_chars:
            message = f"{where} has {len(as_text(response))} characters > {max_chars}"
            raise RowError(Reason.TOO_LONG_CHARS, message, "responses")
    return shapes


def _ranks_two_texts(responses: list, scores: list[float]) -> bool:
    """Whether two different texts have different scores (so the row forms at least one pair)."""
    texts = [as_text(r) for r in responses]
    return any(
        scores[i] != scores[j] and texts[i] != texts[j]
        for i in range(len(texts))
        for j in range(i + 1, len(texts))
    )


def check_response_tokens(responses: list, tokenizer: Any, max_tokens: int) -> None:
    for i, response in enumerate(responses):
        n_tokens = len(tokenizer(as_text(response), add_special_tokens=False)["input_ids"])
        if n_tokens > max_tokens:
            message = f"responses[{i}] has {n_tokens} tokens > {max_tokens}"
            raise RowError(Reason.TOO_LONG_TOKENS, message, "responses")


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
    if all(isinstance(m, str) or (isinstance(m, dict) and "role" not in m) for m in messages):
        message = (
            f"{field!r} is a list of {len(messages)} turns without roles, not {{role, content}} messages "
            "(MT-bench/Arena-hard style: map one turn, e.g. data.column_mapping.turns.0=prompt, "
            "or turns.0.content=prompt)"
        )
        raise RowError(Reason.BAD_CHAT, message, field)
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


def check_tokens(record: Mapping[str, Any], fields: tuple[str, ...], tokenizer: Any, max_tokens: int) -> None:
    for field in fields:
        n_tokens = len(tokenizer(as_text(record[field]), add_special_tokens=False)["input_ids"])
        if n_tokens > max_tokens:
            raise RowError(Reason.TOO_LONG_TOKENS, f"{field!r} has {n_tokens} tokens > {max_tokens}", field)


@overload
def as_text(value: None) -> None: ...
@overload
def as_text(value: str | list[Any] | dict[str, Any]) -> str: ...
@overload
def as_text(value: object) -> str | None: ...
def as_text(value: Any) -> str | None:
    """Text as is; message lists as their JSON text (what length limits and hashes see)."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def near_key_text(text: str) -> str:
    """Case, whitespace and punctuation folded away: 'The answer is 7.' == 'the answer is 7'."""
    return " ".join(_NOT_WORD.sub(" ", _MINUS.sub(" minus ", text.casefold())).split())


# --- the same checks over whole columns (pyarrow kernels), for the bulk path -------------
# Python's str.strip() whitespace, spelled out for RE2 so "empty after strip" is exact
_SPACE_CLASS = "".join(f"\\x{{{ord(c):x}}}" for c in map(chr, range(0x10000)) if c.isspace())
_BLANK_RE = f"^[{_SPACE_CLASS}]*$"
_CONTROL_RE = r"[\x{0}-\x{8}\x{b}\x{c}\x{e}-\x{1f}\x{7f}-\x{9f}]"
KEY_SEPARATOR = "\x1f"  # a control character, so never inside a text that passed the checks


_MINUS_WORD = np.frombuffer(b" minus ", np.uint8)
_GROW = len(_MINUS_WORD) - 1


def _utf8(values) -> tuple[np.ndarray, np.ndarray]:
    """The UTF-8 bytes of a pyarrow string array and each row's start (row i: rel[i]..rel[i+1])."""
    import pyarrow as pa

    if pa.types.is_large_string(values.type):
        values = values.cast(pa.string())
    _, offsets, data = values.buffers()
    offsets = np.frombuffer(offsets, np.int32)[values.offset : values.offset + len(values) + 1]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return data[offsets[0] : offsets[-1]], (offsets - offsets[0]).astype(np.int64)


def _rows_of(positions: np.ndarray, rel: np.ndarray) -> np.ndarray:
    return np.searchsorted(rel, positions, side="right") - 1


def _non_ascii_rows(values) -> np.ndarray:
    import pyarrow.compute as pc

    ascii_ = pc.fill_null(pc.string_is_ascii(values), True)
    return np.flatnonzero(~np.asarray(ascii_.to_numpy(zero_copy_only=False), bool))


def text_problems(values) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a pyarrow string column :func:`check_text` refuses: (empty or null, control chars).

    ASCII rows by byte comparisons; rows with other characters by RE2 classes spelled out
    from Python's own definitions, so the verdict is exactly check_text's.
    """
    import pyarrow.compute as pc

    data, rel = _utf8(values)
    n = len(rel) - 1
    # a row can only be blank when it is empty or starts with (Python's ASCII) whitespace
    blank = np.zeros(n, bool)
    lengths = np.diff(rel)
    first = data[np.minimum(rel[:-1], max(len(data) - 1, 0))] if len(data) else np.zeros(n, np.uint8)
    maybe = (lengths == 0) | (first == 32) | ((first >= 9) & (first <= 13)) | ((first >= 28) & (first <= 31))
    maybe_rows = np.flatnonzero(maybe)
    if len(maybe_rows):
        subset = values.take(maybe_rows)
        blank[maybe_rows] = np.asarray(pc.match_substring_regex(subset, _BLANK_RE).to_numpy(False), bool)
    control = np.zeros(n, bool)
    is_control = ((data < 32) & (data != 9) & (data != 10) & (data != 13)) | (data == 127)
    control[_rows_of(np.flatnonzero(is_control), rel)] = True
    other = _non_ascii_rows(values)
    if len(other):
        subset = values.take(other)
        blank[other] = np.asarray(pc.match_substring_regex(subset, _BLANK_RE).to_numpy(False), bool)
        control[other] = np.asarray(pc.match_substring_regex(subset, _CONTROL_RE).to_numpy(False), bool)
    if values.null_count:
        blank |= np.asarray(values.is_null().to_numpy(zero_copy_only=False), bool)
    return blank, control & ~blank


def control_messages(values, rows: np.ndarray, field: str) -> list[str]:
    """check_text's control-character message for ``rows`` of a column (each holds one).

    ASCII rows from the bytes (byte offset == character index); others via check_text.
    """
    data, rel = _utf8(values)
    is_control = ((data < 32) & (data != 9) & (data != 10) & (data != 13)) | (data == 127)
    where = np.flatnonzero(is_control)
    owners, first = np.unique(_rows_of(where, rel), return_index=True)
    non_ascii = set(_non_ascii_rows(values.take(rows)).tolist())
    messages = []
    for i, row in enumerate(rows.tolist()):
        if i in non_ascii:
            messages.append(str(text_error(values[row].as_py(), field)))
            continue
        at = int(where[first[np.searchsorted(owners, row)]])
        messages.append(f"{field!r} holds control character U+{int(data[at]):04X} at {at - int(rel[row])}")
    return messages


def text_error(text: str, field: str) -> RowError:
    """The error :func:`check_text` raises for a text the bulk check flagged."""
    try:
        check_text(text, field)
    except RowError as error:
        return error
    raise AssertionError(f"{field!r} was flagged in bulk but passes check_text")


def near_key_column(values):
    """:func:`near_key_text` of a pyarrow string column (no nulls), as a pyarrow string array.

    ASCII rows in numpy (lower case, the minus rule, non-alphanumerics to one space, trim);
    rows with other characters through the Python function itself.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    data, rel = _utf8(values)
    n = len(rel) - 1
    upper = (data >= 65) & (data <= 90)
    low = data | (upper.view(np.uint8) << 5)
    alnum = ((low >= 97) & (low <= 122)) | ((data >= 48) & (data <= 57))
    out = np.where(alnum, low, np.uint8(32))
    dashes = np.flatnonzero(data == 45)
    if len(dashes):  # "-5" after a non-word character (or at the start) reads " minus 5"
        row = _rows_of(dashes, rel)
        after = data[np.minimum(dashes + 1, len(data) - 1)]
        before = np.maximum(dashes - 1, 0)
        word_before = (alnum[before] | (data[before] == 95)) & (dashes != rel[row])
        digit_after = (after >= 48) & (after <= 57) & (dashes + 1 != rel[row + 1])
        minus = dashes[digit_after & ~word_before]
        if len(minus):
            counts = np.ones(len(out), np.int64)
            counts[minus] = len(_MINUS_WORD)
            out = np.repeat(out, counts)
            at = minus + _GROW * np.arange(len(minus))
            out[at[:, None] + np.arange(len(_MINUS_WORD))] = _MINUS_WORD
            rel = rel + _GROW * np.searchsorted(minus, rel)
    offsets = rel.astype(np.int32)
    folded = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(out.tobytes()))
    # runs of spaces to one, then trim: C kernels, a few passes (runs are short)
    while True:
        doubled = pc.match_substring(folded, "  ")
        if not pc.any(doubled).as_py():
            break
        folded = pc.replace_substring(folded, "  ", " ")
    folded = pc.utf8_trim(folded, " ")
    other = _non_ascii_rows(values)
    if len(other):
        mask = np.zeros(n, bool)
        mask[other] = True
        python = pa.array([near_key_text(text) for text in values.take(other).to_pylist()], pa.string())
        folded = pc.replace_with_mask(folded, pa.array(mask), python)
    return folded


def hashable(key: str) -> str:
    """A key that encodes as UTF-8: lone surrogates (only possible off the checked fields) as hex."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "\x00" + key.encode("utf-8", "surrogatepass").hex()
    return key


def record_keys(record: dict[str, Any]) -> tuple[str, str]:
    """Exact and near duplicate keys of one record, as single strings.

    The old tuple ``(kind, texts, score, label)`` joined with a separator no checked text
    holds; ``score + 0.0`` so -0.0 and 0.0 stay one key, as they compare equal.
    """
    kind = record["kind"]
    content = [as_text(record[f]) for f in TEXT_FIELDS[kind]]  # check_record has seen them set
    content += [as_text(r) for r in record.get("responses") or ()]
    score = record.get("score") if kind != "ranked" else tuple(x + 0.0 for x in record["scores"])
    tag = f"{kind}|{score + 0.0 if isinstance(score, float) else score!r}|{record.get('label')!r}"
    exact = KEY_SEPARATOR.join([*content, tag])
    near = KEY_SEPARATOR.join([*(near_key_text(c) for c in content), tag])
    return hashable(exact), hashable(near)


def pair_tag() -> str:
    """The tag :func:`record_keys` gives a text pair (no score, no label)."""
    return "pair|None|None"


def hash_keys(keys: np.ndarray) -> np.ndarray:
    """64-bit hashes of key strings, in bulk (pandas' siphash)."""
    import pandas as pd

    if len(keys) == 0:
        return np.zeros(0, np.uint64)
    return pd.util.hash_array(np.asarray(keys, dtype=object), categorize=False)


class SeenKeys:
    """Near-duplicate keys seen so far, kept as hashes only, so memory grows by 24 bytes a row.

    Each entry: the near key's hash, the exact key's hash and where the first copy was.
    Sorted runs merged as they grow (log-structured), so a lookup is a few binary searches.
    The first occurrence is kept; a later row with the same near key is an exact duplicate
    when its exact key matches that first row's, else a near one. (Two rows with one exact
    key share their near key, so this is the old two-dictionary rule.)
    """

    def __init__(self) -> None:
        self.runs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def __len__(self) -> int:
        return sum(len(run[0]) for run in self.runs)

    def lookup(self, near: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        found = np.zeros(len(near), bool)
        exact = np.zeros(len(near), np.uint64)
        where = np.zeros(len(near), np.int64)
        order = np.argsort(near)  # sorted needles walk each run forwards: cache-friendly
        needles = near[order]
        for keys, exacts, wheres in self.runs:
            at = np.minimum(np.searchsorted(keys, needles), len(keys) - 1)
            hit = keys[at] == needles
            found[order[hit]] = True
            exact[order[hit]], where[order[hit]] = exacts[at[hit]], wheres[at[hit]]
        return found, exact, where

    def add(self, near: np.ndarray, exact: np.ndarray, where: np.ndarray) -> None:
        if len(near) == 0:
            return
        order = np.argsort(near, kind="stable")
        self.runs.append((near[order], exact[order], where[order]))
        while len(self.runs) > 1 and len(self.runs[-2][0]) <= 2 * len(self.runs[-1][0]):
            last, before = self.runs.pop(), self.runs.pop()
            merged = [np.concatenate((a, b)) for a, b in zip(before, last, strict=True)]
            keys, exacts, wheres = merged
            order = np.argsort(keys, kind="stable")
            self.runs.append((keys[order], exacts[order], wheres[order]))

    def check(self, near: np.ndarray, exact: np.ndarray, where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row, in order: 0 first copy (remembered now), 1 exact or 2 near duplicate.

        Also returns where each duplicate's first copy was.
        """
        found, first_exact, first_where = self.lookup(near)
        verdict = np.zeros(len(near), np.int8)
        new = np.flatnonzero(~found)
        if len(new):
            _, first, inverse = np.unique(near[new], return_index=True, return_inverse=True)
            owner = new[first[inverse]]  # the earliest row of this batch with the same near key
            repeat = owner != new
            found[new[repeat]] = True
            first_exact[new[repeat]] = exact[owner[repeat]]
            first_where[new[repeat]] = where[owner[repeat]]
            keep = new[~repeat]
            self.add(near[keep], exact[keep], where[keep])
        verdict[found] = np.where(first_exact[found] == exact[found], 1, 2)
        return verdict, first_where


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
