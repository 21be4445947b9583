"""``add_dataset``: validate -> normalise -> split -> write snapshot -> dvc add -> push -> version.

This is the entry point the pipeline wraps as a task. It returns a small
:class:`DatasetVersion` (version md5, paths, counts), never the rows. Adding the same
inputs under the same data config again reuses the tracked snapshot instead of
re-validating it (the way DVC skips an unchanged stage), as long as the snapshot on disk
is the one that was tracked. The checks that depend on more than the input (the labels
against the champion reward model, the training rows against the pinned set) run on a
reused snapshot too: a version made by ``data add`` is checked when ``run`` trains on it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from alignflow.code_version import source_digest
from alignflow.data import versioning
from alignflow.data.checks import RECORD_WHERE as WHERE
from alignflow.data.config import DataConfig
from alignflow.data.report import write_report
from alignflow.data.snapshot import (
    MANIFEST,
    load_split,
    read_manifest,
    split_path,
    write_manifest,
    write_quarantine,
    write_split,
)
from alignflow.data.split import split_records
from alignflow.data.validation import (
    Validated,
    ValidationResult,
    describe_inputs,
    file_sha256,
    quarantine_rows,
    summarize,
    summarize_report,
    validate_paths,
)
from alignflow.errors import CannotJudge, InputError

HISTORY = Path(".alignflow") / "data-history.jsonl"
REPORT = "report.json"
ACCEPTED_UNJUDGED = "accepted_unjudged"  # manifest key: why data no judge could judge was versioned


class DatasetVersion(BaseModel):
    """What ``data add`` produced: the data version and where its pieces are."""

    version: str
    data_dir: str
    dvc_file: str
    manifest_path: str
    report_path: str
    counts: dict[str, int]
    validation: ValidationResult
    reused: bool = False
    # the reason given for versioning pairs no judge could judge (``--accept-unjudged``)
    accepted_unjudged: str | None = None


class DataValidationFailed(InputError, RuntimeError):
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
    validated: Validated,
    config: DataConfig,
    data_dir: Path,
    repo_dir: Path,
    accepted: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Replace ``data_dir`` with train/eval/quarantine Parquet, the report and the manifest
    (with ``accepted``: the reason unjudged pairs were accepted, and what was left unjudged)."""
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
    if accepted is not None:
        manifest[ACCEPTED_UNJUDGED] = accepted
    if not manifest["counts_add_up"]:
        raise AssertionError(
            f"snapshot counts {manifest['counts']} do not add up to {manifest['input_rows']}"
        )
    write_manifest(data_dir, manifest)
    return manifest


# a training row for ``check_training``: the file and row it came from, and its record
TrainingRow = tuple[str, int | None, dict[str, Any]]


def training_rows(validated: Validated, config: DataConfig) -> list[TrainingRow]:
    """The kept rows the split will put in train, with the file and row each came from."""
    kept = validated.kept
    keys = [{"prompt": entry.record["prompt"], "index": i} for i, entry in enumerate(kept)]
    splits = split_records(keys, config.eval_fraction, config.split_seed, [e.split for e in kept])
    return [(kept[k["index"]].file, kept[k["index"]].row, kept[k["index"]].record) for k in splits["train"]]


def _check_reused(
    version: DatasetVersion,
    check_labels: Callable[[list[dict[str, Any]]], None] | None,
    check_training: Callable[[list[TrainingRow]], None] | None,
) -> None:
    """The same checks on a reused snapshot as on a new one: reuse must not skip them. Pairs no
    judge can judge pass only where the version records why they were accepted."""
    train = load_split(version.data_dir, "train")
    if check_training is not None:
        where = str(split_path(version.data_dir, "train"))
        check_training([(where, i, record) for i, record in enumerate(train)])
    if check_labels is not None:
        located = [
            {**record, WHERE: f"{split_path(version.data_dir, split)}:{i}"}
            for split in ("train", "eval")
            for i, record in enumerate(train if split == "train" else load_split(version.data_dir, split))
        ]
        _check_labels(check_labels, located, version.accepted_unjudged)


def _check_labels(
    check_labels: Callable[[list[dict[str, Any]]], None], records: list[dict[str, Any]], accept: str | None
) -> dict[str, Any] | None:
    """Run the label check; pairs it cannot judge pass only with a reason to accept them, and
    then what was accepted comes back (for the manifest)."""
    try:
        check_labels(records)
    except CannotJudge as exc:
        if not accept:
            raise
        return {"reason": accept, "unjudged": exc.summary}
    return None


def _accepted_reason(data_dir: str | Path) -> str | None:
    """The reason recorded on a snapshot for versioning pairs no judge could judge, if any."""
    try:
        accepted = read_manifest(data_dir).get(ACCEPTED_UNJUDGED)
    except (OSError, ValueError):
        return None
    return accepted.get("reason") if isinstance(accepted, dict) else None


def add_dataset(
    paths: str | Path | list[str | Path],
    config: DataConfig | None = None,
    repo_dir: str | Path = ".",
    fmt: str | None = None,
    push: bool = True,
    reuse: bool = True,
    check_labels: Callable[[list[dict[str, Any]]], None] | None = None,
    check_training: Callable[[list[TrainingRow]], None] | None = None,
    accept_unjudged: str | None = None,
) -> DatasetVersion:
    """Validate the input and, when it passes, write, track and push a new data version.

    With ``reuse`` (the default) an input already turned into the tracked snapshot is not
    validated again: the existing version comes back with ``reused=True``.
    ``check_labels`` sees the validated records, ``check_training`` the rows bound for the
    train split, before anything is written (and a reused snapshot's rows as well); either
    may raise to stop (the poisoned-data check, :mod:`alignflow.evaluation.label_check`;
    the pinned-set check, :mod:`alignflow.evaluation.contamination`). Where the label check
    cannot judge some pairs (:class:`~alignflow.errors.CannotJudge`), ``accept_unjudged`` (a
    reason) versions them anyway and records the reason in the manifest (so in the data
    version); a reused version passes on the reason it records.
    """
    config = config or DataConfig()
    repo_dir = Path(repo_dir).resolve()
    fingerprint = input_fingerprint(paths, config, fmt)
    current = _tracked_version(fingerprint, config, repo_dir) if reuse else None
    # a new reason to accept unjudged pairs makes a new version (the reason is part of it)
    if current is not None and accept_unjudged in (None, current.accepted_unjudged):
        _check_reused(current, check_labels, check_training)
        return current
    validated = validate_paths(paths, config, fmt)
    if not validated.passed:
        report_path = write_report(
            validated.report, repo_dir / ".alignflow" / "reports" / "failed-report.json"
        )
        raise DataValidationFailed(summarize(validated, report_path))
    if check_training is not None:
        check_training(training_rows(validated, config))
    accepted = None
    if check_labels is not None:
        located = [
            {**e.record, WHERE: e.file if e.row is None else f"{e.file}:{e.row}"} for e in validated.kept
        ]
        accepted = _check_labels(check_labels, located, accept_unjudged)
    versioning.ensure_repo(repo_dir, config.remote)
    data_dir = repo_dir / config.data_dir
    manifest = write_snapshot(validated, config, data_dir, repo_dir, accepted)
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
        accepted_unjudged=None if accepted is None else accepted["reason"],
    )
    _append_history(repo_dir, result, manifest, config.data_dir, fingerprint)
    return result


@cache
def _rules_version() -> str:
    """A hash of this package's source: the validation rules an input was checked against."""
    return source_digest(Path(__file__).parent)


def input_fingerprint(
    paths: str | Path | list[str | Path], config: DataConfig, fmt: str | None = None
) -> str:
    """What a snapshot is a function of: the input files' bytes, the data config and the rules."""
    # absolute paths: the same file named from another working directory is the same input
    resolved = [Path(p).resolve() for p in (paths if isinstance(paths, list) else [paths])]
    tokenizer = Path(config.tokenizer) if config.tokenizer else None
    payload = {
        "inputs": describe_inputs(resolved, fmt or config.format),
        "config": config.model_dump(mode="json"),
        "tokenizer": file_sha256(tokenizer) if tokenizer and tokenizer.exists() else config.tokenizer,
        "rules": _rules_version(),  # changed validation rules make every input new again
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _snapshot_signature(data_dir: Path) -> list[list[Any]]:
    """Name, size and mtime of every snapshot file: a cheap check that nobody edited it."""
    files = sorted(p for p in data_dir.rglob("*") if p.is_file())
    stats = [(p.relative_to(data_dir).as_posix(), p.stat()) for p in files]
    return [[name, st.st_size, st.st_mtime_ns] for name, st in stats]


def _tracked_version(fingerprint: str, config: DataConfig, repo_dir: str | Path) -> DatasetVersion | None:
    """The tracked snapshot when it was made from inputs with this fingerprint and is intact."""
    repo_dir = Path(repo_dir).resolve()
    data_dir = repo_dir / config.data_dir
    entry = _last_history_entry(repo_dir, config.data_dir)
    if entry is None or entry.get("input_fingerprint") != fingerprint:
        return None
    if versioning.current_version(repo_dir, config.data_dir) != entry["version"]:
        return None
    if not data_dir.is_dir() or _snapshot_signature(data_dir) != entry.get("snapshot"):
        return None
    report = json.loads((data_dir / REPORT).read_text(encoding="utf-8"))
    return DatasetVersion(
        version=entry["version"],
        data_dir=str(data_dir),
        dvc_file=str(versioning.dvc_file(repo_dir, config.data_dir)),
        manifest_path=str(data_dir / MANIFEST),
        report_path=str(data_dir / REPORT),
        counts=read_manifest(data_dir)["counts"],
        validation=summarize_report(report, data_dir / REPORT),
        reused=True,
        accepted_unjudged=_accepted_reason(data_dir),
    )


def find_tracked_version(
    paths: str | Path | list[str | Path],
    config: DataConfig | None = None,
    repo_dir: str | Path = ".",
    fmt: str | None = None,
) -> DatasetVersion | None:
    """The data version ``add_dataset`` would return for these inputs without validating them, if any."""
    config = config or DataConfig()
    return _tracked_version(input_fingerprint(paths, config, fmt), config, repo_dir)


def _read_history(repo_dir: Path) -> list[dict[str, Any]]:
    path = repo_dir / HISTORY
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _last_history_entry(repo_dir: Path, data_dir: str) -> dict[str, Any] | None:
    entries = [e for e in _read_history(repo_dir) if e.get("data_dir", "data") == data_dir]
    return entries[-1] if entries else None


def _append_history(
    repo_dir: Path, result: DatasetVersion, manifest: dict[str, Any], data_dir: str, fingerprint: str
) -> None:
    entry = {
        "version": result.version,
        "added_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "sources": [s["path"] for s in manifest["sources"]],
        "counts": result.counts,
        "data_dir": data_dir,
        "input_fingerprint": fingerprint,
        "snapshot": _snapshot_signature(repo_dir / data_dir),
    }
    if result.accepted_unjudged:
        entry[ACCEPTED_UNJUDGED] = result.accepted_unjudged
    path = repo_dir / HISTORY
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, sort_keys=True) + "\n")


def dataset_status(repo_dir: str | Path = ".", data_dir: str = "data") -> dict[str, Any]:
    """Current version (from data.dvc), the snapshot's manifest when present, and the add history."""
    repo_dir = Path(repo_dir).resolve()
    snapshot = repo_dir / data_dir
    history = _read_history(repo_dir)
    return {
        "version": versioning.current_version(repo_dir, data_dir),
        "data_dir": str(snapshot),
        "manifest": read_manifest(snapshot) if (snapshot / MANIFEST).exists() else None,
        "history": history,
    }
