"""``alignflow doctor``: check the services a configured run would use, in plain words."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx
import typer
from rich.console import Console
from rich.table import Table

MIN_FREE_DISK_GB = 5.0


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _http_ok(url: str) -> tuple[bool, str]:
    try:
        response = httpx.get(url, timeout=3.0)
    except httpx.HTTPError as exc:
        return False, f"{url} did not answer ({exc.__class__.__name__})"
    return response.status_code < 400, f"{url} answered {response.status_code}"


def check_prefect() -> Check:
    api = os.environ.get("PREFECT_API_URL")
    if not api:
        return Check("Prefect", True, "no PREFECT_API_URL: runs use the ephemeral API in-process")
    ok, detail = _http_ok(api.rstrip("/") + "/health")
    return Check("Prefect", ok, detail, "start `prefect server start` or fix PREFECT_API_URL")


def check_mlflow(uri: str) -> Check:
    parsed = urlparse(uri)
    if parsed.scheme in {"http", "https"}:
        ok, detail = _http_ok(uri.rstrip("/") + "/health")
        return Check("MLflow", ok, detail, "start the tracking server (mlflow/README.md) or fix the URI")
    if parsed.scheme == "sqlite":
        folder = Path(uri.removeprefix("sqlite:///")).resolve().parent
        ok = os.access(folder, os.W_OK)
        return Check("MLflow", ok, f"SQLite store in {folder}", f"make {folder} writable")
    if parsed.scheme.startswith("postgresql"):
        return Check("MLflow", True, f"database store {parsed.hostname}:{parsed.port or 5432} (not probed)")
    return Check(
        "MLflow", False, f"unsupported tracking URI {uri!r}", "use sqlite:///mlflow.db or http://host:5000"
    )


def check_dvc(remote: str | None) -> Check:
    if shutil.which("dvc") is None:
        return Check("DVC", False, "the dvc command is not on PATH", "pip install dvc (make install does it)")
    if remote is None:
        return Check("DVC", True, "local remote under .alignflow/dvc-remote (created on first `data add`)")
    if "://" not in remote:
        folder = Path(remote)
        ok = folder.exists() or os.access(folder.parent, os.W_OK)
        return Check("DVC", ok, f"local remote {folder}", f"create {folder} or make its parent writable")
    result = subprocess.run(["dvc", "version"], capture_output=True, text=True, check=False)
    scheme = remote.split("://", 1)[0]
    ok = scheme in result.stdout or scheme in {"ssh", "http", "https"}
    return Check("DVC", ok, f"remote {remote}", f"pip install 'dvc[{scheme}]' for this remote")


def check_gpus() -> Check:
    import torch

    if not torch.cuda.is_available():
        return Check("GPUs", True, "none: training runs on the CPU (fine for the demo config)")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    bf16 = torch.cuda.is_bf16_supported()
    return Check("GPUs", True, f"{len(names)} x {names[0]}, bf16 {'yes' if bf16 else 'no'}")


def check_disk(path: str = ".") -> Check:
    free_gb = shutil.disk_usage(path).free / 1e9
    ok = free_gb >= MIN_FREE_DISK_GB
    return Check("Disk", ok, f"{free_gb:.1f} GB free in {Path(path).resolve()}", "free space for checkpoints")


def run_checks(config_path: str | None, overrides: list[str]) -> list[Check]:
    from alignflow.config import load_config

    config = load_config(config_path, overrides)
    return [
        check_prefect(),
        check_mlflow(config.tracking.resolved_uri()),
        check_dvc(config.data.remote),
        check_gpus(),
        check_disk(),
    ]


def register(app: typer.Typer) -> None:
    @app.command()
    def doctor(
        config: str = typer.Option(None, "--config", "-c", help="pipeline config YAML"),
        overrides: list[str] = typer.Option([], "--set", help="key=value overrides"),
    ) -> None:
        """Check the Prefect API, MLflow, the DVC remote, GPUs and disk; say how to fix what is missing."""
        checks = run_checks(config, overrides)
        table = Table("check", "status", "detail", "how to fix")
        for item in checks:
            status = "[green]ok[/]" if item.ok else "[red]missing[/]"
            table.add_row(item.name, status, item.detail, "" if item.ok else item.fix)
        Console().print(table)
        raise typer.Exit(0 if all(c.ok for c in checks) else 1)
