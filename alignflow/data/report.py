"""The validation report: a JSON document and a readable summary of the same facts."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from alignflow.data.issues import Issue

EXAMPLES_PER_REASON = 20


def build_report(
    *,
    inputs: list[dict[str, Any]],
    input_rows: int,
    kept: int,
    issues: list[Issue],
    warnings: list[dict[str, Any]],
    expectations: list[dict[str, Any]],
    kinds: Counter,
    max_bad_fraction: float,
    unreadable: list[str],
    truncated: list[str],
) -> dict[str, Any]:
    """Counts per reason with examples naming file, row and field; pass/fail against the threshold."""
    counts = Counter(str(i.code) for i in issues)
    examples: dict[str, list[dict[str, Any]]] = {}
    for issue in issues:
        bucket = examples.setdefault(str(issue.code), [])
        if len(bucket) < EXAMPLES_PER_REASON:
            bucket.append(issue.to_dict())
    bad_fraction = len(issues) / input_rows if input_rows else 1.0
    passed = input_rows > 0 and not unreadable and not truncated and bad_fraction <= max_bad_fraction
    return {
        "inputs": inputs,
        "input_rows": input_rows,
        "kept": kept,
        "quarantined": len(issues),
        "counts_add_up": kept + len(issues) == input_rows,
        "bad_fraction": round(bad_fraction, 6),
        "max_bad_fraction": max_bad_fraction,
        "passed": passed,
        "unreadable_files": unreadable,
        "truncated_files": truncated,
        "kinds": dict(sorted(kinds.items())),
        "counts_by_reason": dict(sorted(counts.items())),
        "examples": dict(sorted(examples.items())),
        "warnings": warnings,
        "expectations": expectations,
    }


ROW_LISTS = ("quarantined_rows",)  # long lists written one compact row per line


def write_report(report: dict[str, Any], path: str | Path) -> Path:
    """The report as indented JSON; row lists one object per line (greppable, and fast:
    indenting a million rows would take json's pure-Python encoder)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = {key: report[key] for key in ROW_LISTS if isinstance(report.get(key), list)}
    head = {key: value for key, value in report.items() if key not in rows}
    text = json.dumps(head, indent=2, sort_keys=True, ensure_ascii=True)
    opened = bool(head)  # whether ``text`` already holds an entry to continue after
    for key in sorted(rows):
        body = ",\n    ".join(_encode_row(row) for row in rows[key])
        listed = f"[\n    {body}\n  ]" if rows[key] else "[]"
        text = (text[:-2] + ",\n" if opened else "{\n") + f"  {json.dumps(key)}: {listed}\n}}"
        opened = True
    path.write_text(text, encoding="utf-8")
    return path


_encode = json.JSONEncoder(sort_keys=True, ensure_ascii=True).encode
_string = json.encoder.encode_basestring_ascii


def _encode_row(row: Issue | dict[str, Any]) -> str:
    """One row as compact JSON; an :class:`Issue` straight from its fields (``to_dict``'s keys)."""
    if not isinstance(row, Issue):
        return _encode(row)
    field = "null" if row.field is None else _string(row.field)
    number = "null" if row.row is None else str(int(row.row))
    return (
        f'{{"code": {_string(str(row.code))}, "field": {field}, "file": {_string(row.file)}, '
        f'"message": {_string(row.message)}, "row": {number}}}'
    )


def format_summary(report: dict[str, Any]) -> str:
    """Plain-text summary (the CLI renders the same facts with rich)."""
    verdict = "PASSED" if report["passed"] else "FAILED"
    lines = [
        f"validation {verdict}: {report['input_rows']} rows read, {report['kept']} kept, "
        f"{report['quarantined']} quarantined ({report['bad_fraction']:.2%}, limit "
        f"{report['max_bad_fraction']:.2%})",
        "kinds: " + ", ".join(f"{k}={v}" for k, v in report["kinds"].items()),
    ]
    for path in report["unreadable_files"]:
        lines.append(f"unreadable file: {path}")
    for path in report["truncated_files"]:
        lines.append(f"truncated file: {path}")
    for code, count in report["counts_by_reason"].items():
        lines.append(f"  {code}: {count}")
        for example in report["examples"][code]:
            where = example["file"] if example["row"] is None else f"{example['file']}:{example['row']}"
            field = f" [{example['field']}]" if example["field"] else ""
            lines.append(f"    {where}{field}: {example['message']}")
    for warning in report["warnings"]:
        lines.append(f"warning {warning['code']}: {warning['message']}")
    return "\n".join(lines)
