"""Bulk (column-wise, streaming) validation gives every row the old verdict.

The oracle is the frozen row-by-row implementation in ``reference_validation``. The
corpus holds every reason code a row or file can get; small blocks and batches make
duplicates cross block and batch boundaries, so the hash-only duplicate memory is used.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from alignflow.data import readers, validation
from alignflow.data.checks import SeenKeys, near_key_text
from alignflow.data.config import DataConfig
from alignflow.data.issues import Reason
from alignflow.data.validation import CLEAN_EXPECTATIONS, validate_paths
from tests.data import reference_validation as reference

# codes no input row can get: a dataset-level warning, and GX failures that always have a
# more specific code (the suite's every expectation maps to one)
NOT_ROW_CODES = {Reason.LABEL_IMBALANCE, Reason.EXPECTATION_FAILED, Reason.FILE_SKIPPED}
MAX_CHARS = 120


def pair(i: int, **changes) -> dict:
    return {
        "prompt": f"Question {i}: what is {i} plus 1?",
        "chosen": f"It is {i + 1}.",
        "rejected": f"No {i}",
    }


def bad_rows() -> list:
    """One or more rows for each row-level reason (dicts are JSON-encoded, bytes written raw)."""
    long = "x" * (MAX_CHARS + 5)
    chat = [{"role": "user", "content": "hi"}]
    return [
        {"prompt": "p", "chosen": "same", "rejected": "same"},  # chosen_equals_rejected
        {"prompt": "p", "chosen": "", "rejected": "r"},  # empty_field
        {"prompt": "p", "chosen": "\u3000\u2028 ", "rejected": "r"},  # empty (unicode spaces)
        {"prompt": "p", "chosen": "bell\x07", "rejected": "r"},  # control_chars
        {"prompt": "p", "chosen": "c1\x85", "rejected": "r"},  # control_chars (C1)
        {"prompt": "bad\x01", "chosen": "", "rejected": "r"},  # the first field's problem wins
        {"prompt": "p", "chosen": " \t ", "rejected": "x\x02"},  # empty before a later control
        {"prompt": "Ünï\x03code", "chosen": "c", "rejected": "r"},  # character index, not byte
        {"prompt": "p", "chosen": "same\x04", "rejected": "same\x04"},  # control before equality
        {"prompt": "p", "chosen": "ok", "rejected": None},  # missing_field
        {"prompt": "p", "chosen": 7, "rejected": "r"},  # non_string_field
        b'{"prompt": "p", "chosen": "caf\xe9", "rejected": "r"}',  # invalid_utf8 (raw byte)
        b'{"prompt": "p", "chosen": "\\ud800", "rejected": "r"}',  # invalid_utf8 (escape)
        b'{"prompt": "p", "chosen": ',  # invalid_json
        b'{"prompt": "p", "chosen": "a\tb", "rejected": "r"}',  # invalid_json (raw tab)
        b'{"prompt": "a", "chosen": "b", "rejected": "c"} {"prompt": "d"}',  # invalid_json (two)
        b'["prompt", "chosen"]',  # not_an_object
        b"   ",  # blank line: not a row
        {"title": "q", "body": "a"},  # unknown_shape
        {"prompt": chat, "chosen": [{"role": "robot", "content": "x"}], "rejected": chat},  # bad_chat
        {"prompt": "p", "chosen": chat, "rejected": "text"},  # bad_chat (mixed)
        {"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "no turns here"},  # hh_unsplittable
        {"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "\n\nHuman: a\n\nAssistant: c"},  # ok
        {"prompt": "p", "completion": "c", "label": "maybe"},  # bad_label
        {"prompt": "p", "response": "c", "score": "high"},  # score_invalid
        {"prompt": "p", "response": "c", "score": 1.5},  # score_out_of_range
        {"prompt": long, "response": "c", "score": 1.5},  # too long before score (GX order)
        {"prompt": "p", "chosen": long, "rejected": "r"},  # too_long_chars
        {"prompt": "p", "chosen": "c", "rejected": "r", "margin": "big"},  # score_invalid (margin)
        {"input": "mapped prompt", "output_1": "a", "output_2": "b", "label": 2},  # labelled, ok
        {"input": "another prompt", "output_1": "a", "output_2": "b", "label": "tie"},  # tie
        {"prompt": "p", "chosen": "c", "rejected": "r", "id": 5, "source": "s", "extra": [1]},
        {"prompt": "Straße -5!", "chosen": "Ünïcode", "rejected": "r"},  # non-ASCII near keys
        {"prompt": "STRASSE minus 5", "chosen": "ünïcode", "rejected": "R"},  # near dup of it
        {"prompt": "p", "completion": "c", "label": True},  # unpaired
        {"prompt": "only a prompt"},
    ]


def corpus_lines(seed: int = 0) -> list[bytes]:
    """Good pairs with bad rows sprinkled in, exact and near duplicates near and far."""
    rng = random.Random(seed)
    rows: list = [pair(i) for i in range(400)]
    for bad in bad_rows():
        rows.insert(rng.randrange(len(rows)), bad)
    for i in (3, 150, 390):  # exact duplicates, far from the original
        rows.insert(rng.randrange(len(rows)), pair(i))
    for i in (7, 200):  # near duplicates: case, spacing and punctuation changed
        near = {k: v.upper().replace(" ", "  ") + "!" for k, v in pair(i).items()}
        rows.insert(rng.randrange(len(rows)), near)
    rows.insert(10, {**pair(5), "prompt": "What is -3?"})
    rows.insert(300, {**pair(5), "prompt": "what is minus 3"})  # near dup through the minus rule
    return [r if isinstance(r, bytes) else json.dumps(r).encode() for r in rows]


def write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of a few KiB and batches of 100 rows: state must carry across both."""
    monkeypatch.setattr(readers, "BLOCK_BYTES", 8192)
    monkeypatch.setattr(validation, "BATCH_ROWS", 100)


def corpus(tmp: Path) -> list[Path]:
    main = write(tmp / "main.jsonl", corpus_lines())
    again = write(tmp / "again.jsonl", corpus_lines(1)[:80])  # duplicates across files
    data = gzip.compress(b"\n".join(corpus_lines(2)) + b"\n")
    truncated = tmp / "cut.jsonl.gz"
    truncated.write_bytes(data[: len(data) // 2])
    (tmp / "empty.jsonl").write_bytes(b"")
    (tmp / "broken.parquet").write_bytes(b"PAR1 not really")
    (tmp / "wide.csv").write_text('prompt,chosen,rejected\np,c,r,extra\nq,"c,r\nz,c,r\n', encoding="utf-8")
    splits = tmp / "splits"
    splits.mkdir()
    split_pair = lambda i, side: {**pair(i), "prompt": f"Split question {i}", "rejected": f"{side} {i}"}  # noqa: E731
    write(splits / "train.jsonl", [json.dumps(split_pair(i, "t")).encode() for i in range(60)])
    write(splits / "eval.jsonl", [json.dumps(split_pair(i, "e")).encode() for i in range(50, 120)])
    return [
        main,
        again,
        truncated,
        tmp / "empty.jsonl",
        tmp / "broken.parquet",
        tmp / "wide.csv",
        splits,
        tmp / "missing.jsonl",
    ]


def issue_rows(validated) -> list[tuple]:
    return [(str(i.code), i.file, i.row, i.field, i.message, i.original) for i in validated.issues]


def kept_rows(validated) -> list[tuple]:
    return [(json.dumps(e.record, sort_keys=True), e.file, e.row, e.split) for e in validated.kept]


def test_every_row_gets_the_old_verdict_code_and_message(tmp_path, small_blocks):
    paths = corpus(tmp_path)
    config = DataConfig(max_chars=MAX_CHARS, max_bad_fraction=1.0)
    old = reference.validate_paths(paths, config)
    new = validate_paths(paths, config)
    assert issue_rows(new) == issue_rows(old)
    assert kept_rows(new) == kept_rows(old)
    assert new.report == old.report
    codes = {i.code for i in old.issues}
    assert codes == set(Reason) - NOT_ROW_CODES - {Reason.TOO_LONG_TOKENS}, "corpus lacks a reason"


def test_streaming_keeps_no_rows_and_reports_the_same(tmp_path, small_blocks):
    paths = corpus(tmp_path)
    config = DataConfig(max_chars=MAX_CHARS, max_bad_fraction=1.0)
    old = reference.validate_paths(paths, config)
    new = validate_paths(paths, config, keep_records=False)
    assert new.kept == []
    assert new.report == old.report
    assert [row[:5] for row in issue_rows(new)] == [row[:5] for row in issue_rows(old)]


def test_bulk_path_really_reads_in_blocks(tmp_path, small_blocks):
    path = write(tmp_path / "main.jsonl", corpus_lines())
    items = list(readers.read_items(path))
    blocks = [item for item in items if isinstance(item, readers.TableBlock)]
    assert len(blocks) > 3
    assert any(b.extra for b in blocks), "odd lines ride along with their block"
    in_bulk = sum(len(b) for b in blocks)
    assert in_bulk > 0.5 * (in_bulk + len(items) - len(blocks))


def test_token_limit_row_by_row_matches(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    path = write(
        tmp_path / "in.jsonl",
        corpus_lines()[:120] + [json.dumps(pair(1) | {"chosen": "plus " * 40}).encode()],
    )
    config = DataConfig(max_tokens=20, max_chars=MAX_CHARS)
    old = reference.validate_paths(path, config, tokenizer=tokenizer)
    new = validate_paths(path, config, tokenizer=tokenizer)
    assert issue_rows(new) == issue_rows(old)
    assert Reason.TOO_LONG_TOKENS in {i.code for i in new.issues}


def test_clean_expectation_summary_is_what_great_expectations_reports(tmp_path):
    path = write(tmp_path / "ok.jsonl", [json.dumps(pair(i)).encode() for i in range(40)])
    old = reference.validate_paths(path, DataConfig())
    assert [(e["expectation"], e["column"]) for e in old.report["expectations"]] == CLEAN_EXPECTATIONS
    assert validate_paths(path, DataConfig()).report["expectations"] == old.report["expectations"]


def test_near_keys_in_bulk_match_the_python_rule():
    import pyarrow as pa

    from alignflow.data.checks import near_key_column

    texts = ["The answer is -7.", "a--1 b_c", "-1-2", "  Straße  ", "x -- -1", "ΣΊΣΥΦΟΣ", "", "__", "3-4"]
    assert near_key_column(pa.array(texts)).to_pylist() == [near_key_text(t) for t in texts]


def test_seen_keys_flags_later_copies_across_batches():
    import numpy as np

    seen = SeenKeys()
    near = np.array([1, 2, 1, 3], np.uint64)
    exact = np.array([10, 20, 11, 30], np.uint64)
    verdict, first = seen.check(near, exact, np.arange(4, dtype=np.int64))
    assert verdict.tolist() == [0, 0, 2, 0] and first[2] == 0
    verdict, first = seen.check(np.array([2, 4], np.uint64), np.array([20, 40], np.uint64), np.array([7, 8]))
    assert verdict.tolist() == [1, 0] and first[0] == 1
    assert len(seen) == 4


def test_streaming_memory_stays_below_the_file_size(tmp_path, monkeypatch):
    """keep_records=False holds one block and batch plus hashes, never the whole file."""
    import tracemalloc

    monkeypatch.setattr(readers, "BLOCK_BYTES", 64 << 10)
    monkeypatch.setattr(validation, "BATCH_ROWS", 200)
    rows = ({**pair(i), "chosen": f"It is {i + 1}, because {'reasons ' * 125}"} for i in range(20_000))
    path = write(tmp_path / "big.jsonl", [json.dumps(row).encode() for row in rows])
    size = path.stat().st_size
    tracemalloc.start()
    try:
        validated = validate_paths(path, DataConfig(), keep_records=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert validated.report["input_rows"] == 20_000 and validated.report["kept"] == 20_000
    assert peak < size / 4, f"peak {peak} bytes for a {size}-byte file"
