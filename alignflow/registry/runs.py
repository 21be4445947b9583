"""Parent and nested stage runs in MLflow, each carrying the lineage tags.

A pipeline run is one parent run; each stage is a nested run that points to it by id, so
that a stage running in another thread, process or machine (a Prefect worker) can still
attach itself to the right parent. Every run carries ``data.version``, ``git.commit`` and
``config.hash`` so that any number in the UI can be traced to the data, code and config
that produced it.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeGuard

import mlflow
import psutil
from mlflow import MlflowClient
from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from sqlalchemy.engine import make_url

from alignflow.code_version import UNKNOWN, git_commit, package_digest
from alignflow.registry.tracking import sanitize_name

DATA_VERSION_TAG = "data.version"
# why a data version holds pairs no judge could judge (`data add --accept-unjudged`), on every
# run and model version trained on it
ACCEPTED_UNJUDGED_TAG = "data.accepted_unjudged"
GIT_COMMIT_TAG = "git.commit"
CODE_DIGEST_TAG = "code.digest"  # the alignflow source that ran (code_version.package_digest)
CONFIG_HASH_TAG = "config.hash"
GOLDEN_VERSION_TAG = "golden.version"  # the pinned evaluation set a run or version was judged on
STAGE_TAG = "alignflow.stage"
PARENT_RUN_TAG = "mlflow.parentRunId"
# host:pid:start time of the process holding a run open; a rerun continues a run whose owner died
OWNER_TAG = "alignflow.owner"
CONTINUED_TAG = "alignflow.continued_after_kill"  # how many times a killed run was taken up again
LINEAGE_TAGS = (DATA_VERSION_TAG, GIT_COMMIT_TAG, CONFIG_HASH_TAG, CODE_DIGEST_TAG)
ARTIFACT_FOLDER = "mlruns"  # beside a SQLite store, as MLflow names it in the working directory


def lineage_tags(data_version: str | None, config_hash: str | None, repo: str | Path = ".") -> dict[str, str]:
    """The tags every run and model version carries: data, config, the workspace's commit and
    the alignflow code that ran."""
    return {
        DATA_VERSION_TAG: data_version or UNKNOWN,
        GIT_COMMIT_TAG: git_commit(repo),
        CONFIG_HASH_TAG: config_hash or UNKNOWN,
        CODE_DIGEST_TAG: package_digest(),
    }


def ensure_experiment(tracking_uri: str, name: str, artifact_location: str | None = None) -> str:
    """The id of experiment ``name``, created (with ``artifact_location``) when missing.

    Without one, a local SQLite store's experiment keeps its artifacts in ``mlruns/<name>``
    beside the database file (:func:`default_artifact_location`), not in ``./mlruns`` of
    whatever directory the process happens to run in, which is MLflow's own default.
    """
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    artifact_location = artifact_location or default_artifact_location(tracking_uri, name)
    location = Path(artifact_location).resolve().as_uri() if _is_local_path(artifact_location) else None
    return client.create_experiment(name, artifact_location=location or artifact_location)


def default_artifact_location(tracking_uri: str, experiment: str) -> str | None:
    """``mlruns/<experiment>`` beside a local SQLite database file: a workspace's runs and their
    artifacts stay together whichever directory a command runs from. None for any other store
    (a tracking server or a shared database decides where its artifacts go)."""
    if not tracking_uri.startswith("sqlite:"):
        return None
    database = make_url(tracking_uri).database
    if not database or database == ":memory:":
        return None
    folder = re.sub(r"[^\w.-]+", "-", experiment).strip(".-") or "experiment"
    return str(Path(database).parent / ARTIFACT_FOLDER / folder)


def _is_local_path(location: str | None) -> TypeGuard[str]:
    return bool(location) and "://" not in str(location) and not str(location).startswith("file:")


def _string_tags(tags: Mapping[str, Any] | None) -> dict[str, str]:
    return {sanitize_name(k): str(v) for k, v in (tags or {}).items()}


def owner_tag() -> str:
    """``host:pid:start time`` of this process: which process holds a run open."""
    process = psutil.Process()
    return f"{socket.gethostname()}:{process.pid}:{process.create_time():.3f}"


def owner_gone(owner: str | None) -> bool:
    """Whether the process that opened a run is known to be gone: it ran on this host and no
    process with its pid and start time is alive (a pid reused since does not count as it).
    A run opened on another host, or before runs named their owner, is never taken over."""
    if not owner or owner.count(":") < 2:
        return False
    host, pid, started = owner.rsplit(":", 2)
    if host != socket.gethostname():
        return False
    try:
        return abs(psutil.Process(int(pid)).create_time() - float(started)) > 0.01
    except (psutil.NoSuchProcess, ValueError):
        return True


def orphaned_runs(
    client: MlflowClient, experiment_id: str, tags: Mapping[str, str], finished_too: bool = False
) -> list[Run]:
    """Runs still RUNNING whose process was killed, carrying every one of ``tags``: the runs a
    rerun of the same command continues instead of starting new ones. Newest first.
    ``finished_too``: also the runs such a process had ended before it was killed."""
    conditions = [] if finished_too else ["attributes.status = 'RUNNING'"]
    conditions += [f"tags.`{k}` = '{v}'" for k, v in tags.items()]
    found = client.search_runs(
        [experiment_id], filter_string=" and ".join(conditions), order_by=["attributes.start_time DESC"]
    )
    return [r for r in found if owner_gone(r.data.tags.get(OWNER_TAG))]


@contextmanager
def pipeline_run(
    tracking_uri: str,
    experiment: str,
    run_name: str | None = None,
    tags: Mapping[str, Any] | None = None,
    artifact_location: str | None = None,
    continue_killed: Mapping[str, str] | None = None,
) -> Iterator[Run]:
    """Start the parent run of one pipeline run (and make it the active run).

    ``continue_killed``: tags that say "the same command" (the config hash, the flow): a parent
    run with those tags left RUNNING by a killed process is continued rather than a second
    one started, so the UI shows one run, not a dead one beside its rerun.
    """
    mlflow.set_tracking_uri(tracking_uri)
    experiment_id = ensure_experiment(tracking_uri, experiment, artifact_location)
    client = MlflowClient(tracking_uri)
    killed = [
        r
        for r in (orphaned_runs(client, experiment_id, continue_killed) if continue_killed else [])
        if PARENT_RUN_TAG not in r.data.tags
    ]
    tags = {**_string_tags(tags), OWNER_TAG: owner_tag()}
    if killed:
        with mlflow.start_run(run_id=killed[0].info.run_id, tags=tags) as run:
            _count_continuation(client, killed[0])
            yield run
        return
    with mlflow.start_run(experiment_id=experiment_id, run_name=run_name, tags=tags) as run:
        yield run


def _count_continuation(client: MlflowClient, run: Run) -> None:
    """How many times a killed run was taken up again, on the run itself."""
    times = int(run.data.tags.get(CONTINUED_TAG, "0")) + 1
    client.set_tag(run.info.run_id, CONTINUED_TAG, str(times))


@contextmanager
def stage_run(
    tracking_uri: str,
    parent_run_id: str,
    stage: str,
    tags: Mapping[str, Any] | None = None,
) -> Iterator[Run]:
    """Start a stage's run nested under ``parent_run_id``, inheriting its lineage tags.

    Takes the parent by id rather than relying on MLflow's thread-local active run, so a
    stage executed by a task runner thread or a remote worker nests correctly.
    """
    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri)
    parent = client.get_run(parent_run_id)
    inherited = {k: parent.data.tags[k] for k in LINEAGE_TAGS if k in parent.data.tags}
    merged = {**inherited, STAGE_TAG: stage, **_string_tags(tags), OWNER_TAG: owner_tag()}
    # under a parent run continued after a kill, the stage's run of the killed process goes on,
    # whether the kill caught it running or it had ended: one run per stage, not one per attempt
    same_stage = {PARENT_RUN_TAG: parent_run_id, STAGE_TAG: stage}
    killed = orphaned_runs(client, parent.info.experiment_id, same_stage, finished_too=True)
    if killed:
        with mlflow.start_run(run_id=killed[0].info.run_id, nested=True, tags=merged) as run:
            _count_continuation(client, killed[0])
            yield run
        return
    with mlflow.start_run(
        experiment_id=parent.info.experiment_id,
        run_name=stage,
        nested=True,
        parent_run_id=parent_run_id,
        tags=merged,
    ) as run:
        yield run


def child_runs(tracking_uri: str, parent_run_id: str) -> list[Run]:
    """The stage runs nested under a parent run."""
    client = MlflowClient(tracking_uri)
    parent = client.get_run(parent_run_id)
    return client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent_run_id}'"
    )


def run_exists(tracking_uri: str, run_id: str) -> bool:
    """Whether the tracking store holds this run (a deleted ``mlflow.db`` or another server does not)."""
    try:
        MlflowClient(tracking_uri).get_run(run_id)
    except MlflowException:
        return False
    return True
