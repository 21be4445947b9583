"""Load test of the feedback service on loopback, with and without a crash in the middle.

A real ``alignflow api`` process (uvicorn, SQLite in WAL mode) takes 20,000 feedback POSTs
from 50 concurrent clients. Every acknowledged write is then looked up in the database by
id and compared field by field. In the second run the server is killed with SIGKILL
halfway and started again on the same database; clients retry with their idempotency keys,
so the check is that nothing acknowledged is lost and nothing is stored twice.

Run: ``python -m bench.feedback_load_bench`` (writes bench/results/feedback_load.{json,md}).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

RESULTS = Path(__file__).resolve().parent / "results"
TOKEN = "bench-token-" + "0" * 24
CLIENTS = 50
REQUESTS = 20_000


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_server(work: Path, port: int) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "alignflow.cli", "api", "--host", "127.0.0.1", "--port", str(port),
        "--db-url", f"sqlite:///{work / 'feedback.db'}", "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}",
        "--work-dir", str(work / "service"), "--token", TOKEN, "--log-level", "warning",
    ]  # fmt: skip
    log = (work / "server.log").open("ab")
    return subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "DO_NOT_TRACK": "1"}
    )


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


def _body(i: int) -> dict[str, Any]:
    return {
        "prompt": f"What is {i % 10} plus {i // 10 % 10}? (request {i})",
        "response": f"The answer is {i % 10 + i // 10 % 10}.",
        "score": (i % 101) / 100,
        "runId": f"bench-run-{i}",
    }


async def _client_loop(
    client: httpx.AsyncClient,
    queue: asyncio.Queue,
    url: str,
    phase: str,
    acked: dict,
    latencies: list,
    stats: dict,
) -> None:
    while True:
        try:
            i = queue.get_nowait()
        except asyncio.QueueEmpty:
            return
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
                break
            stats["retries"] += 1
            code = f"http_{response.status_code}"
            stats["reasons"][code] = stats["reasons"].get(code, 0) + 1
            await asyncio.sleep(0.05)


async def _drive(port: int, phase: str, on_half=None) -> dict[str, Any]:
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(REQUESTS):
        queue.put_nowait(i)
    acked: dict[int, str] = {}
    latencies: list[float] = []
    stats: dict[str, Any] = {"retries": 0, "replayed": 0, "reasons": {}}
    url = f"http://127.0.0.1:{port}/api/policies/feedback/bench-agent"
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    started = time.perf_counter()
    async with httpx.AsyncClient(limits=limits, timeout=30.0) as client:
        tasks = [asyncio.create_task(_client_loop(client, queue, url, phase, acked, latencies, stats))
                 for _ in range(CLIENTS)]  # fmt: skip
        if on_half is not None:
            while len(acked) < REQUESTS // 2:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(on_half, len(acked))
        await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "acknowledged": len(acked),
        "elapsed_s": round(elapsed, 2),
        "requests_per_s": round(len(acked) / elapsed, 1),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 2),
        "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99) - 1], 2),
        "mean_ms": round(1000 * statistics.fmean(latencies), 2),
        "retries": stats["retries"],
        "retry_reasons": stats["reasons"],
        "replayed_acks": stats["replayed"],
        "_acked": acked,
    }


def _verify(db_path: Path, acked: dict[int, str]) -> dict[str, Any]:
    """Every acknowledged id is in the table with exactly the fields that were sent."""
    engine = sa.create_engine(f"sqlite:///{db_path}")
    with engine.connect() as conn:
        rows = {
            r.id: r
            for r in conn.execute(
                sa.text("SELECT id, prompt, response, score, run_id, idempotency_key FROM feedback")
            )
        }
    engine.dispose()
    missing = [i for i, fid in acked.items() if fid not in rows]
    mismatched = []
    for i, fid in acked.items():
        row = rows.get(fid)
        body = _body(i)
        if row is not None and (row.prompt, row.response, row.score, row.run_id) != (
            body["prompt"],
            body["response"],
            body["score"],
            body["runId"],
        ):
            mismatched.append(i)
    keys = [r.idempotency_key for r in rows.values()]
    return {
        "rows_in_db": len(rows),
        "acknowledged_missing": len(missing),
        "content_mismatches": len(mismatched),
        "duplicate_keys": len(keys) - len(set(keys)),
        "all_acknowledged_present": not missing and not mismatched,
    }


def _scenario(kill_halfway: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="alignflow-load-") as tmp:
        work, port = Path(tmp), _free_port()
        server = {"proc": _start_server(work, port)}
        _wait_ready(port)
        events: dict[str, Any] = {}

        def crash_and_restart(acked_so_far: int) -> None:
            os.kill(server["proc"].pid, signal.SIGKILL)
            server["proc"].wait()
            events["killed_after_acks"] = acked_so_far
            down = time.perf_counter()
            server["proc"] = _start_server(work, port)
            _wait_ready(port)
            events["downtime_s"] = round(time.perf_counter() - down, 2)

        try:
            result = asyncio.run(_drive(port, "kill" if kill_halfway else "steady",
                                        crash_and_restart if kill_halfway else None))  # fmt: skip
        finally:
            server["proc"].terminate()
            server["proc"].wait(30)
        acked = result.pop("_acked")
        return {**result, **events, **_verify(work / "feedback.db", acked)}


def run() -> dict[str, Any]:
    """Both scenarios; writes JSON and Markdown to bench/results/ and returns the figures."""
    report = {
        "clients": CLIENTS,
        "requests": REQUESTS,
        "database": "SQLite (WAL, synchronous=NORMAL)",
        "cpu_count": os.cpu_count(),
        "steady": _scenario(kill_halfway=False),
        "sigkill_halfway": _scenario(kill_halfway=True),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "feedback_load.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (RESULTS / "feedback_load.md").write_text(_markdown(report), encoding="utf-8")
    return report


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Feedback service load test",
        "",
        f"{report['clients']} concurrent clients, {report['requests']} POSTs each run, loopback, "
        f"{report['database']}, {report['cpu_count']} CPUs.",
        "",
        "| run | acked | rows in DB | missing | mismatched | duplicates | req/s | p50 ms | p99 ms "
        "| retries |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("steady", "sigkill_halfway"):
        r = report[name]
        lines.append(
            f"| {name} | {r['acknowledged']} | {r['rows_in_db']} | {r['acknowledged_missing']} | "
            f"{r['content_mismatches']} | {r['duplicate_keys']} | {r['requests_per_s']} | {r['p50_ms']} | "
            f"{r['p99_ms']} | {r['retries']} |"
        )
    crash = report["sigkill_halfway"]
    lines += ["", f"Killed (SIGKILL) after {crash.get('killed_after_acks')} acknowledgements; "
              f"restarted in {crash.get('downtime_s')} s."]  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
