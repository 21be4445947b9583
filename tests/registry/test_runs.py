import mlflow
from mlflow import MlflowClient

from alignflow.registry import runs


def test_stage_runs_nest_under_the_parent_and_inherit_lineage(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tags = runs.lineage_tags("md5abc", "cfg123", repo=tmp_path)
    with runs.pipeline_run(uri, "demo", "pipeline", tags, artifact_location=str(tmp_path / "art")) as parent:
        parent_id = parent.info.run_id
        for stage in ("reward", "policy"):
            with runs.stage_run(uri, parent_id, stage) as child:
                mlflow.log_metric("train/loss", 1.0)
                assert child.info.run_id != parent_id
    children = runs.child_runs(uri, parent_id)
    assert sorted(r.data.tags[runs.STAGE_TAG] for r in children) == ["policy", "reward"]
    for child in children:
        assert child.data.tags["data.version"] == "md5abc"
        assert child.data.tags["config.hash"] == "cfg123"
        assert child.data.tags["git.commit"] == "unknown"
    experiment = MlflowClient(uri).get_experiment(parent.info.experiment_id)
    assert experiment.artifact_location.startswith((tmp_path / "art").as_uri())


def test_a_parent_run_reads_as_one_row_config_results_and_its_data(tmp_path):
    from alignflow.config import load_config
    from alignflow.registry import pipeline_record as record
    from alignflow.registry.tracking import flatten

    uri, md5 = f"sqlite:///{tmp_path}/mlflow.db", "974b9296b36eeb3bda71448ff456e0b1.dir"
    config = load_config(None, ["dpo.beta=0.2", "tracking.uri=postgresql://me:secret@db/mlflow"])
    figures = {"golden/task_accuracy": 0.6, "golden/task_accuracy/low": 0.5, "golden/task_accuracy/n": 130.0}
    figures |= {"golden/reward/win_rate_vs_champion/high": 0.7, "eval/kl_to_reference": 0.1}
    with runs.pipeline_run(uri, "demo", "first name", artifact_location=str(tmp_path / "art")) as parent:
        record.log_config(config)
        record.rename_run(uri, parent.info.run_id, record.run_name(config.project, "dpo", md5))
        record.log_data_version(tmp_path / "data", md5)
        record.log_headline_metrics({**figures, "eval/reward_margin": 2.0}, {"policy": True, "reward": False})
    run = MlflowClient(uri).get_run(parent.info.run_id)
    assert run.info.run_name == "alignflow-demo-dpo-974b929"
    params = run.data.params
    assert params["dpo.beta"] == "0.2" and params["model.name"] == config.model.name
    assert "tracking.uri" not in params, "a tracking URI may carry a password"
    assert len(params) == len(flatten(record.config_params(config))) > 100, "every key, past one batch"
    assert run.data.metrics == {**figures, "promoted/policy": 1.0, "promoted/reward": 0.0}
    (dataset,) = run.inputs.dataset_inputs
    assert dataset.dataset.digest == md5 and str(tmp_path / "data") in dataset.dataset.source
    assert {t.key: t.value for t in dataset.tags}["mlflow.data.context"] == "training"


def test_a_runs_cost_counts_a_cache_hit_at_what_it_cost_the_run_that_did_the_work(tmp_path):
    from alignflow.evaluation.cost import CPU_SECONDS, TOKENS_TRAINED, WALL_SECONDS
    from alignflow.registry.pipeline_record import cache_hit_run, run_cost

    uri, art = f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "art")
    sft_cost = {WALL_SECONDS: 60.0, CPU_SECONDS: 100.0, TOKENS_TRAINED: 5000.0}
    with (
        runs.pipeline_run(uri, "demo", "first", artifact_location=art) as first,
        runs.stage_run(uri, first.info.run_id, "sft") as sft,
    ):
        mlflow.log_metrics(sft_cost)
    with runs.pipeline_run(uri, "demo", "second", artifact_location=art) as second:
        with runs.stage_run(uri, second.info.run_id, "policy"):
            mlflow.log_metrics({WALL_SECONDS: 30.0, CPU_SECONDS: 50.0, TOKENS_TRAINED: 2000.0})
        cache_hit_run(uri, second.info.run_id, "sft", sft.info.run_id, {"train_loss": 1.0})
    spent, reused = run_cost(uri, second.info.run_id)
    assert spent == {WALL_SECONDS: 90.0, CPU_SECONDS: 150.0, TOKENS_TRAINED: 7000.0}
    assert reused == ["sft"]
    assert run_cost(uri, first.info.run_id) == (sft_cost, [])


def test_artifacts_stay_beside_a_sqlite_store_whatever_folder_the_run_starts_in(tmp_path, monkeypatch):
    workspace, elsewhere = tmp_path / "workspace", tmp_path / "elsewhere"
    workspace.mkdir(), elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    uri = f"sqlite:///{workspace / 'mlflow.db'}"
    with runs.pipeline_run(uri, "demo", "pipeline") as parent:
        mlflow.log_text("kept", "note.txt")
    experiment = MlflowClient(uri).get_experiment(parent.info.experiment_id)
    assert experiment.artifact_location == (workspace / "mlruns" / "demo").as_uri()
    assert list(workspace.glob("mlruns/demo/*/artifacts/note.txt")), "the artifact lies beside the database"
    assert not list(elsewhere.iterdir()), "nothing written where the process happened to run"


def test_default_artifact_location_only_for_a_local_sqlite_file():
    assert runs.default_artifact_location("sqlite:////srv/ws/mlflow.db", "demo") == "/srv/ws/mlruns/demo"
    assert runs.default_artifact_location("sqlite:///mlflow.db", "p-reward-eval") == "mlruns/p-reward-eval"
    assert runs.default_artifact_location("sqlite:///mlflow.db", "../team/x y") == "mlruns/team-x-y"
    for elsewhere in ("sqlite://", "sqlite:///:memory:", "postgresql://u@db/mlflow", "http://mlflow:5000"):
        assert runs.default_artifact_location(elsewhere, "demo") is None, elsewhere


KILLED_MID_STAGE = """
import os, signal, sys
import mlflow
from alignflow.registry import runs
uri, same = sys.argv[1], {"config.hash": "cfg123", "alignflow.pipeline": "retrain"}
with runs.pipeline_run(uri, "demo", "pipeline", {**same}, continue_killed=same) as parent:
    with runs.stage_run(uri, parent.info.run_id, "data"):
        mlflow.log_metric("data/train", 100.0)
    with runs.stage_run(uri, parent.info.run_id, "sft"):
        mlflow.log_metric("train/loss", 3.0, step=1)
        mlflow.log_metric("train/loss", 2.0, step=2)
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_rerun_after_a_sigkill_continues_the_killed_parent_and_stage_runs(tmp_path):
    import subprocess
    import sys

    uri, same = f"sqlite:///{tmp_path}/mlflow.db", {"config.hash": "cfg123", "alignflow.pipeline": "retrain"}
    killed = subprocess.run([sys.executable, "-c", KILLED_MID_STAGE, uri], cwd=tmp_path, check=False)
    assert killed.returncode == -9
    client = MlflowClient(uri)
    found = client.search_runs([client.get_experiment_by_name("demo").experiment_id])
    statuses = sorted((r.data.tags.get(runs.STAGE_TAG, "parent"), r.info.status) for r in found)
    assert statuses == [("data", "FINISHED"), ("parent", "RUNNING"), ("sft", "RUNNING")]  # what a kill leaves
    [left] = [r for r in found if runs.STAGE_TAG not in r.data.tags]
    [data_run] = [r for r in found if r.data.tags.get(runs.STAGE_TAG) == "data"]

    with runs.pipeline_run(uri, "demo", "pipeline", same, continue_killed=same) as parent:
        with runs.stage_run(uri, parent.info.run_id, "data") as data:  # the rerun does it again
            pass
        with runs.stage_run(uri, parent.info.run_id, "sft") as stage:
            mlflow.log_metric("train/loss", 1.0, step=3)
        with runs.stage_run(uri, parent.info.run_id, "reward"):
            pass
    every = client.search_runs([parent.info.experiment_id])
    assert len(every) == 4 and {r.info.status for r in every} == {"FINISHED"}  # one run per stage
    by_stage = {r.data.tags.get(runs.STAGE_TAG): r for r in every}
    assert by_stage[None].info.run_id == left.info.run_id == parent.info.run_id
    assert by_stage["data"].info.run_id == data.info.run_id == data_run.info.run_id
    assert by_stage["sft"].info.run_id == stage.info.run_id
    assert (
        by_stage[None].data.tags[runs.CONTINUED_TAG] == by_stage["sft"].data.tags[runs.CONTINUED_TAG] == "1"
    )
    assert runs.CONTINUED_TAG not in by_stage["reward"].data.tags
    steps = client.get_metric_history(stage.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in steps] == [(1, 3.0), (2, 2.0), (3, 1.0)]  # one run, one counter


def test_runs_of_a_live_process_another_host_or_another_config_are_not_taken_over(tmp_path):
    import socket

    uri, same = f"sqlite:///{tmp_path}/mlflow.db", {"config.hash": "cfg123", "alignflow.pipeline": "retrain"}
    client = MlflowClient(uri)
    experiment = runs.ensure_experiment(uri, "demo")
    dead_pid = f"{socket.gethostname()}:999999999:1.000"
    owners = {
        "alive": runs.owner_tag(),  # this very process: a run in progress elsewhere in it
        "elsewhere": "another-host:12:1.000",
        "other config": dead_pid,
    }
    for name, owner in owners.items():
        config = {"config.hash": "other"} if name == "other config" else {"config.hash": "cfg123"}
        client.create_run(
            experiment, run_name=name, tags={**config, "alignflow.pipeline": "retrain", runs.OWNER_TAG: owner}
        )
    with runs.pipeline_run(uri, "demo", "new", same, continue_killed=same) as parent:
        pass
    assert client.get_run(parent.info.run_id).info.run_name == "new"
    assert len(client.search_runs([experiment], "attributes.status = 'RUNNING'")) == 3


def test_a_process_is_gone_when_its_pid_is_free_or_taken_by_a_later_process():
    import os
    import socket

    import psutil

    host, me = socket.gethostname(), psutil.Process()
    assert not runs.owner_gone(runs.owner_tag())
    assert runs.owner_gone(f"{host}:{os.getpid()}:{me.create_time() - 60:.3f}")  # the pid was reused
    assert runs.owner_gone(f"{host}:999999999:1.000")
    assert not runs.owner_gone("another-host:1:1.000") and not runs.owner_gone(None)
