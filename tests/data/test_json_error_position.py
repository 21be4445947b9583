"""A JSONL line cut off mid-object is reported on its own line at the column where it stops,
as Python's parser reports the line on its own (not at column 1 of the next line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alignflow.data.readers import RawRow, TableBlock, read_items, read_rows

CUT = '{"prompt": "What is 1 plus 1?", "chosen": "The answer is 2.", "rejected": '


def _python_says(line: str) -> str:
    with pytest.raises(json.JSONDecodeError) as caught:
        json.loads(line)
    return f"invalid JSON: {caught.value.msg} at column {caught.value.colno}"


def _good(i: int) -> str:
    return json.dumps(
        {"prompt": f"What is {i} plus 1?", "chosen": f"The answer is {i + 1}.", "rejected": "No."}
    )


def _issues(items) -> list[tuple[int | None, str]]:
    """The rows with an issue, also those a bulk block keeps beside its table (``extra``)."""
    flat: list = []
    for item in items:
        flat.extend([item] if isinstance(item, RawRow) else getattr(item, "extra", []))
    rows = [row for row in flat if row.issue is not None]
    return [(row.row, row.issue.message) for row in rows]


@pytest.mark.parametrize("line_end", ["\n", "\r\n"])
def test_a_cut_off_line_is_reported_at_the_column_python_gives(tmp_path: Path, line_end: str):
    path = tmp_path / "cut.jsonl"
    path.write_bytes((_good(0) + line_end + CUT + line_end + _good(2) + line_end).encode())
    expected = _python_says(CUT)
    assert expected == "invalid JSON: Expecting value at column 75"
    assert _issues(read_rows(path)) == [(2, expected)]


def test_the_bulk_reader_reports_the_same_line_and_column(tmp_path: Path):
    lines = [_good(i) for i in range(200)]
    lines[120] = CUT
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    items = list(read_items(path))
    assert any(isinstance(item, TableBlock) for item in items), "read in bulk"
    assert _issues(items) == [(121, _python_says(CUT))]


def test_a_cut_off_last_line_without_a_newline(tmp_path: Path):
    path = tmp_path / "end.jsonl"
    path.write_text(_good(0) + "\n" + CUT.rstrip(), encoding="utf-8")
    assert _issues(read_rows(path)) == [(2, _python_says(CUT.rstrip()))]
