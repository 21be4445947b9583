"""Training jobs: the feedback export, the launcher interface and the background runner.

The service never trains inside a request. It freezes the agent's feedback into an export
file, records a job, and hands both to a :class:`TrainingLauncher` on a worker thread.
Which launcher runs is the caller's choice: :class:`~alignflow.service.local_launcher.LocalTrainingLauncher`
trains with the library directly; the CLI layer can inject one that runs the Prefect flow.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from alignflow.service.storage import Feedback, Store

log = logging.getLogger(__name__)
MAX_ERROR_CHARS = 500


class TrainingRequest(BaseModel):
    """Everything a launcher needs to train one policy for one agent."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    agent_id: str
    dataset_path: Path  # the JSONL export of the agent's feedback
    output_dir: Path  # where the launcher writes models for this job
    feedback_count: int
    max_steps: int  # the policy stage's, as resolved from config + request
    learning_rate: float
    algorithm: str = "dpo"
    overrides: tuple[str, ...] = ()  # pipeline-config overrides: feedback plan + request fields
    model_config_: dict[str, Any] = {}
    timing_tags: dict[str, str] = {}  # what the dry-run estimate matches later runs on


class TrainingOutcome(BaseModel):
    """What a finished job reports; the API returns it under camelCase names."""

    policy_id: str
    version: str
    model_path: str
    reward_model_path: str | None = None
    feedback_count: int
    training_steps: int
    reward_mean: float | None = None
    reward_std: float | None = None
    data_version: str | None = None
    promoted: bool | None = None  # None: the launcher does not gate (no champion alias moved)


@runtime_checkable
class TrainingLauncher(Protocol):
    """Runs one training job to the end (on a worker thread) and says what it produced."""

    def launch(self, request: TrainingRequest) -> TrainingOutcome: ...


def feedback_record(row: Feedback, policy_version: str | None = None) -> dict[str, Any]:
    """A stored row as a canonical record of the data contract (scored or pairwise).

    ``policy_version``: the served version that wrote the rated response, when the rating
    carries the ``runId`` of a completion this service served.
    """
    meta = {"agent_id": row.agent_id, "feedback_id": row.id}
    if row.run_id:
        meta["run_id"] = row.run_id
    if policy_version:
        meta["policy_version"] = policy_version
    if row.notes:
        meta["notes"] = row.notes
    base = {"id": row.id, "prompt": row.prompt, "source": f"feedback:{row.agent_id}"}
    if row.kind == "pairwise":
        return {**base, "chosen": row.chosen, "rejected": row.rejected, "metadata": meta}
    return {
        **base,
        "response": row.response,
        "score": row.score,
        "agent_id": row.agent_id,
        "run_id": row.run_id,
        "notes": row.notes,
        "metadata": meta,
    }


def export_feedback(store: Store, agent_id: str, path: Path) -> tuple[int, str]:
    """Write the agent's feedback as JSONL (atomically); returns (rows, sha256 of the file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    digest, count = hashlib.sha256(), 0
    served = store.served_versions(agent_id)
    with tmp.open("w", encoding="utf-8") as handle:
        for row in store.iter_feedback(agent_id):
            record = feedback_record(row, served.get(row.run_id or ""))
            line = json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n"
            handle.write(line)
            digest.update(line.encode("utf-8"))
            count += 1
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)
    return count, digest.hexdigest()


def _client_safe(exc: BaseException) -> str:
    """One line for the job record: the exception's type and message, never a traceback."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text[:MAX_ERROR_CHARS]


class JobRunner:
    """Runs launchers on a small thread pool and records each job's progress in the store."""

    def __init__(self, store: Store, launcher: TrainingLauncher | None, workers: int = 1):
        self.store = store
        self.launcher = launcher
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="alignflow-train")
        self.futures: dict[str, Future] = {}

    def submit(self, request: TrainingRequest) -> Future:
        future = self._pool.submit(self._run, request)
        self.futures[request.job_id] = future
        return future

    def _run(self, request: TrainingRequest) -> None:
        if not self.store.update_job(request.job_id, "queued", status="running"):
            return  # failed meanwhile (e.g. marked abandoned): nothing to run
        try:
            if self.launcher is None:
                raise RuntimeError("this service has no training launcher configured")
            outcome = self.launcher.launch(request)
        except Exception as exc:  # the job fails; the service stays up
            log.exception("training job %s for agent %s failed", request.job_id, request.agent_id)
            self.store.update_job(request.job_id, "running", status="failed", error=_client_safe(exc))
            return
        # a job already failed by a restart keeps that verdict
        self.store.update_job(
            request.job_id, "running", status="trained", result=outcome.model_dump(mode="json")
        )

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=not wait)
