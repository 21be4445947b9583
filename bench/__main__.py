"""Run benchmarks: every ``bench/*_bench.py`` exposing ``run() -> dict`` (or those named).

Each result goes to ``bench/results/<name>.json``; ``bench/results/README.md`` is rebuilt as
one Markdown table over all result files, so later benchmarks plug in by adding a module.
Usage: ``python -m bench [name ...]`` where name is e.g. ``validation`` or ``validation_bench``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

from bench.provenance import code_commit

BENCH_DIR = Path(__file__).resolve().parent
RESULTS = BENCH_DIR / "results"


def discover() -> list[str]:
    return sorted(p.stem for p in BENCH_DIR.glob("*_bench.py"))


def _scalar(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_table(results_dir: Path = RESULTS) -> Path:
    """One row per metric of every result file: benchmark | metric | value."""
    lines = ["# Benchmark results", "", "| benchmark | metric | value |", "|---|---|---|"]
    for path in sorted(results_dir.glob("*.json")):
        data = json.loads(path.read_text())
        for key, value in data.items():
            if isinstance(value, int | float | str | bool) and key != "name":
                lines.append(f"| {path.stem} | {key} | {_scalar(value)} |")
    out = results_dir / "README.md"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def parse_names(argv: list[str]) -> list[str]:
    """The bench modules ``argv`` names (``validation`` or ``validation_bench``), every one where
    it names none; an unknown name is a usage error that lists the known ones."""
    known = discover()
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Run benchmarks and write bench/results/<name>.json and bench/results/README.md.",
        epilog="benchmarks: " + ", ".join(n.removesuffix("_bench") for n in known),
    )
    parser.add_argument("names", nargs="*", metavar="name", help="a benchmark to run (default: all of them)")
    names = [n if n.endswith("_bench") else f"{n}_bench" for n in parser.parse_args(argv).names]
    unknown = [n.removesuffix("_bench") for n in names if n not in known]
    if unknown:
        parser.error(f"no benchmark named {', '.join(unknown)} (see --help)")
    return names or known


def main(argv: list[str]) -> int:
    names = parse_names(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        commit = code_commit()  # before the run: a bench rewrites its own results
        started = time.perf_counter()
        result = module.run()
        short = name.removesuffix("_bench")
        if result.get("skipped"):  # e.g. a GPU benchmark on a CPU machine: keep the last real result
            print(f"{short}: skipped, {result['skipped']}")
            continue
        result.setdefault("wall_s", round(time.perf_counter() - started, 2))
        result.setdefault("code_commit", commit)
        (RESULTS / f"{short}.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        print(f"{short}: {json.dumps(result)}")
    print(f"table: {write_table(RESULTS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
