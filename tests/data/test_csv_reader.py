"""CSV quoting mistakes: a malformed record is set aside with its line, and the rows after it
are still read, never merged into one cell."""

from __future__ import annotations

import gzip

import pandas as pd

from alignflow.data.config import DataConfig
from alignflow.data.readers import header_delimiter, read_rows
from alignflow.data.validation import validate_paths

HEADER = "prompt,chosen,rejected\n"


def rows_of(n: int, start: int = 0) -> str:
    lines = (f"What is {i} plus 1?,The answer is {i + 1}.,I think {i}\n" for i in range(start, start + n))
    return "".join(lines)


def test_an_unterminated_quote_does_not_swallow_the_rest_of_the_file(tmp_path):
    path = tmp_path / "pairs.csv"
    broken = 'Open quote?,"never closed,no\n'
    path.write_text(HEADER + rows_of(2) + broken + rows_of(5, start=10), encoding="utf-8")
    validated = validate_paths(path, DataConfig(max_bad_fraction=1.0))
    assert validated.report["input_rows"] == 8
    kept = [e.record["prompt"] for e in validated.kept]
    assert kept == [f"What is {i} plus 1?" for i in [0, 1, 10, 11, 12, 13, 14]]
    [issue] = validated.issues
    assert (issue.code, issue.file, issue.row) == ("malformed_csv", str(path), 3)
    assert "line 4" in issue.message and "quote" in issue.message
    assert issue.original == 'Open quote?,"never closed,no'


def test_a_quote_closed_by_a_later_row_merges_nothing(tmp_path):
    """A lenient parse reads rows 2-3 as one cell ending at the next quote; strictly, it is an error."""
    path = tmp_path / "pairs.csv"
    text = HEADER + 'Q1,"stray,r1\nQ2,c2,r2\nQ3,"quoted, fine",r3\nQ4,c4,r4\n'
    path.write_text(text, encoding="utf-8")
    rows = list(read_rows(path))
    verdicts = [r.issue.code if r.issue else r.data["prompt"] for r in rows]
    assert verdicts == ["malformed_csv", "Q2", "Q3", "Q4"]
    assert rows[2].data["chosen"] == "quoted, fine"
    assert [r.row for r in rows] == [1, 2, 3, 4]


def test_quoted_cells_may_span_lines_and_hold_quotes(tmp_path):
    frame = pd.DataFrame(
        [
            {"prompt": "Line one\nline two", "chosen": 'She said "hi", then left.', "rejected": "no\r\nway"},
            {"prompt": "Plain", "chosen": "yes", "rejected": "no"},
        ]
    )
    frame.to_csv(tmp_path / "multi.csv", index=False)
    rows = list(read_rows(tmp_path / "multi.csv"))
    assert [r.issue for r in rows] == [None, None]
    assert [r.data for r in rows] == frame.to_dict("records")


def test_a_cell_beyond_the_csv_module_default_limit_is_judged_by_length_not_unreadable(tmp_path):
    path = tmp_path / "long.csv"
    path.write_text(HEADER + f'Long?,"{"x" * 200_000}",short\n' + rows_of(2), encoding="utf-8")
    validated = validate_paths(path, DataConfig(max_chars=1000, max_bad_fraction=1.0))
    assert [(i.code, i.row) for i in validated.issues] == [("too_long_chars", 1)]
    assert len(validated.kept) == 2


def test_a_malformed_header_makes_the_file_unreadable(tmp_path):
    path = tmp_path / "header.csv"
    path.write_text('prompt,"chosen\n' + rows_of(2), encoding="utf-8")
    validated = validate_paths(path, DataConfig(max_bad_fraction=1.0))
    [issue] = validated.issues
    assert issue.code == "file_unreadable" and "header" in issue.message


def test_tab_separated_files_read_by_suffix_with_the_same_checks(tmp_path):
    path = tmp_path / "pairs.tsv.gz"
    lines = [
        "prompt\tchosen\trejected",
        "Why, though?\tBecause, as said.\tNo",
        'Open\t"never closed\tx',
        "Q3\tc3\tr3",
    ]
    path.write_bytes(gzip.compress("\n".join(lines).encode() + b"\n"))
    rows = list(read_rows(path))
    assert rows[0].data == {"prompt": "Why, though?", "chosen": "Because, as said.", "rejected": "No"}
    assert rows[1].issue.code == "malformed_csv" and rows[2].data["prompt"] == "Q3"


def test_a_semicolon_separated_csv_from_excel_is_read(tmp_path):
    """Excel writes ';' where the comma is the decimal mark; before, the whole header was one
    column and every row an unknown shape."""
    path = tmp_path / "excel.csv"
    path.write_text('prompt;chosen;rejected\nWhy, then?;"Because; see";No\nQ2;c2;r2\n', encoding="utf-8")
    rows = list(read_rows(path))
    assert [r.data for r in rows] == [
        {"prompt": "Why, then?", "chosen": "Because; see", "rejected": "No"},
        {"prompt": "Q2", "chosen": "c2", "rejected": "r2"},
    ]
    assert header_delimiter("a,b;c\n") == "," and header_delimiter("a\tb\tc") == "\t"
