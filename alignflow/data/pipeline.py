"""``add_dataset``: validate -> normalise -> split -> write snapshot -> dvc add -> push -> version.

This is the entry point the pipeline wraps as a task. It returns a small
:class:`DatasetVersion` (version md5, paths, counts), never the rows.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from alignflow.data import versioning
from alignflow.data.config import DataConfig
from alignflow.data.report import write_report
from alignflow.data.snapshot import MANIFEST, read_manifest, write_manifest, write_quarantine, write_split
from alignflow.data.split import split_records
from alignflow.data.validation import Validated, ValidationResult, quarantine_rows, summarize, validate_paths

HISTORY = Path(".alignflow") / "data-history.jsonl"
REPORT = "report.json"


class DatasetVersion(BaseModel):
    """What ``data add`` produced: the data version and where its pieces are."""

    version: str
    data_dir: str
    dvc_file: str
    manifest_path: str
    report_path: str
    counts: dict[str, int]
    validation: ValidationResult


class DataValidationFailed(RuntimeError):
    """Validation failed, so nothing was versioned; ``result`` holds the counts and report path."""

    def __init__(self, result: ValidationResult):
        super().__init__(result.summary)
        self.result = result


def _relative(path: str, repo_dir: Path) -> str:
    """Paths inside the repo are stored relative to it, so the manifest (and md5) do not move."""
    try:
        return str(Path(path).resolve().relative_to(repo_dir))
    except ValueError:
        return path


def build_manifest(
    validated: Validated, splits: dict[str, list[dict[str, Any]]], config: DataConfig, repo_dir: Path
) -> dict[str, Any]:
    """Sources + hashes, counts per split/kind/reason, the validation summary and the sum check."""
    report = validated.report
    counts = {name: len(rows) for name, rows in splits.items()}
    counts["quarantine"] = len(validated.issues)
    return {
        "format_version": 1,
        "sources": [{**item, "path": _relative(item["path"], repo_dir)} for item in report["inputs"]],
        "input_rows": report["input_rows"],
        "counts": counts,
        "counts_add_up": sum(counts.values()) == report["input_rows"],
        "kinds": {
            name: dict(sorted(Counter(str(r["kind"]) for r in rows).items())) for name, rows in splits.items()
        },
        "quarantine_by_reason": report["counts_by_reason"],
        "split": {
            "method": "prompt_sha256",
            "eval_fraction": config.eval_fraction,
            "seed": config.split_seed,
        },
        "validation": {
            k: report[k] for k in ("passed", "bad_fraction", "max_bad_fraction", "warnings", "expectations")
        },
    }


def write_snapshot(
    validated: Validated, config: DataConfig, data_dir: Path, repo_dir: Path
) -> dict[str, Any]:
    """Replace ``data_dir`` with train/eval/quarantine Parquet, the report and the manifest."""
    records = [entry.record for entry in validated.kept]
    splits = split_records(
        records, config.eval_fraction, config.split_seed, [e.split for e in validated.kept]
    )
    if data_dir.exists():
        shutil.rmtree(data_dir)
    for name, rows in splits.items():
        write_split(data_dir, name, rows)
    write_quarantine(data_dir, quarantine_rows(validated.issues))
    report = {
        **validated.report,
        "inputs": [{**i, "path": _relative(i["path"], repo_dir)} for i in validated.report["inputs"]],
    }
    for section in report["examples"].values():
        for example in section:
            example["file"] = _relative(example["file"], repo_dir)
    write_report(report, data_dir / REPORT)
    manifest = build_manifest(validated, splits, config, repo_dir)
    if not manifest["counts_add_up"]:
        raise AssertionError(
            f"snapshot counts {manifest['counts']} do not add up to {manifest['input_rows']}"
        )
    write_manifest(data_dir, manifest)
    return manifest


def add_dataset(
    paths: str | Path | list[str | Path],
    config: DataConfig | None = None,
    repo_dir: str | Path = ".",
    fmt: str | None = None,
    push: bool = True,
) -> DatasetVersion:
    """Validate the input and, when it passes, write, track and push a new data version."""
    config = config or DataConfig()
    repo_dir = Path(repo_dir).resolve()
    validated = validate_paths(paths, config, fmt)
    if not validated.passed:
        report_path = write_report(
            validated.report, repo_dir / ".alignflow" / "reports" / "failed-report.json"
        )
        raise DataValidationFailed(summarize(validated, report_path))
    versioning.ensure_repo(repo_dir, config.remote)
    data_dir = repo_dir / config.data_dir
    manifest = write_snapshot(validated, config, data_dir, repo_dir)
    version = versioning.track(repo_dir, config.data_dir)
    if push:
        versioning.push(repo_dir, config.data_dir)
    result = DatasetVersion(
        version=version,
        data_dir=str(data_dir),
        dvc_file=str(versioning.dvc_file(repo_dir, config.data_dir)),
        manifest_path=str(data_dir / MANIFEST),
        report_path=str(data_dir / REPORT),
        counts=manifest["counts"],
        validation=summarize(validated, data_dir / REPORT),
    )
    _append_history(repo_dir, result, manifest)
    return result


def _append_history(repo_dir: Path, result: DatasetVersion, manifest: dict[str, Any]) -> None:
    entry = {
        "version": result.version,
        "added_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "sources": [s["path"] for s in manifest["sources"]],
        "counts": result.counts,
    }
    path = repo_dir / HISTORY
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, sort_keys=True) + "\n")


def dataset_status(repo_dir: str | Path = ".", data_dir: str = "data") -> dict[str, Any]:
    """Current version (from data.dvc), the snapshot's manifest when present, and the add history."""
    repo_dir = Path(repo_dir).resolve()
    snapshot = repo_dir / data_dir
    history_path = repo_dir / HISTORY
    history = (
        [json.loads(line) for line in history_path.read_text(encoding="utf-8").splitlines() if line]
        if history_path.exists()
        else []
    )
    return {
        "version": versioning.current_version(repo_dir, data_dir),
        "data_dir": str(snapshot),
        "manifest": read_manifest(snapshot) if (snapshot / MANIFEST).exists() else None,
        "history": history,
    }
