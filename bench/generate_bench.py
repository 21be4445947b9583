"""Policy serving throughput: ``generate`` batched vs one by one, over HTTP, 1 and 32 clients.

The tiny policy (the demo config's model dims) is registered in a real MLflow sqlite store.
A uvicorn server process runs a minimal FastAPI app whose ``POST /generate`` awaits
:class:`alignflow.service.serving.PolicyPool` exactly as the service's endpoint does (the
version is fetched from the registry and loaded on the warm-up request). Load comes from
separate client processes (httpx, keep-alive, closed loop: each client sends its next
request when the last one is answered), so HTTP, JSON and the GIL are all paid for. ``POST
/anchor`` answers the same body without a model: the HTTP ceiling of this machine.

The model's weights are redrawn large (untrained) so that greedy decoding always writes the
full ``max_new_tokens`` and differs per prompt; a trained policy that stops early at EOS
costs less per request in both modes. Other work on the machine shows in the load averages
recorded with every configuration.

Run: ``python -m bench generate`` (writes bench/results/generate.{json,md}).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

RESULTS = Path(__file__).resolve().parent / "results"
NAME, VERSION = "bench-policy", "1"
MAX_NEW_TOKENS = 16
MAX_BATCH = 32
MAX_WAIT_MS = 5.0  # the service default (ServingSettings.max_wait_ms)
DURATION_S = float(os.environ.get("ALIGNFLOW_BENCH_GENERATE_S", "12"))  # per configuration
ROUNDS = 3  # each configuration runs in this many slices, interleaved with the other modes
CLIENT_COUNTS = (1, 32)
CLIENTS_PER_PROCESS = 8
# mode -> (batching, max_wait_ms); "batched" is the service's default setting
MODES = {"one-by-one": (False, 0.0), "batched": (True, MAX_WAIT_MS), "batched, no wait": (True, 0.0)}


def _prompts(n: int = 512) -> list[str]:
    from alignflow.data.demo import iter_demo_pairs

    return [r["prompt"] for r in iter_demo_pairs(n, seed=11, phrasings=6)]


# -- the model and the registry --------------------------------------------------------------


def build_policy(out: Path) -> tuple[Path, dict[str, Any]]:
    """The demo's tiny model, weights redrawn so that greedy decoding never stops early."""
    import torch

    from alignflow.config import load_config
    from alignflow.data.demo import iter_demo_pairs
    from alignflow.models import build_tiny_model, load_causal_lm

    spec = load_config(None).model
    records = list(iter_demo_pairs(600, seed=0, phrasings=6))
    build_tiny_model([f"{r['prompt']} {r['chosen']} {r['rejected']}" for r in records], out, spec)
    model, _ = load_causal_lm(out)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.15, generator=generator)
    model.save_pretrained(out, safe_serialization=True)
    dims = {
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_layers": spec.num_layers,
        "num_heads": spec.num_heads,
        "vocab_size": spec.vocab_size,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    return out, dims


def register_policy(model_dir: Path, work: Path) -> str:
    import mlflow
    from mlflow import MlflowClient

    from alignflow.registry.models import log_model

    uri = f"sqlite:///{work / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("bench", artifact_location=(work / "art").as_uri())
    with mlflow.start_run(experiment_id=experiment):
        logged = log_model(model_dir, uri, NAME, name="policy")
    assert logged is not None and logged.version == VERSION, logged
    return uri


# -- the server ------------------------------------------------------------------------------


class GenerateIn(BaseModel):
    prompt: str = Field(min_length=1, max_length=8000)


class GenerateOut(BaseModel):
    completion: str


def make_app(pool):
    """``POST /generate`` as the service serves it, ``POST /anchor`` without a model, ``GET /stats``."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/generate")
    async def generate(body: GenerateIn) -> GenerateOut:
        return GenerateOut(completion=await pool.generate(NAME, VERSION, body.prompt))

    @app.post("/anchor")
    async def anchor(body: GenerateIn) -> GenerateOut:
        return GenerateOut(completion=body.prompt)

    @app.get("/stats")
    def stats() -> dict[str, Any]:
        import torch

        held = pool.stats().get((NAME, VERSION))
        return {"policy": held.as_dict() if held else None, "torch_threads": torch.get_num_threads()}

    return app


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from alignflow.service.serving import PolicyPool

    pool = PolicyPool(
        args.tracking_uri,
        Path(args.cache_dir),
        max_new_tokens=args.max_new_tokens,
        max_batch=MAX_BATCH,
        max_wait_ms=MODES[args.mode][1],
        batching=MODES[args.mode][0],
    )
    try:
        uvicorn.run(make_app(pool), host="127.0.0.1", port=args.port, log_level="warning")
    finally:
        pool.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_server(work: Path, uri: str, mode: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    command = [
        sys.executable, "-m", "bench.generate_bench", "serve", "--port", str(port), "--mode", mode,
        "--tracking-uri", uri, "--cache-dir", str(work / "cache"), "--max-new-tokens", str(MAX_NEW_TOKENS),
    ]  # fmt: skip
    log = (work / f"server-{mode.replace(' ', '').replace(',', '-')}.log").open("ab")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=Path(__file__).parents[1]
    )
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url, proc)
    return proc, url


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bench server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"bench server at {url} not ready in {timeout}s")


# -- the clients -----------------------------------------------------------------------------


async def _drive(url: str, clients: int, start_at: float, duration: float, offset: int) -> dict[str, Any]:
    import httpx

    prompts = _prompts()
    latencies: list[float] = []
    errors: list[str] = []

    async def client(client_id: int, http: httpx.AsyncClient) -> None:
        i = offset + client_id * 7
        while time.time() < start_at + duration:
            sent = time.perf_counter()
            try:
                response = await http.post(url, json={"prompt": prompts[i % len(prompts)]})
                response.raise_for_status()
            except httpx.HTTPError as exc:
                errors.append(type(exc).__name__)
                await asyncio.sleep(0.01)
                continue
            finally:
                i += 1
            if time.time() <= start_at + duration:  # count only answers inside the window
                latencies.append(time.perf_counter() - sent)

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits, timeout=120.0) as http:
        await http.get(url.rsplit("/", 1)[0] + "/health")  # connect before the window opens
        await asyncio.sleep(max(0.0, start_at - time.time()))
        await asyncio.gather(*(client(c, http) for c in range(clients)))
    return {"latencies": latencies, "errors": errors}


def clients_main(args: argparse.Namespace) -> None:
    result = asyncio.run(_drive(args.url, args.clients, args.start_at, args.duration, args.offset))
    print(json.dumps(result))


def _measure(url: str, path: str, clients: int, duration: float) -> dict[str, Any]:
    """One slice: ``clients`` closed-loop clients in ceil(clients / 8) processes for ``duration`` s."""
    import httpx

    processes = -(-clients // CLIENTS_PER_PROCESS)
    share = [clients // processes + (p < clients % processes) for p in range(processes)]
    start_at = time.time() + 2.0  # every process imported and connected before it opens
    before = httpx.get(f"{url}/stats", timeout=30).json()
    load_before = os.getloadavg()[0]
    procs = []
    for p, n in enumerate(share):
        command = [sys.executable, "-m", "bench.generate_bench", "clients", "--url", f"{url}{path}",
                   "--clients", str(n), "--start-at", str(start_at), "--duration", str(duration),
                   "--offset", str(100 * p)]  # fmt: skip
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, cwd=Path(__file__).parents[1]))
    outputs = [json.loads(proc.communicate(timeout=duration + 180)[0]) for proc in procs]
    load_after = os.getloadavg()[0]
    after = httpx.get(f"{url}/stats", timeout=30).json()
    served_s = time.time() - start_at  # the window and the requests still in flight at its end
    policy = {}
    if before["policy"] and after["policy"]:
        policy = {
            k: after["policy"][k] - before["policy"][k] for k in ("generate_calls", "requests", "generate_s")
        }
    return {
        "processes": processes,
        "duration": duration,
        "served_s": served_s,
        "latencies": [x for out in outputs for x in out["latencies"]],
        "errors": sum(len(out["errors"]) for out in outputs),
        "loads": (load_before, load_after),
        "torch_threads": after["torch_threads"],
        "policy": policy,
    }


def _summarise(mode: str, clients: int, slices: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row from a configuration's slices (interleaved with the other modes' slices)."""
    latencies = sorted(x for s in slices for x in s["latencies"])
    duration = sum(s["duration"] for s in slices)
    loads = [x for s in slices for x in s["loads"]]
    row: dict[str, Any] = {
        "mode": mode,
        "clients": clients,
        "client_processes": slices[0]["processes"],
        "slices": len(slices),
        "seconds": duration,
        "requests": len(latencies),
        "errors": sum(s["errors"] for s in slices),
        "requests_per_s": round(len(latencies) / duration, 1),
        "slice_requests_per_s": [round(len(s["latencies"]) / s["duration"], 1) for s in slices],
        "p50_ms": round(1000 * _quantile(latencies, 0.50), 1),
        "p99_ms": round(1000 * _quantile(latencies, 0.99), 1),
        "load_1m_min": round(min(loads), 2),
        "load_1m_max": round(max(loads), 2),
        "torch_threads": slices[0]["torch_threads"],
    }
    if all(s["policy"] for s in slices):
        calls = sum(s["policy"]["generate_calls"] for s in slices)
        done = sum(s["policy"]["requests"] for s in slices)
        busy = sum(s["policy"]["generate_s"] for s in slices) / sum(s["served_s"] for s in slices)
        row.update(generate_calls=calls, mean_batch=round(done / calls, 2) if calls else None)
        row["generate_busy"] = round(busy, 2)
    return row


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


# -- the whole run ---------------------------------------------------------------------------


def _warm_up(url: str) -> None:
    import httpx

    prompts = _prompts(64)
    started = time.perf_counter()
    first = httpx.post(f"{url}/generate", json={"prompt": prompts[0]}, timeout=300)
    first.raise_for_status()  # the pool fetches the version from the registry and loads it here
    print(f"  first request (registry download + load + generate): {time.perf_counter() - started:.2f}s")

    async def burst() -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            for _ in range(2):
                await asyncio.gather(
                    *(http.post(f"{url}/generate", json={"prompt": p}) for p in prompts[:32])
                )

    asyncio.run(burst())


def run() -> dict[str, Any]:
    import torch

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="alignflow-generate-bench-") as tmp:
        work = Path(tmp)
        model_dir, dims = build_policy(work / "policy")
        uri = register_policy(model_dir, work)
        servers = {mode: _start_server(work, uri, mode) for mode in MODES}  # idle between turns
        try:
            for _, url in servers.values():
                _warm_up(url)
            for clients in CLIENT_COUNTS:
                turns = [("anchor (no model)", servers["batched"][1], "/anchor")]
                turns += [(mode, servers[mode][1], "/generate") for mode in MODES]
                slices: dict[str, list] = {mode: [] for mode, _, _ in turns}
                for round_ in range(ROUNDS):  # interleaved slices: every mode sees the same machine
                    for mode, url, path in turns:
                        slices[mode].append(_measure(url, path, clients, DURATION_S / ROUNDS))
                        got = slices[mode][-1]
                        print(f"  {clients} clients, {mode} {round_ + 1}: {len(got['latencies'])} answered")
                for mode, _, _ in turns:
                    rows.append(_summarise(mode, clients, slices[mode]))
                    print(f"  {rows[-1]}")
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(30)

    def rps(mode: str, clients: int) -> float:
        return next(r["requests_per_s"] for r in rows if r["mode"] == mode and r["clients"] == clients)

    ratio_32 = rps("batched", 32) / rps("one-by-one", 32)
    ratio_32_no_wait = rps("batched, no wait", 32) / rps("one-by-one", 32)
    report: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, no GPU"
        if not torch.cuda.is_available()
        else f"{platform.machine()}, {os.cpu_count()} CPUs, {torch.cuda.get_device_name(0)}",
        "model": "tiny Llama, demo dims: " + ", ".join(f"{k}={v}" for k, v in dims.items()),
        "max_new_tokens": MAX_NEW_TOKENS,
        "max_batch": MAX_BATCH,
        "max_wait_ms": MAX_WAIT_MS,
        "duration_s_per_config": DURATION_S,
        "slices_per_config": ROUNDS,
        "one_by_one_1_rps": rps("one-by-one", 1),
        "batched_1_rps": rps("batched", 1),
        "one_by_one_32_rps": rps("one-by-one", 32),
        "batched_32_rps": rps("batched", 32),
        "anchor_32_rps": rps("anchor (no model)", 32),
        "batched_no_wait_1_rps": rps("batched, no wait", 1),
        "batched_no_wait_32_rps": rps("batched, no wait", 32),
        "batched_over_one_by_one_32": round(ratio_32, 2),
        "batched_no_wait_over_one_by_one_32": round(ratio_32_no_wait, 2),
        "target_ratio": 3.0,
        "meets_target": ratio_32 >= 3.0,
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "generate.md").write_text(_markdown(report), encoding="utf-8")
    return report


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Policy serving: `generate` batched vs one by one",
        "",
        "Generated by `python -m bench generate` (`bench/generate_bench.py`). A uvicorn server process",
        "runs a FastAPI `POST /generate` that awaits `PolicyPool.generate` as the service's endpoint",
        "does; the policy version comes from a real MLflow registry (sqlite) and is loaded on the",
        "warm-up request. Closed-loop httpx clients in separate processes (at most "
        f"{CLIENTS_PER_PROCESS} per process), {report['duration_s_per_config']:g} s per configuration in "
        f"{report['slices_per_config']} slices, interleaved with the other modes' slices so that other work "
        "on the machine falls on every mode alike; latencies are client-side, HTTP included.",
        "",
        f"- machine: {report['machine']}; other work on it shows in the load averages below",
        f"- model: {report['model']}; weights redrawn (untrained) so greedy decoding always writes",
        f"  all {report['max_new_tokens']} new tokens (`max_new_tokens={report['max_new_tokens']}`)",
        "- one-by-one: `PolicyPool(batching=False)`, one `generate` call per request, in turn",
        f"- batched: `PolicyPool(max_batch={report['max_batch']}, max_wait_ms={report['max_wait_ms']:g})`, "
        "the service's default: a batch waits at most that long after its first prompt for more",
        "- batched, no wait: `max_wait_ms=0`: a batch takes what is queued when the worker is free",
        "- anchor: the same request body answered without a model (this machine's HTTP ceiling)",
        "",
        "| clients | mode | requests/s | per slice | p50 ms | p99 ms | mean batch | generate busy "
        "| load 1m |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        batch = "—" if r.get("mean_batch") is None else f"{r['mean_batch']:g}"
        busy = "—" if r.get("generate_busy") is None else f"{r['generate_busy']:.0%}"
        lines.append(
            f"| {r['clients']} | {r['mode']} | {r['requests_per_s']:g} "
            f"| {', '.join(f'{x:g}' for x in r['slice_requests_per_s'])} | {r['p50_ms']:g} | {r['p99_ms']:g} "
            f"| {batch} | {busy} | {r['load_1m_min']:g}–{r['load_1m_max']:g} |"
        )
    verdict = "meets" if report["meets_target"] else "**misses**"
    lines += [
        "",
        f"Batched over one-by-one at 32 clients: **{report['batched_over_one_by_one_32']:g}×** "
        f"({verdict} the target of ≥ {report['target_ratio']:g}×); with no wait: "
        f"**{report['batched_no_wait_over_one_by_one_32']:g}×**. At 1 client: one-by-one "
        f"{report['one_by_one_1_rps']:g} req/s, batched {report['batched_1_rps']:g}, "
        f"batched with no wait {report['batched_no_wait_1_rps']:g}.",
        "",
        "`mean batch` and `generate busy` (share of the time the worker thread spent inside `generate`) "
        "come from the pool's counters over the window plus the requests in flight at its end. "
        "Errors in every configuration: " + str(sum(r["errors"] for r in report["rows"])) + ".",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.generate_bench")
    sub = parser.add_subparsers(dest="command")
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--mode", choices=list(MODES), required=True)
    s.add_argument("--tracking-uri", required=True)
    s.add_argument("--cache-dir", required=True)
    s.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS)
    c = sub.add_parser("clients")
    c.add_argument("--url", required=True)
    c.add_argument("--clients", type=int, required=True)
    c.add_argument("--start-at", type=float, required=True)
    c.add_argument("--duration", type=float, required=True)
    c.add_argument("--offset", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args)
    elif args.command == "clients":
        clients_main(args)
    else:
        print(json.dumps(run(), indent=2))


if __name__ == "__main__":
    main()
