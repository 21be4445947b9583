import subprocess

import mlflow
from mlflow import MlflowClient

from alignflow.registry import runs


def test_git_commit_of_a_repo_and_of_a_plain_directory(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "f").write_text("x")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert runs.git_commit(repo) == head
    plain = tmp_path / "plain"
    plain.mkdir()
    assert runs.git_commit(plain) == "unknown"


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
