"""The bad-input corpus: each kind of bad row or file gets its own reason code, a message
naming file and row, and no input row goes missing (kept + quarantined == input rows)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from alignflow.data.config import DataConfig
from alignflow.data.validation import validate_paths

GOOD = {"prompt": "What is 1 plus 1?", "chosen": "The answer is 2.", "rejected": "I think 3"}


def good_rows(n: int = 5) -> list[dict]:
    return [{**GOOD, "prompt": f"What is {i} plus 1?"} for i in range(n)]


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def with_bad_row(bad: dict):
    """A JSONL file of good rows with one bad row at line 3."""

    def make(tmp: Path) -> tuple[Path, int | None]:
        rows = good_rows()
        rows.insert(2, bad)
        return jsonl(tmp / "in.jsonl", rows), 3

    return make


def raw_line(line: bytes):
    def make(tmp: Path) -> tuple[Path, int | None]:
        good = b"".join(json.dumps(r).encode() + b"\n" for r in good_rows())
        path = tmp / "in.jsonl"
        path.write_bytes(good + line + b"\n")
        return path, 6

    return make


def unbalanced_csv_quote(tmp: Path):
    """A CSV whose third row opens a quote it never closes."""
    lines = [f"{r['prompt']},{r['chosen']},{r['rejected']}\n" for r in good_rows()]
    lines.insert(2, 'p,"unclosed,r\n')
    path = tmp / "in.csv"
    path.write_text("prompt,chosen,rejected\n" + "".join(lines), encoding="utf-8")
    return path, 3


def truncated_gzip(tmp: Path):
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in good_rows(200)).encode())
    path = tmp / "in.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    return path, None


def corrupt_parquet(tmp: Path):
    path = tmp / "in.parquet"
    path.write_bytes(b"PAR1 this is not really parquet")
    return path, None


def empty_file(tmp: Path):
    path = tmp / "in.jsonl"
    path.write_text("", encoding="utf-8")
    return path, None


def duplicated(near: bool):
    def make(tmp: Path) -> tuple[Path, int | None]:
        rows = good_rows()
        copy = dict(rows[0])
        if near:
            copy["chosen"] = "the ANSWER is  2"
        rows.insert(2, copy)
        return jsonl(tmp / "in.jsonl", rows), 3

    return make


def leaked_split(tmp: Path):
    folder = tmp / "in"
    folder.mkdir()
    jsonl(folder / "train.jsonl", good_rows())
    jsonl(folder / "test.jsonl", [{**GOOD, "prompt": "What is 0 plus 1?", "chosen": "It is 2."}, {**GOOD}])
    return folder, 1


CASES = {
    "missing_field": with_bad_row({"prompt": "p", "chosen": "c"}),
    "empty_field": with_bad_row({**GOOD, "chosen": "   "}),
    "non_string_field": with_bad_row({**GOOD, "chosen": 42}),
    "chosen_equals_rejected": with_bad_row({**GOOD, "rejected": GOOD["chosen"]}),
    "score_out_of_range": with_bad_row({"prompt": "p", "response": "r", "score": 1.7}),
    "score_invalid": with_bad_row({"prompt": "p", "response": "r", "score": "high"}),
    "too_long_chars": with_bad_row({**GOOD, "chosen": "x" * 300}),
    "control_chars": with_bad_row({**GOOD, "chosen": "bell\x07 here"}),
    "invalid_utf8": raw_line(b'{"prompt": "p", "chosen": "caf\xe9", "rejected": "r"}'),
    "invalid_json": raw_line(b'{"prompt": "p", "chosen": '),
    "not_an_object": raw_line(b'["prompt", "chosen"]'),
    "malformed_csv": unbalanced_csv_quote,
    "unknown_shape": with_bad_row({"title": "q", "body": "a"}),
    "bad_chat_structure": with_bad_row(
        {
            "prompt": [{"role": "user", "content": "hi"}],
            "chosen": [{"role": "robot", "content": "x"}],
            "rejected": [{"role": "assistant", "content": ""}],
        }
    ),
    "hh_unsplittable": with_bad_row({"chosen": "\n\nHuman: a\n\nAssistant: b", "rejected": "no turns here"}),
    "bad_label": with_bad_row({"prompt": "p", "completion": "c", "label": "maybe"}),
    "duplicate_exact": duplicated(near=False),
    "duplicate_near": duplicated(near=True),
    "prompt_leakage": leaked_split,
    "file_truncated": truncated_gzip,
    "file_unreadable": corrupt_parquet,
    "file_empty": empty_file,
}


def test_corpus_has_at_least_fifteen_distinct_kinds():
    assert len(set(CASES)) >= 15


@pytest.mark.parametrize("code", sorted(CASES))
def test_each_bad_kind_is_quarantined_with_its_reason_file_and_row(tmp_path, code):
    path, row = CASES[code](tmp_path)
    validated = validate_paths(path, DataConfig(max_chars=200))
    report = validated.report
    matching = [i for i in validated.issues if i.code == code]
    assert matching, f"{code} not reported; got {report['counts_by_reason']}"
    issue = matching[0]
    assert Path(issue.file).name.startswith(("in", "test")) and str(tmp_path) in issue.file
    if row is not None:
        assert issue.row == row
        assert f":{row}" in issue.describe()
    assert report["counts_add_up"]
    assert report["kept"] + report["quarantined"] == report["input_rows"]
    assert report["counts_by_reason"][code] >= 1
    assert any(e["file"] == issue.file for e in report["examples"][code])


def test_missing_path_is_unreadable_not_a_traceback(tmp_path):
    validated = validate_paths(tmp_path / "nope.jsonl")
    assert [i.code for i in validated.issues] == ["file_not_found"]
    assert validated.report["unreadable_files"] == [str(tmp_path / "nope.jsonl")]


def test_bad_fraction_above_threshold_fails(tmp_path):
    rows = good_rows(18) + [{"prompt": "p", "chosen": "c"}] * 2  # 10% bad
    path = jsonl(tmp_path / "in.jsonl", rows)
    assert not validate_paths(path, DataConfig(max_bad_fraction=0.05)).passed
    assert validate_paths(path, DataConfig(max_bad_fraction=0.2)).passed


def test_label_imbalance_is_a_reported_warning(tmp_path):
    rows = [{"prompt": f"q{i}", "completion": f"a{i}", "label": i < 48} for i in range(50)]
    report = validate_paths(jsonl(tmp_path / "kto.jsonl", rows)).report
    assert [w["code"] for w in report["warnings"]] == ["label_imbalance"]
    balanced = [{**r, "label": i % 2 == 0} for i, r in enumerate(rows)]
    assert validate_paths(jsonl(tmp_path / "ok.jsonl", balanced)).report["warnings"] == []


def test_token_limit_applies_when_a_tokenizer_is_given(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    path = jsonl(tmp_path / "in.jsonl", good_rows(3) + [{**GOOD, "chosen": "plus " * 40}])
    validated = validate_paths(path, DataConfig(max_tokens=20), tokenizer=tokenizer)
    assert [(i.code, i.row) for i in validated.issues] == [("too_long_tokens", 4)]
