"""Serve a registered policy the MLflow way and hold its answers against its evaluation's.

    python -m tools.serve_check --tracking-uri sqlite:///mlflow.db --model demo-policy [--alias champion]

Starts ``mlflow models serve -m models:/<model>@<alias> --env-manager local`` on a free loopback
port, reads the greedy completions the version's own evaluation recorded for the pinned prompts
(``eval/completions.json`` of the evaluate run beside the run that registered it), asks the
server for the same prompts as plain strings (one request) and as OpenAI chat bodies (one each),
and once with ``max_new_tokens: 1``; prints how many answers are the recorded ones and how long
each part took, on which CPU. Exit 0 when every answer is the recorded one, 1 otherwise.
``tests/registry/test_policy_serving.py`` uses the same pieces on the tiny demo champion.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import requests

STARTUP_SECONDS = 240
CHAT_PROMPTS = 8  # chat bodies go one prompt a request: a few are enough to compare
REQUEST_TIMEOUT_S = 1800


def user_environment(workspace: Path) -> dict[str, str]:
    """The user's shell: no tracking URI or Prefect API of the caller's (a test session's)."""
    foreign = ("MLFLOW_TRACKING_URI", "PREFECT_API_", "PYTEST_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(foreign)}
    return env | {"PREFECT_HOME": str(workspace / "prefect-home"), "HF_HUB_OFFLINE": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def served(model_uri: str, tracking_uri: str, workspace: Path) -> Iterator[str]:
    """``mlflow models serve`` of ``model_uri`` on a free loopback port; yields its base URL,
    and stops it (its whole process group) whatever happens."""
    port = free_port()
    log = workspace / f"serve-{port}.log"
    command = [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri]
    command += ["--env-manager", "local", "-p", str(port)]
    # MLflow's scoring server gives up on a request after 60 s by default: a real model on a
    # CPU answers a whole pinned set in one request (as the evaluation batched it) more slowly
    env = user_environment(workspace) | {
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S),
    }
    with log.open("w") as output:
        server = subprocess.Popen(
            command, cwd=workspace, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_ping(url, server, log)
        yield url
    finally:
        with suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def wait_for_ping(url: str, server: subprocess.Popen, log: Path) -> None:
    began = time.monotonic()
    while time.monotonic() - began < STARTUP_SECONDS:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        with suppress(requests.ConnectionError):
            if requests.get(f"{url}/ping", timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"not serving after {STARTUP_SECONDS}s:\n{log.read_text()[-3000:]}")


def invoke(url: str, body: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
    answer = requests.post(f"{url}/invocations", json=body, timeout=timeout)
    if answer.status_code != 200:
        raise RuntimeError(f"/invocations answered {answer.status_code}: {answer.text[-2000:]}")
    return answer.json()


def evaluation_run(tracking_uri: str, pipeline_run: str) -> str:
    """The evaluate stage's run under ``pipeline_run``."""
    from alignflow.registry.runs import STAGE_TAG, child_runs

    runs = child_runs(tracking_uri, pipeline_run)
    return next(r.info.run_id for r in runs if r.data.tags.get(STAGE_TAG) == "evaluate")


def recorded_completions(tracking_uri: str, pipeline_run: str) -> list[dict]:
    """The evaluation's pinned prompts with the policy's greedy completions, in its order."""
    import mlflow

    from alignflow.tasks.evaluation import COMPLETIONS_TABLE

    mlflow.set_tracking_uri(tracking_uri)
    table = mlflow.artifacts.load_dict(
        f"runs:/{evaluation_run(tracking_uri, pipeline_run)}/{COMPLETIONS_TABLE}"
    )
    rows = [dict(zip(table["columns"], row, strict=True)) for row in table["data"]]
    return [{"prompt": r["prompt"], "policy": r["policy"]} for r in rows]


def version_pipeline_run(tracking_uri: str, name: str, alias: str) -> tuple[str, str]:
    """The version ``name@alias`` points to and the pipeline run that registered it."""
    from mlflow import MlflowClient

    from alignflow.registry.lineage import producing_pipeline_run

    version = MlflowClient(tracking_uri).get_model_version_by_alias(name, alias)
    run = producing_pipeline_run(tracking_uri, version)
    if run is None:
        raise SystemExit(f"{name}@{alias} (version {version.version}) has no pipeline run: nothing recorded")
    return str(version.version), run


def chat_answer(url: str, prompt: str, **params: object) -> dict:
    return invoke(url, {"messages": [{"role": "user", "content": prompt}], **params})["choices"][0]


def check(tracking_uri: str, name: str, alias: str, workspace: Path) -> dict:
    """Every figure of the check, read from the server's answers and the recorded table."""
    version, pipeline_run = version_pipeline_run(tracking_uri, name, alias)
    pinned = recorded_completions(tracking_uri, pipeline_run)
    prompts, recorded = [r["prompt"] for r in pinned], [r["policy"] for r in pinned]
    began = time.perf_counter()
    with served(f"models:/{name}@{alias}", tracking_uri, workspace) as url:
        startup_s = time.perf_counter() - began
        began = time.perf_counter()
        plain = invoke(url, {"dataframe_records": [{"prompt": p} for p in prompts]})["predictions"]
        plain_s = time.perf_counter() - began
        began = time.perf_counter()
        chats = [chat_answer(url, p)["message"]["content"] for p in prompts[:CHAT_PROMPTS]]
        chat_s = time.perf_counter() - began
        one = chat_answer(url, prompts[0], max_new_tokens=1)
    differ = [i for i, (got, want) in enumerate(zip(plain, recorded, strict=True)) if got != want]
    short = one["message"]["content"]
    return {
        "model": f"{name}@{alias} (version {version})",
        "prompts": len(prompts),
        "plain_same": len(prompts) - len(differ),
        "plain_differ": [{"prompt": prompts[i], "recorded": recorded[i], "served": plain[i]} for i in differ],
        "chat_same": sum(got == want for got, want in zip(chats, recorded, strict=False)),
        "chat_asked": len(chats),
        "max_new_tokens_1": {
            "answer": short,
            "finish_reason": one["finish_reason"],
            "honoured": bool(short) and len(short) < len(recorded[0]) and recorded[0].startswith(short),
        },
        "seconds": {"startup": round(startup_s, 1), "plain": round(plain_s, 1), "chat": round(chat_s, 1)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tracking-uri", default="sqlite:///mlflow.db")
    parser.add_argument("--model", required=True, help="registered model name, e.g. smollm2-math-policy")
    parser.add_argument("--alias", default="champion")
    args = parser.parse_args(argv)
    from bench.training_bench import machine

    result = check(args.tracking_uri, args.model, args.alias, Path.cwd()) | {"machine": machine()}
    print(json.dumps(result, indent=2))
    same = result["plain_same"] == result["prompts"] and result["chat_same"] == result["chat_asked"]
    return 0 if same and result["max_new_tokens_1"]["honoured"] else 1


if __name__ == "__main__":
    sys.exit(main())
