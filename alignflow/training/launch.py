"""Run a training stage in this process, or across processes through ``accelerate launch``.

With ``orchestration.num_processes == 1`` a stage is a plain function call. With more, the
parent starts ``accelerate launch --num_processes N [--config_file ...] -m
alignflow.training.launch ...``: every worker process calls the same ``run_<stage>``
(the Trainer inside finds the process group accelerate set up: DDP by default, gloo on
CPU, NCCL on GPUs, FSDP/DeepSpeed through an accelerate config file), and the parent reads
the :class:`StageResult` that the main process wrote to ``output_dir/result.json``.

Only the main process writes into ``output_dir``. Every rank must take part in saving a
checkpoint (the Trainer exchanges counters then), and the stages write their staging
folders, final model and ``result.json`` unconditionally; so each other rank runs in a
private ``output_dir/.ranks/<rank>`` (removed after a successful run) that starts from the
main folder's checkpoints.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from alignflow.training.registry import stage_spec
from alignflow.training.run_settings import RunSettings

if TYPE_CHECKING:  # the stage modules import torch: load them only when a stage runs
    from alignflow.training.stage import StageResult

logger = logging.getLogger(__name__)

WORKER_MODULE = "alignflow.training.launch"
LAUNCH_DIR = ".launch"
RANKS_DIR = ".ranks"
LOG_TAIL = 4000
RUN_ID_ENV = "MLFLOW_RUN_ID"


def launch_stage(
    stage_name: str,
    config: RunSettings,
    data_dir: str | Path,
    output_dir: str | Path,
    model_path: str | Path | None = None,
) -> StageResult:
    """Run ``stage_name`` with ``config.orchestration.num_processes`` processes; returns its result."""
    processes = config.orchestration.num_processes
    if processes > 1 and not stage_spec(stage_name).distributed:
        logger.warning("stage %s has no multi-process trainer: running it in one process", stage_name)
        processes = 1
    if processes == 1:
        return stage_spec(stage_name).load_runner()(config, data_dir, output_dir, model_path)
    return launch_processes(stage_name, config, data_dir, output_dir, model_path)


def launch_processes(
    stage_name: str,
    config: RunSettings,
    data_dir: str | Path,
    output_dir: str | Path,
    model_path: str | Path | None = None,
) -> StageResult:
    """Run the stage under ``accelerate launch`` and read back what the main process wrote."""
    output_dir = Path(output_dir).resolve()
    launch_dir = output_dir / LAUNCH_DIR
    launch_dir.mkdir(parents=True, exist_ok=True)
    start = shared_start_model(config, data_dir, output_dir, model_path)
    config_path = launch_dir / "config.json"
    config_path.write_text(json.dumps(config.model_dump(mode="json")), encoding="utf-8")
    from alignflow.training.stage import RESULT, StageResult

    (output_dir / RESULT).unlink(missing_ok=True)  # never read back a previous run's result

    worker = worker_arguments(stage_name, config, config_path, data_dir, output_dir, start)
    command = accelerate_command(
        config.orchestration.num_processes, config.orchestration.accelerate_config, worker
    )
    log_path = launch_dir / "launch.log"
    with log_path.open("wb") as log:
        completed = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, env=worker_env(), check=False
        )
    if completed.returncode != 0 or not (output_dir / RESULT).exists():
        tail = log_path.read_text(errors="replace")[-LOG_TAIL:]
        raise RuntimeError(
            f"stage {stage_name!r} under accelerate ({config.orchestration.num_processes} processes) "
            f"exited {completed.returncode}; log {log_path}:\n{tail}"
        )
    shutil.rmtree(output_dir / RANKS_DIR, ignore_errors=True)
    return StageResult.read(output_dir)


def shared_start_model(
    config: RunSettings, data_dir: str | Path, output_dir: Path, model_path: str | Path | None
) -> str | None:
    """Build the tiny base model once, before the workers start, so that all ranks load it.

    Left to the workers, each would build (and write) its own copy at the same time.
    """
    if model_path is not None or config.model.name != "tiny":
        return None if model_path is None else str(model_path)
    from alignflow.data.snapshot import load_split
    from alignflow.training.stage import resolve_start_model

    return resolve_start_model(config.model, load_split(data_dir, "train"), output_dir, None)


def worker_arguments(
    stage_name: str,
    config: RunSettings,
    config_path: Path,
    data_dir: str | Path,
    output_dir: Path,
    model_path: str | None,
) -> list[str]:
    """The worker's command line; the config travels as JSON plus the class that reads it back."""
    arguments = [
        "-m", WORKER_MODULE,
        "--stage", stage_name,
        "--config", str(config_path),
        "--config-class", f"{type(config).__module__}:{type(config).__qualname__}",
        "--data-dir", str(Path(data_dir).resolve()),
        "--output-dir", str(output_dir),
    ]  # fmt: skip
    if model_path is not None:
        arguments += ["--model-path", str(model_path)]
    return arguments


def accelerate_command(num_processes: int, config_file: str | None, worker: list[str]) -> list[str]:
    """``accelerate launch`` for ``num_processes`` local processes.

    With a config file, the file decides the strategy (DDP, FSDP, DeepSpeed) and the count
    given here wins over its ``num_processes``. Without one it is plain DDP: accelerate's
    multi-process launcher (torchrun), which on a machine without GPUs joins the processes
    with gloo because the stages train with ``use_cpu`` there.
    """
    from alignflow.registry.server import free_port

    command = [sys.executable, "-m", "accelerate.commands.launch"]
    if config_file:
        command += ["--config_file", str(Path(config_file).resolve())]
    else:
        command += ["--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no"]
    command += [
        "--num_processes", str(num_processes),
        "--num_machines", "1",
        "--main_process_port", str(free_port()),
    ]  # fmt: skip
    return command + worker


def worker_env() -> dict[str, str]:
    """The parent's environment plus its MLflow run, which the main worker logs into."""
    env = dict(os.environ)
    try:
        import mlflow

        run = mlflow.active_run()
        if run is not None:
            env["MLFLOW_TRACKING_URI"] = mlflow.get_tracking_uri()
            env[RUN_ID_ENV] = run.info.run_id
    except ImportError:  # pragma: no cover - mlflow is a dependency
        pass
    return env


# ---------------------------------------------------------------- worker side


def process_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def rank_output_dir(output_dir: Path, rank: int) -> Path:
    """A non-main rank's private folder that resumes from the main folder's checkpoints.

    Its ``checkpoints`` holds links to the complete shared checkpoints, so every rank
    resumes at the same step; what the rank saves itself (its RNG state) stays private.
    """
    from alignflow.training.checkpoints import CHECKPOINTS, is_complete_checkpoint

    private = output_dir / RANKS_DIR / str(rank)
    checkpoints = private / CHECKPOINTS
    shutil.rmtree(checkpoints, ignore_errors=True)  # removes the links, never their targets
    checkpoints.mkdir(parents=True)
    shared = output_dir / CHECKPOINTS
    for checkpoint in sorted(shared.glob("checkpoint-*")) if shared.is_dir() else []:
        if is_complete_checkpoint(checkpoint):
            (checkpoints / checkpoint.name).symlink_to(checkpoint, target_is_directory=True)
    return private


def run_worker(
    stage_name: str, config: RunSettings, data_dir: str, output_dir: Path, model_path: str | None
) -> StageResult:
    """One rank's share of the stage; rank 0 logs into the parent's MLflow run."""
    rank = process_rank()
    runner = stage_spec(stage_name).load_runner()
    if rank != 0:
        return runner(config, data_dir, rank_output_dir(output_dir, rank), model_path)
    run_id = os.environ.get(RUN_ID_ENV)
    if not run_id:
        return runner(config, data_dir, output_dir, model_path)
    import mlflow

    with mlflow.start_run(run_id=run_id):
        return runner(config, data_dir, output_dir, model_path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one process of a training stage under accelerate launch")
    parser.add_argument("--stage", required=True, help="a registered training stage")
    parser.add_argument("--config", required=True, help="the pipeline config as JSON")
    parser.add_argument("--config-class", required=True, help="module:Class of the pipeline config")
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--model-path", default=None)
    args = parser.parse_args(argv)

    module, _, name = args.config_class.partition(":")
    config_class = getattr(importlib.import_module(module), name)
    config = config_class.model_validate_json(Path(args.config).read_text(encoding="utf-8"))
    run_worker(args.stage, config, args.data_dir, Path(args.output_dir), args.model_path)


if __name__ == "__main__":
    main()
