"""``alignflow data validate`` / ``add`` on a file with many bad rows: a short console, a full report.

The 335-row mixed file: 200 good pairs and 15 rows of each of nine kinds of bad row.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from typer.testing import CliRunner

from alignflow.cli import app

runner = CliRunner()
BAD_PER_REASON = 15
GOOD_ROWS = 200


def _bad_row(code: str, i: int) -> bytes:
    pair = {"prompt": f"Bad question {code} {i}?", "chosen": f"The answer is {i}.", "rejected": f"No {i}"}
    rows = {
        "missing_field": {"prompt": pair["prompt"], "chosen": pair["chosen"]},
        "empty_field": {**pair, "chosen": "   "},
        "non_string_field": {**pair, "chosen": i},
        "chosen_equals_rejected": {**pair, "rejected": pair["chosen"]},
        "score_out_of_range": {"prompt": pair["prompt"], "response": "r", "score": 1.5 + i},
        "control_chars": {**pair, "chosen": f"bell\x07 {i}"},
        "unknown_shape": {"title": pair["prompt"], "body": "a"},
        "duplicate_exact": {
            "prompt": "What is 0 plus 1?",
            "chosen": "The answer is 1.",
            "rejected": "I think 0",
        },
    }
    if code == "invalid_json":
        return b'{"prompt": "broken ' + str(i).encode() + b'", "chosen": '
    return json.dumps(rows[code]).encode()


REASONS = (
    "missing_field",
    "empty_field",
    "non_string_field",
    "chosen_equals_rejected",
    "score_out_of_range",
    "control_chars",
    "unknown_shape",
    "duplicate_exact",
    "invalid_json",
)


def mixed_file(path: Path) -> Path:
    """The 335-row mixed bad-input file (good and bad rows interleaved)."""
    good = [
        json.dumps(
            {
                "prompt": f"What is {i} plus 1?",
                "chosen": f"The answer is {i + 1}.",
                "rejected": f"I think {i}",
            }
        ).encode()
        for i in range(GOOD_ROWS)
    ]
    bad = [_bad_row(code, i) for i in range(BAD_PER_REASON) for code in REASONS]
    lines, step = [], GOOD_ROWS // len(bad) + 1
    for i, row in enumerate(good):
        lines.append(row)
        if i % step == 0 and bad:
            lines.append(bad.pop(0))
    lines += bad
    assert len(lines) == 335
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def example_lines(output: str) -> Counter:
    """Per reason, the lines that show one bad row (``code: file:row ...``)."""
    found: Counter = Counter()
    for line in output.splitlines():
        match = re.match(r"^([a-z_]+): (\S+):(\d+)", line)
        if match and match.group(1) in REASONS:
            found[match.group(1)] += 1
    return found


def test_validate_shows_counts_and_at_most_five_rows_per_reason_then_the_full_report(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = mixed_file(tmp_path / "mixed.jsonl")
    result = runner.invoke(app, ["data", "validate", str(source)])
    assert result.exit_code == 1, result.output
    output = result.output
    assert "335 rows read" in output
    shown = example_lines(output)
    assert set(shown) == set(REASONS), shown
    assert all(n <= 5 for n in shown.values()), shown
    for code in REASONS:
        assert re.search(rf"{code}\s+│\s+{BAD_PER_REASON}\b", output), f"count of {code}"
        assert f"{code}: … {BAD_PER_REASON - shown[code]} more" in output
    assert len(output.splitlines()) < 100, "a screenful, not a row per bad row"
    report = Path(re.search(r"full report: (\S+)", output.replace("\n", "")).group(1))
    assert report == (tmp_path / ".alignflow" / "reports" / "validate-report.json").resolve()
    rows = json.loads(report.read_text())["quarantined_rows"]
    assert len(rows) == len(REASONS) * BAD_PER_REASON
    assert Counter(r["code"] for r in rows) == {code: BAD_PER_REASON for code in REASONS}


def test_validate_writes_every_row_to_the_report_named_on_the_command_line(tmp_path):
    source = mixed_file(tmp_path / "mixed.jsonl")
    target = tmp_path / "out" / "report.json"
    result = runner.invoke(app, ["data", "validate", str(source), "--report", str(target)])
    assert result.exit_code == 1
    assert f"full report: {target.resolve()}" in result.output.replace("\n", "")
    assert len(json.loads(target.read_text())["quarantined_rows"]) == len(REASONS) * BAD_PER_REASON


def test_add_of_the_mixed_file_is_refused_with_the_same_short_listing(tmp_path):
    source = mixed_file(tmp_path / "mixed.jsonl")
    result = runner.invoke(app, ["data", "add", str(source), "--repo", str(tmp_path / "repo"), "--no-push"])
    assert result.exit_code == 1
    shown = example_lines(result.output)
    assert set(shown) == set(REASONS) and all(n <= 5 for n in shown.values()), shown
    assert "not versioned" in result.output
    assert "full report: " in result.output and "failed-report.json" in result.output.replace("\n", "")
