"""The commit a run or a bench result names: the checkout's, or "unknown" outside one."""

import subprocess

from alignflow.code_version import git_commit


def test_git_commit_of_a_repo_and_of_a_plain_directory(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "f").write_text("x")
    subprocess.run([*git, "add", "f"], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert git_commit(repo) == head
    plain = tmp_path / "plain"
    plain.mkdir()
    assert git_commit(plain) == "unknown"
