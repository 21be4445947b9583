"""Load test of the feedback write path on loopback, against a bare anchor, same run.

Servers (each its own process):

- ``alignflow api`` (uvicorn), feedback on SQLite (WAL, synchronous=NORMAL) and PostgreSQL;
- the anchor: a bare FastAPI endpoint inserting the same row into SQLite with the same
  durability settings (WAL, synchronous=NORMAL, one commit per request);
- the client ceiling: the anchor's trivial endpoint (no database), so the table says how
  fast the load generator itself can go.

Load generator of the steady runs: wrk (C, two threads, keep-alive connections) with
``bench/feedback_load.lua``, which gives every request its own idempotency key and writes
every acknowledgement (status, stored id) to a file. A Python generator on the same two
cores tops out near 600 requests/s and would measure itself; wrk's own ceiling is the
"client ceiling" row (a trivial endpoint, no database). Without wrk on the PATH (``apt-get
install wrk``) the steady runs fall back to the Python generator and the report says so.
Every acknowledged write is then looked up in the database by its id and compared field by
field with the body its key stands for; a key stored twice counts as doubled.

The SIGKILL run needs clients that retry: keep-alive httpx connections in several client
processes kill the alignflow server halfway, start it again on the same database, and
retry with their idempotency keys: nothing acknowledged may be lost and nothing stored twice.

Run: ``python -m bench.feedback_load_bench`` (writes bench/results/feedback_load.{json,md}).
Sizes via ``ALIGNFLOW_LOAD_SECONDS`` (wrk runs, default 10 s each) and
``ALIGNFLOW_LOAD_REQUESTS`` (Python-driven runs, default 10,000).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

RESULTS = Path(__file__).resolve().parent / "results"
TOKEN = "bench-token-" + "0" * 24
CLIENT_PROCESSES = 4
REQUESTS = int(os.environ.get("ALIGNFLOW_LOAD_REQUESTS", 10_000))
SECONDS = int(os.environ.get("ALIGNFLOW_LOAD_SECONDS", 10))
WRK_SCRIPT = Path(__file__).resolve().parent / "feedback_load.lua"
WRK_THREADS = 2
GENERATOR = "wrk" if shutil.which("wrk") else "python"
POSTGRES_ADMIN = os.environ.get(
    "ALIGNFLOW_BENCH_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- the anchor: a bare FastAPI endpoint with the same SQLite durability -------------------
def anchor_app():
    """Bare FastAPI + sqlite3: one INSERT and one COMMIT per request (WAL, synchronous=NORMAL)."""
    from fastapi import FastAPI

    db_path = os.environ["ANCHOR_DB"]
    local = threading.local()

    def connection() -> sqlite3.Connection:
        if not hasattr(local, "conn"):
            conn = sqlite3.connect(db_path, timeout=30, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=30000")
            local.conn = conn
        return local.conn

    conn = connection()
    conn.execute(
        "CREATE TABLE IF NOT EXISTS feedback (id TEXT PRIMARY KEY, agent_id TEXT, prompt TEXT, "
        "response TEXT, score REAL, run_id TEXT, idempotency_key TEXT, UNIQUE (agent_id, idempotency_key))"
    )
    conn.commit()
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/ping/{agent_id}")
    async def ping(agent_id: str, body: dict) -> dict[str, str]:
        return {"id": uuid.uuid4().hex}

    @app.post("/api/policies/feedback/{agent_id}", status_code=201)
    def feedback(agent_id: str, body: dict) -> dict[str, str]:
        row_id = uuid.uuid4().hex
        db = connection()
        db.execute(
            "INSERT INTO feedback VALUES (?, ?, ?, ?, ?, ?, ?)",
            (row_id, agent_id, body["prompt"], body["response"], body["score"], body["runId"], None),
        )
        db.commit()
        return {"id": row_id}

    return app


# --- servers -----------------------------------------------------------------------------
def _start_alignflow(work: Path, port: int, db_url: str) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "alignflow.cli", "api", "--host", "127.0.0.1", "--port", str(port),
        "--db-url", db_url, "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}",
        "--work-dir", str(work / "service"), "--token", TOKEN, "--log-level", "warning",
    ]  # fmt: skip
    log = (work / "server.log").open("ab")
    env = {**os.environ, "DO_NOT_TRACK": "1"}
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def _start_anchor(work: Path, port: int) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "uvicorn", "bench.feedback_load_bench:anchor_app", "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
    ]  # fmt: skip
    env = {**os.environ, "ANCHOR_DB": str(work / "anchor.db")}
    log = (work / "anchor.log").open("ab")
    root = Path(__file__).resolve().parents[1]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)


def _wait_ready(port: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server on port {port} did not become ready in {timeout}s")


# --- clients -----------------------------------------------------------------------------
def _body(i: int | str) -> dict[str, Any]:
    """Request ``i``'s body; ``i`` is a number or a key ending in one (``bench/feedback_load.lua`` too)."""
    n = int(re.search(r"(\d+)$", str(i)).group(1))
    return {
        "prompt": f"What is {n % 10} plus {n // 10 % 10}? (request {i})",
        "response": f"The answer is {n % 10 + n // 10 % 10}.",
        "score": (n % 101) / 100,
        "runId": f"bench-run-{i}",
    }


def _drive_wrk(port: int, path: str, clients: int, phase: str) -> dict[str, Any]:
    """``SECONDS`` of wrk on ``clients`` connections; the acknowledged ids come back in ``_acked``."""
    with tempfile.TemporaryDirectory(prefix="alignflow-wrk-") as acks:
        command = [
            "wrk", f"-t{min(WRK_THREADS, clients)}", f"-c{clients}", f"-d{SECONDS}s", "--latency",
            "-s", str(WRK_SCRIPT), f"http://127.0.0.1:{port}", "--", path, TOKEN, phase, acks,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        summary = next((ln for ln in done.stdout.splitlines() if ln.startswith("WRK_JSON ")), None)
        if done.returncode != 0 or summary is None:
            raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr[-1000:]}")
        stats = json.loads(summary.removeprefix("WRK_JSON "))
        acked, refused = {}, 0
        for file in Path(acks).glob("acks-*.tsv"):
            for line in file.read_text().splitlines():
                code, _, row_id = line.partition("\t")
                if code in ("200", "201") and row_id:
                    acked[row_id] = row_id
                else:
                    refused += 1
    elapsed = stats["duration_us"] / 1e6
    errors = sum(stats[k] for k in ("connect_errors", "read_errors", "write_errors", "timeouts"))
    return {
        "clients": clients,
        "client_processes": f"wrk, {min(WRK_THREADS, clients)} threads",
        "acknowledged": len(acked),
        "elapsed_s": round(elapsed, 2),
        "requests_per_s": round(len(acked) / elapsed, 1),
        "p50_ms": round(stats["p50_us"] / 1000, 2),
        "p99_ms": round(stats["p99_us"] / 1000, 2),
        "mean_ms": round(stats["mean_us"] / 1000, 2),
        "retries": 0,
        "retry_reasons": {"not_acknowledged": refused, "socket_errors": errors} if refused or errors else {},
        "replayed_acks": 0,
        "_acked": acked,
    }


def _steady(port: int, path: str, clients: int, phase: str) -> dict[str, Any]:
    """A steady run: wrk when it is installed, else the Python generator."""
    return (
        _drive_wrk(port, path, clients, phase) if GENERATOR == "wrk" else _drive(port, path, clients, phase)
    )


async def _client(client, url, indices, phase, acked, latencies, stats, progress) -> None:
    for i in indices:
        headers = {"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": f"{phase}-{i}"}
        while True:  # retry until acknowledged: the server may be down for a while
            started = time.perf_counter()
            try:
                response = await client.post(url, json=_body(i), headers=headers)
            except httpx.HTTPError as exc:
                stats["retries"] += 1
                stats["reasons"][type(exc).__name__] = stats["reasons"].get(type(exc).__name__, 0) + 1
                await asyncio.sleep(0.05)
                continue
            if response.status_code in (200, 201):
                latencies.append(time.perf_counter() - started)
                acked[i] = response.json()["id"]
                stats["replayed"] += response.status_code == 200
                with progress.get_lock():
                    progress.value += 1
                break
            if 400 <= response.status_code < 500:
                raise RuntimeError(f"{url} answered {response.status_code}: {response.text[:300]}")
            stats["retries"] += 1
            code = f"http_{response.status_code}"
            stats["reasons"][code] = stats["reasons"].get(code, 0) + 1
            await asyncio.sleep(0.05)


def _client_process(url, indices, connections, phase, progress, start, out) -> None:
    """One client process: ``connections`` keep-alive connections sharing ``indices``."""

    async def main() -> dict[str, Any]:
        acked: dict[int, str] = {}
        latencies: list[float] = []
        stats: dict[str, Any] = {"retries": 0, "replayed": 0, "reasons": {}}
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        async with httpx.AsyncClient(limits=limits, timeout=60.0) as client:
            shares = [indices[k::connections] for k in range(connections)]
            start.wait()
            await asyncio.gather(
                *(_client(client, url, s, phase, acked, latencies, stats, progress) for s in shares)
            )
        return {"acked": acked, "latencies": latencies, **stats}

    try:
        out.put(asyncio.run(main()))
    except BaseException as exc:  # noqa: BLE001 - handed to the parent, which raises it
        out.put({"error": f"{type(exc).__name__}: {exc}"})


def _drive(port: int, path: str, clients: int, phase: str, on_half=None) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    progress, start, out = ctx.Value("i", 0), ctx.Event(), ctx.Queue()
    url = f"http://127.0.0.1:{port}{path}"
    processes = min(CLIENT_PROCESSES, clients)
    per = [clients // processes + (k < clients % processes) for k in range(processes)]
    workers = [
        ctx.Process(
            target=_client_process,
            args=(url, list(range(k, REQUESTS, processes)), per[k], phase, progress, start, out),
        )
        for k in range(processes)
    ]
    for worker in workers:
        worker.start()
    time.sleep(2.0)  # let every client process import and connect before the clock starts
    started = time.perf_counter()
    start.set()
    if on_half is not None:
        while progress.value < REQUESTS // 2 and any(w.is_alive() for w in workers):
            time.sleep(0.01)
        on_half(progress.value)
    parts = [out.get() for _ in workers]
    elapsed = time.perf_counter() - started
    errors = [part["error"] for part in parts if "error" in part]
    if errors:
        raise RuntimeError(f"client process failed: {errors[0]}")
    for worker in workers:
        worker.join()
    acked = {k: v for part in parts for k, v in part["acked"].items()}
    latencies = sorted(x for part in parts for x in part["latencies"])
    reasons: dict[str, int] = {}
    for part in parts:
        for key, value in part["reasons"].items():
            reasons[key] = reasons.get(key, 0) + value
    return {
        "clients": clients,
        "client_processes": processes,
        "acknowledged": len(acked),
        "elapsed_s": round(elapsed, 2),
        "requests_per_s": round(len(acked) / elapsed, 1),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 2),
        "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99) - 1], 2),
        "mean_ms": round(1000 * statistics.fmean(latencies), 2),
        "retries": sum(part["retries"] for part in parts),
        "retry_reasons": reasons,
        "replayed_acks": sum(part["replayed"] for part in parts),
        "_acked": acked,
    }


# --- checks ------------------------------------------------------------------------------
def _verify(db_url: str, acked: dict[Any, str], agent: str) -> dict[str, Any]:
    """Every acknowledged id is in the table with exactly the fields its request sent.

    The request a row came from is read from its ``run_id`` (``bench-run-<request>``), so rows
    acknowledged by wrk, which only reports the stored ids, are checked as fully.
    """
    engine = sa.create_engine(db_url)
    query = sa.text(
        "SELECT id, prompt, response, score, run_id, idempotency_key FROM feedback WHERE agent_id = :a"
    )
    with engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(query, {"a": agent})}
    engine.dispose()
    missing = [fid for fid in acked.values() if fid not in rows]
    mismatched = []
    for fid in acked.values():
        row = rows.get(fid)
        if row is None:
            continue
        body = _body(row.run_id.removeprefix("bench-run-"))
        sent = (body["prompt"], body["response"], body["score"], body["runId"])
        if (row.prompt, row.response, row.score, row.run_id) != sent:
            mismatched.append(fid)
    keys = [r.run_id for r in rows.values()]
    return {
        "rows_in_db": len(rows),
        "acknowledged_missing": len(missing),
        "content_mismatches": len(mismatched),
        "duplicate_keys": len(keys) - len(set(keys)),
        "all_acknowledged_present": not missing and not mismatched,
    }


def _postgres_url() -> str | None:
    """A fresh database on the local PostgreSQL, or None when there is none."""
    try:
        admin = sa.create_engine(POSTGRES_ADMIN, isolation_level="AUTOCOMMIT")
        name = f"alignflow_load_{uuid.uuid4().hex[:8]}"
        with admin.connect() as conn:
            conn.execute(sa.text(f"CREATE DATABASE {name}"))
        admin.dispose()
    except Exception:  # noqa: BLE001 - no PostgreSQL here: those rows are skipped
        return None
    return str(sa.engine.make_url(POSTGRES_ADMIN).set(database=name).render_as_string(hide_password=False))


# --- scenarios ---------------------------------------------------------------------------
def _alignflow_runs(db: str, clients_list: list[int], kill: bool = False) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="alignflow-load-") as tmp:
        work = Path(tmp)
        db_url = f"sqlite:///{work / 'feedback.db'}" if db == "sqlite" else _postgres_url()
        if db_url is None:
            return [{"server": "alignflow", "database": db, "skipped": "no PostgreSQL at 127.0.0.1:5432"}]
        port = _free_port()
        server = {"proc": _start_alignflow(work, port, db_url)}
        _wait_ready(port)
        events: dict[str, Any] = {}

        def crash_and_restart(acked_so_far: int) -> None:
            os.kill(server["proc"].pid, signal.SIGKILL)
            server["proc"].wait()
            events["killed_after_acks"] = acked_so_far
            down = time.perf_counter()
            server["proc"] = _start_alignflow(work, port, db_url)
            _wait_ready(port)
            events["downtime_s"] = round(time.perf_counter() - down, 2)

        try:
            for clients in clients_list:
                agent = f"bench-{db}-{clients}{'-kill' if kill else ''}"
                path = f"/api/policies/feedback/{agent}"
                if kill:
                    result = _drive(port, path, clients, agent, crash_and_restart)
                else:
                    result = _steady(port, path, clients, agent)
                acked = result.pop("_acked")
                name = "sigkill_halfway" if kill else "steady"
                results.append(
                    {"server": "alignflow", "run": name, "database": db, **result, **events,
                     **_verify(db_url, acked, agent)}
                )  # fmt: skip
        finally:
            server["proc"].terminate()
            server["proc"].wait(30)
    return results


def _anchor_runs(clients_list: list[int]) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="alignflow-anchor-") as tmp:
        work, port = Path(tmp), _free_port()
        server = _start_anchor(work, port)
        try:
            _wait_ready(port)
            for clients in clients_list:
                ceiling = _steady(port, f"/ping/c{clients}", clients, f"ceiling-{clients}")
                ceiling.pop("_acked")
                results.append({"server": "client ceiling (no database)", "run": "steady", "database": "-",
                                **ceiling})  # fmt: skip
                agent = f"anchor-{clients}"
                anchor = _steady(port, f"/api/policies/feedback/{agent}", clients, agent)
                acked = anchor.pop("_acked")
                check = _verify(f"sqlite:///{work / 'anchor.db'}", acked, agent)
                results.append({"server": "bare FastAPI + SQLite", "run": "steady", "database": "sqlite",
                                **anchor, **check})  # fmt: skip
        finally:
            server.terminate()
            server.wait(30)
    return results


def run() -> dict[str, Any]:
    """Every scenario; writes JSON and Markdown to bench/results/ and returns the figures."""
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    rows = _anchor_runs([10, 50])
    rows += _alignflow_runs("sqlite", [10, 50])
    rows += _alignflow_runs("postgres", [10, 50])
    rows += _alignflow_runs("sqlite", [50], kill=True)
    rows += _alignflow_runs("postgres", [50], kill=True)
    anchor = {r["clients"]: r for r in rows if r["server"] == "bare FastAPI + SQLite"}
    ours = {r["clients"]: r for r in rows if r["server"] == "alignflow" and r.get("run") == "steady"
            and r["database"] == "sqlite"}  # fmt: skip
    targets = {}
    for clients in (10, 50):
        a, o = anchor[clients], ours[clients]
        targets[f"over_anchor_{clients}"] = round(o["requests_per_s"] / a["requests_per_s"], 3)
        targets[f"p99_over_anchor_{clients}"] = round(o["p99_ms"] / a["p99_ms"], 3)
    kills = [r for r in rows if r.get("run") == "sigkill_halfway" and not r.get("skipped")]
    report = {
        "load_generator": GENERATOR,
        "steady_run": f"{SECONDS} s of wrk" if GENERATOR == "wrk" else f"{REQUESTS} requests",
        "sigkill_run": f"{REQUESTS} requests from {CLIENT_PROCESSES} Python client processes (retrying)",
        "durability": "SQLite WAL, synchronous=NORMAL, commit before acknowledging (both servers)",
        "cpu_count": os.cpu_count(),
        "load_average_before": round(load_before, 2),
        "runs": rows,
        **targets,
        "alignflow_sqlite_50_rps": ours[50]["requests_per_s"],
        "meets_target": (
            ours[50]["requests_per_s"] >= 1000
            and targets["over_anchor_50"] >= 0.8
            and targets["p99_over_anchor_10"] <= 1.2
            and targets["p99_over_anchor_50"] <= 1.2
        ),
        "sigkill_databases": [r["database"] for r in kills],
        "sigkill_lost": sum(r["acknowledged_missing"] for r in kills),
        "sigkill_doubled": sum(r["duplicate_keys"] for r in kills),
        "target": ">= 1000 writes/s at 50 clients, >= 0.8x the anchor, p99 <= 1.2x the anchor's",
        "wall_s": round(time.perf_counter() - started, 1),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "feedback_load.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (RESULTS / "feedback_load.md").write_text(_markdown(report), encoding="utf-8")
    return report


def _generator_note(generator: str) -> str:
    if generator == "wrk":
        return "wrk with bench/feedback_load.lua, every acknowledgement checked against the database"
    return "Python clients: wrk was not found, so the generator's own ceiling limits every row"


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Feedback service load test",
        "",
        f"Steady runs: {report['steady_run']} per row ({_generator_note(report['load_generator'])}), "
        f"keep-alive connections on loopback, {report['cpu_count']} CPUs shared by servers and clients "
        f"(load average {report['load_average_before']} before the run). SIGKILL run: "
        f"{report['sigkill_run']}. {report['durability']}.",
        "",
        "| server | run | database | clients | acked | rows | missing | mismatched | doubled | req/s "
        "| p50 ms | p99 ms | retries |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        if r.get("skipped"):
            lines.append(f"| {r['server']} | - | {r['database']} | skipped: {r['skipped']} |")
            continue
        lines.append(
            f"| {r['server']} | {r['run']} | {r['database']} | {r['clients']} | {r['acknowledged']} | "
            f"{r.get('rows_in_db', '-')} | {r.get('acknowledged_missing', '-')} | "
            f"{r.get('content_mismatches', '-')} | {r.get('duplicate_keys', '-')} | {r['requests_per_s']} | "
            f"{r['p50_ms']} | {r['p99_ms']} | {r['retries']} |"
        )
    lines += [
        "",
        f"alignflow / anchor (SQLite): {report['over_anchor_10']}x at 10 clients, "
        f"{report['over_anchor_50']}x at 50; p99 ratio {report['p99_over_anchor_10']} and "
        f"{report['p99_over_anchor_50']}. Target: {report['target']}: "
        f"{'met' if report['meets_target'] else 'not met'}.",
        f"SIGKILL halfway ({', '.join(report['sigkill_databases'])}): {report['sigkill_lost']} "
        f"acknowledged writes lost, {report['sigkill_doubled']} stored twice.",
        "",
        "Rows above acked in a wrk row are requests still in flight when wrk stopped the clock: "
        "stored, never answered, so never counted (at most one per connection).",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
