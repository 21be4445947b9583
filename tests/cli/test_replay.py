"""``alignflow replay``: a registered version rebuilt from its lineage in a workspace of its own,
its weights hashed against the registry's; a version whose lineage lacks a piece is refused with
that piece named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from alignflow.flows.environment import workspace_environment
from alignflow.registry.replay import compare, read_lineage, weights_sha256
from tests.flows.conftest import TINY_FLOW

PROJECT = "replayed"
SHORT = [*TINY_FLOW, f"project={PROJECT}", "sft.max_steps=12", "reward.max_steps=6", "dpo.max_steps=6"]


def alignflow(workspace: Path, *args: str) -> subprocess.CompletedProcess:
    """The CLI in ``workspace`` as a user's shell runs it: its own store and Prefect home."""
    return subprocess.run(
        [sys.executable, "-m", "alignflow.cli", *args],
        cwd=workspace,
        env=workspace_environment(),
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("replay-workspace")
    done = alignflow(root, "run", "--quiet", *[arg for item in SHORT for arg in ("--set", item)])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root


def uri(workspace: Path) -> str:
    return f"sqlite:///{workspace / 'mlflow.db'}"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_champion_is_rebuilt_bit_for_bit_in_a_workspace_of_its_own(workspace, tmp_path):
    before = sorted(p.name for p in workspace.iterdir())
    report_path = tmp_path / "r.json"
    champion = f"models:/{PROJECT}-policy@champion"
    done = alignflow(workspace, "replay", champion, "-q", "--json", str(report_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["matches"] and report["replayed_weights"] == report["weights_sha256"]
    assert report["replayed_data_version"] == report["data_version"]
    assert "does not hash" not in done.stdout  # the logged config is the one config.hash names
    # the workspace it read from is as it was: one version, nothing written beside it
    assert sorted(p.name for p in workspace.iterdir()) == before
    assert len(MlflowClient(uri(workspace)).search_model_versions(f"name = '{PROJECT}-policy'")) == 1


@pytest.mark.slow
def test_a_version_registered_by_hand_is_refused_naming_its_missing_pipeline_run(workspace, tmp_path):
    client = MlflowClient(uri(workspace))
    client.create_registered_model("by-hand")
    client.create_model_version("by-hand", source=str(tmp_path))  # a folder, no run behind it
    done = alignflow(workspace, "replay", "models:/by-hand/1")
    assert done.returncode == 2
    message = " ".join(done.stderr.split())
    assert "cannot be replayed" in message and "pipeline run" in message and "data.version" in message


@pytest.mark.slow
def test_a_version_missing_its_code_digest_and_config_is_refused_naming_both(workspace, tmp_path):
    from urllib.parse import urlparse

    client = MlflowClient(uri(workspace))
    name = f"{PROJECT}-policy"
    version = client.get_model_version(name, "1")
    digest = version.tags["code.digest"]
    parent = client.get_run(version.run_id).data.tags["mlflow.parentRunId"]
    logged = Path(urlparse(client.get_run(parent).info.artifact_uri).path) / "config.json"
    kept = tmp_path / "config.json"
    client.delete_model_version_tag(name, "1", "code.digest")
    logged.rename(kept)
    try:
        done = alignflow(workspace, "replay", f"models:/{name}/1")
    finally:
        kept.rename(logged)
        client.set_model_version_tag(name, "1", "code.digest", digest)
    assert done.returncode == 2, done.stdout[-2000:]
    message = " ".join(done.stderr.split())
    assert "code.digest" in message and "config.json" in message


def test_one_changed_byte_changes_the_weights_hash_and_the_report_says_different(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(4)}, str(tmp_path / "model.safetensors"))
    same = weights_sha256(tmp_path)
    save_file({"w": torch.tensor([0.0, 0.0, 0.0, 1e-30])}, str(tmp_path / "model.safetensors"))
    assert weights_sha256(tmp_path) != same
    with pytest.raises(FileNotFoundError):
        weights_sha256(tmp_path / "empty")


@pytest.mark.slow
def test_the_lineage_read_back_is_what_the_run_recorded(workspace):
    lineage = read_lineage(uri(workspace), f"{PROJECT}-policy", "1")
    assert lineage.config["project"] == PROJECT and lineage.config["seed"] == 0
    assert lineage.config["sft"]["max_steps"] == 12  # the run's own settings, not the defaults
    report = compare(lineage, "0" * 64, lineage.data_version)
    assert not report.matches  # a different hash is reported as different
