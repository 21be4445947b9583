"""Validation throughput: ``alignflow data validate`` on a JSONL file vs a plain pandas pass.

A generated JSONL file of pairs (a few per cent bad: chosen == rejected, empty and
control-character fields, invalid JSON, exact and near duplicates) is validated two ways
in the same run:

- alignflow: the CLI as a user runs it, in a subprocess, timed end to end (interpreter
  start, imports, reading, every check, great-expectations where a row needs it, the
  JSON report with every quarantined row);
- pandas: ``pd.read_json(lines=True)`` and the same row checks written plainly, timed
  in this process (imports not counted), so the ratio favours pandas.

Rows via ``ALIGNFLOW_BENCH_ROWS`` (default 1M). Targets: >= 200k rows/s and >= 1.0x pandas.
The CLI's CPU seconds and the load average are recorded too: on a shared machine the
wall-clock rate says as much about the neighbours as about the code.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

MAX_CHARS = 20_000
TARGET_ROWS_PER_S = 200_000
_SURROGATES = re.compile("[\ud800-\udfff]")


def synthetic_lines(n: int) -> list[str]:
    """JSONL lines; every 50th row has one kind of fault (1 in 10 of them near duplicates)."""
    lines, rows = [], []
    for i in range(n):
        row = {
            "id": f"r{i}",
            "prompt": f"Question {i}: what is {i % 97} plus {i % 13}?",
            "chosen": f"The answer is {i % 97 + i % 13}.",
            "rejected": f"I think {i % 89}, item {i}",
            "source": "bench",
        }
        bad = i % 50
        if bad == 1:
            row["rejected"] = row["chosen"]
        elif bad == 2:
            row["chosen"] = ""
        elif bad == 3:
            row["chosen"] = "bell\x07"
        elif bad == 4 and i > 4:
            row = {**rows[i - 4], "id": f"r{i}"}  # exact duplicate content
        elif bad == 5 and i > 5 and i % 500 == 5:
            earlier = rows[i - 5]
            row = {**earlier, "id": f"r{i}", "prompt": earlier["prompt"].upper() + "!"}  # near duplicate
        rows.append(row)
        if bad == 6 and i % 1000 == 6:
            lines.append('{"prompt": "cut off", "chosen": ')  # invalid JSON
        else:
            lines.append(json.dumps(row))
    return lines


def pandas_pass(path: Path) -> int:
    """Read with pandas and run the same row checks; returns the number of bad rows."""
    # invalid JSON lines cannot be read by pd.read_json: a plain pass drops them first
    with path.open(encoding="utf-8") as fh:
        good, bad_json = [], 0
        for line in fh:
            if line.rstrip().endswith("}"):
                good.append(line)
            else:
                bad_json += 1
    import io

    frame = pd.read_json(io.StringIO("".join(good)), lines=True, dtype=False)
    text = ["prompt", "chosen", "rejected"]
    bad = pd.Series(False, index=frame.index)
    for column in text:
        values = frame[column]
        is_str = values.map(lambda v: isinstance(v, str))
        bad |= values.isna() | ~is_str
        s = values.where(is_str, "").astype(str)
        bad |= s.str.strip().eq("")
        bad |= s.str.contains("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", regex=True)
        bad |= s.map(lambda v: _SURROGATES.search(v) is not None).astype(bool)
        bad |= s.str.len() > MAX_CHARS
    bad |= frame["chosen"] == frame["rejected"]
    clean = frame[~bad]
    dup = clean.duplicated(subset=text)
    near = [
        clean[c]
        .str.casefold()
        .str.replace(r"(?<!\w)-(?=\d)", " minus ", regex=True)
        .str.replace(r"[\W_]+", " ", regex=True)
        .str.split()
        .str.join(" ")
        for c in text
    ]
    dup |= pd.concat(near, axis=1).duplicated()
    return int(bad.sum() + dup.sum() + bad_json)


def run() -> dict:
    n = int(os.environ.get("ALIGNFLOW_BENCH_ROWS", 1_000_000))
    started_all = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pairs.jsonl"
        path.write_text("\n".join(synthetic_lines(n)) + "\n", encoding="utf-8")
        report_path = Path(tmp) / "report.json"

        cli = shutil.which("alignflow") or str(Path(sys.executable).parent / "alignflow")
        command = [cli, "data", "validate", str(path), "--report", str(report_path)]
        command += ["--set", f"data.max_chars={MAX_CHARS}", "--set", "data.max_bad_fraction=0.5"]
        load_before = os.getloadavg()[0]
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        alignflow_s = time.perf_counter() - started
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        fields = ("ru_utime", "ru_stime")
        alignflow_cpu_s = sum(getattr(cpu_after, k) - getattr(cpu_before, k) for k in fields)
        if done.returncode != 0:
            raise RuntimeError(f"alignflow data validate exited {done.returncode}: {done.stderr[-2000:]}")
        report = json.loads(report_path.read_text(encoding="utf-8"))

        started = time.perf_counter()
        pandas_bad = pandas_pass(path)
        pandas_s = time.perf_counter() - started
        size_mb = path.stat().st_size / 1e6

    rows_per_s = n / alignflow_s
    return {
        "rows": n,
        "file_mb": round(size_mb, 1),
        "alignflow": "`alignflow data validate FILE --report R` in a subprocess, end to end",
        "pandas": "pd.read_json(lines=True) + the same row checks, in process, imports not timed",
        "alignflow_rows_per_s": round(rows_per_s),
        "pandas_rows_per_s": round(n / pandas_s),
        "alignflow_over_pandas": round(pandas_s / alignflow_s, 3),
        "alignflow_s": round(alignflow_s, 2),
        "alignflow_cpu_s": round(alignflow_cpu_s, 2),
        "alignflow_rows_per_cpu_s": round(n / alignflow_cpu_s),
        "load_average_before": round(load_before, 2),
        "pandas_s": round(pandas_s, 2),
        "alignflow_quarantined": report["quarantined"],
        "alignflow_counts_by_reason": report["counts_by_reason"],
        "quarantined_rows_listed": len(report["quarantined_rows"]),
        "pandas_bad_rows": pandas_bad,
        "same_bad_count": report["quarantined"] == pandas_bad,
        "meets_target": rows_per_s >= TARGET_ROWS_PER_S and pandas_s / alignflow_s >= 1.0,
        "target": f">= {TARGET_ROWS_PER_S} rows/s and >= 1.0x pandas",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus (shared)",
        "python": platform.python_version(),
        "wall_s": round(time.perf_counter() - started_all, 1),
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
