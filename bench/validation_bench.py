"""Validation throughput: alignflow's full validation vs a plain pandas pass, same checks.

Both sides get the same in-memory synthetic pairs (a few per cent bad) and look for
missing/empty/non-string fields, chosen == rejected, control characters, invalid UTF-8
(lone surrogates), over-length text, exact and near duplicates. alignflow additionally
normalises each row, runs the great-expectations suite and builds the report, so the
ratio says what that bookkeeping costs. Rows via ``ALIGNFLOW_BENCH_ROWS`` (default 1M).
"""

from __future__ import annotations

import os
import platform
import re
import time

import pandas as pd

from alignflow.data.config import DataConfig
from alignflow.data.readers import RawRow
from alignflow.data.validation import validate_rows

MAX_CHARS = 20_000
_SURROGATES = re.compile("[\ud800-\udfff]")


def synthetic_pairs(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        row = {
            "prompt": f"Question {i}: what is {i % 97} plus {i % 13}?",
            "chosen": f"The answer is {i % 97 + i % 13}.",
            "rejected": f"I think {i % 89}, item {i}",
        }
        bad = i % 50
        if bad == 1:
            row["rejected"] = row["chosen"]
        elif bad == 2:
            row["chosen"] = ""
        elif bad == 3:
            row["chosen"] = "bell\x07"
        elif bad == 4 and i > 0:
            row = dict(rows[i - 4])
        rows.append(row)
    return rows


def pandas_pass(frame: pd.DataFrame) -> int:
    """The same row checks written directly in pandas; returns the number of bad rows."""
    text = ["prompt", "chosen", "rejected"]
    bad = pd.Series(False, index=frame.index)
    for column in text:
        values = frame[column]
        is_str = values.map(lambda v: isinstance(v, str))
        bad |= values.isna() | ~is_str
        s = values.where(is_str, "").astype(str)
        bad |= s.str.strip().eq("")
        bad |= s.str.contains("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]", regex=True)
        # pyarrow-backed strings cannot hold lone surrogates, so this one runs in Python
        bad |= s.map(lambda v: _SURROGATES.search(v) is not None).astype(bool)
        bad |= s.str.len() > MAX_CHARS
    bad |= frame["chosen"] == frame["rejected"]
    bad |= frame.duplicated(subset=text)
    near = [
        frame[c].astype(str).str.casefold().str.replace(r"[\W_]+", " ", regex=True).str.split().str.join(" ")
        for c in text
    ]
    bad |= pd.concat(near, axis=1).duplicated()
    return int(bad.sum())


def run() -> dict:
    n = int(os.environ.get("ALIGNFLOW_BENCH_ROWS", 1_000_000))
    rows = synthetic_pairs(n)
    config = DataConfig(max_chars=MAX_CHARS)

    started = time.perf_counter()
    validated = validate_rows((RawRow("synthetic", i + 1, r) for i, r in enumerate(rows)), config)
    alignflow_s = time.perf_counter() - started

    started = time.perf_counter()
    frame = pd.DataFrame(rows)
    pandas_bad = pandas_pass(frame)
    pandas_s = time.perf_counter() - started

    report = validated.report
    return {
        "rows": n,
        "alignflow_rows_per_s": round(n / alignflow_s),
        "pandas_rows_per_s": round(n / pandas_s),
        "alignflow_over_pandas": round(pandas_s / alignflow_s, 3),
        "alignflow_s": round(alignflow_s, 2),
        "pandas_s": round(pandas_s, 2),
        "alignflow_quarantined": report["quarantined"],
        "pandas_bad_rows": pandas_bad,
        "same_bad_count": report["quarantined"] == pandas_bad,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus (shared)",
    }
