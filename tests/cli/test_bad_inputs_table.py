"""Bad inputs across the commands, each answered by one line that names its source and the fix.

Every row fails before any training: a misspelt or malformed config key (from ``--set`` or a
file, with its line and column), a missing file, an unknown format or stage, a row cut off
mid-JSON, a bad token, an unknown option or a missing argument (click's usage errors). The
answer is one ``error:`` line (for failed validation: the row's line with file:row and
column) on exit 2 (1 for failed validation), with no traceback and no library report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from alignflow.cli import app
from alignflow.cli.errors import DEBUG_ENV

GOOD = {"prompt": "What is 1 plus 1?", "chosen": "The answer is 2.", "rejected": "The answer is 3."}
CUT = '{"prompt": "What is 2 plus 2?", "chosen": "The answer is 4.", "rejected": '


@dataclass(frozen=True)
class Bad:
    args: tuple[str, ...]
    code: int
    source: str  # what the user typed or wrote, named in the answer
    fix: str  # the part of the answer that says what to do (or where exactly to look)
    env: dict[str, str] = field(default_factory=dict)
    line: str = "error: "  # how the answering line starts


ROWS = [
    Bad(("run", "--set", "dpo.betaa=0.2"), 2, "--set dpo.betaa=0.2", "did you mean dpo.beta?"),
    Bad(("run", "--config", "missing.yaml"), 2, "missing.yaml: no such config file", "leave --config out"),
    Bad(
        ("run", "--config", "typo.yaml"), 2, "typo.yaml:2:3: unknown key dpo.betaa", "did you mean dpo.beta?"
    ),
    Bad(("run", "--config", "broken.yaml"), 2, "broken.yaml:3:1: not valid YAML", "expected ',' or ']'"),
    Bad(("run", "--set", "seed"), 2, "--set seed", "write it as --set section.key=value"),
    Bad(("run", "--set", "beta=0.2"), 2, "--set beta=0.2", "did you mean one of dpo.beta"),
    Bad(
        ("data", "validate", "good.jsonl", "--set", "data.eval_fractoin=0.1"),
        2,
        "--set data.eval_fractoin=0.1",
        "did you mean data.eval_fraction?",
    ),
    Bad(("data", "validate", "good.jsonl", "--format", "xml"), 2, "--format xml", "choose one of jsonl"),
    Bad(("data", "validate", "notes.txt"), 2, "notes.txt: cannot detect the format", "pass --format one of"),
    Bad(("data", "validate", "cut.jsonl"), 1, "cut.jsonl:2", "at column 75", line="invalid_json: "),
    Bad(
        ("data", "add", "good.jsonl", "--set", "dpo.betaa=0.2"),
        2,
        "--set dpo.betaa=0.2",
        "did you mean dpo.beta?",
    ),
    Bad(
        ("data", "add", "good.jsonl", "--set", "tracking.uri=http://127.0.0.1:9"),
        2,
        "tracking.uri: http://127.0.0.1:9/health did not answer",
        "start the tracking server",
    ),
    Bad(("train", "dpo", "--set", "dpo.betaa=0.2"), 2, "--set dpo.betaa=0.2", "did you mean dpo.beta?"),
    Bad(("train", "dpoo"), 2, "train dpoo: no such stage", "did you mean dpo?"),
    Bad(("train", "sft", "--data", "missing.jsonl"), 2, "--data missing.jsonl", "alignflow data add FILE"),
    Bad(
        ("eval", "reward", "--model", "m", "--data", "good.jsonl", "--set", "dpo.betaa=0.2"),
        2,
        "--set dpo.betaa=0.2",
        "did you mean dpo.beta?",
    ),
    Bad(
        ("eval", "policy", "--model", "m", "--data", "good.jsonl", "--set", "evaluation.num_sample=3"),
        2,
        "--set evaluation.num_sample=3",
        "did you mean evaluation.num_samples?",
    ),
    Bad(
        ("promote", "--set", "promotion.max_kll=1"),
        2,
        "--set promotion.max_kll=1",
        "did you mean promotion.max_kl?",
    ),
    Bad(
        ("promote", "--tracking-uri", "sqlite:///mlflow.db"),
        2,
        "no MLflow tracking store at sqlite:///mlflow.db",
        "`alignflow run` here makes one",
    ),
    Bad(("rollback", "--set", "projectt=x"), 2, "--set projectt=x", "did you mean project?"),
    Bad(
        ("api", "--set", "ppo.max_new_token=3"),
        2,
        "--set ppo.max_new_token=3",
        "did you mean ppo.max_new_tokens?",
    ),
    Bad(
        ("api", "--token-file", "missing.txt"), 2, "--token-file missing.txt", "(or set ALIGNFLOW_API_TOKEN)"
    ),
    Bad(("api",), 2, "ALIGNFLOW_API_TOKEN", "make one with", env={"ALIGNFLOW_API_TOKEN": "short"}),
    Bad(("api", "--token", "short"), 2, "--token", "make one with"),
    # click's usage errors: the same one line, the command's --help as the fix
    Bad(("run", "--nope"), 2, "run --nope: no such option", "see `alignflow run --help`"),
    Bad(("run", "--sed", "x=1"), 2, "run --sed: no such option", "did you mean --set?"),
    Bad(("run", "--config"), 2, "run --config: requires an argument", "see `alignflow run --help`"),
    Bad(("train", "--config"), 2, "train --config: no such option", "see `alignflow train --help`"),
    Bad(("train", "dpo", "--config"), 2, "train dpo --config: requires an argument", "train dpo --help`"),
    Bad(("traffic",), 2, "traffic: missing argument AGENT", "see `alignflow traffic --help`"),
    Bad(("data", "validate"), 2, "data validate: missing argument PATH", "`alignflow data validate --help`"),
    Bad(("promote", "--role", "x"), 2, "promote --role: 'x' is not one of", "`alignflow promote --help`"),
    Bad(("data", "valdate"), 2, "data valdate: no such command", "did you mean validate?"),
    Bad(("rn",), 2, "rn: no such command", "did you mean run? see `alignflow --help`"),
]


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch) -> Path:
    """A folder holding the files the rows name; nothing may start serving."""
    import uvicorn

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: pytest.fail("a bad input reached uvicorn"))
    for name in ("ALIGNFLOW_API_TOKEN", "ALIGNFLOW_API_TOKENS", "MLFLOW_TRACKING_URI", "ALIGNFLOW_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "good.jsonl").write_text(json.dumps(GOOD) + "\n", encoding="utf-8")
    (tmp_path / "cut.jsonl").write_text(json.dumps(GOOD) + "\n" + CUT + "\n", encoding="utf-8")
    (tmp_path / "notes.txt").write_text("not data\n", encoding="utf-8")
    (tmp_path / "typo.yaml").write_text("dpo:\n  betaa: 0.2\n", encoding="utf-8")
    (tmp_path / "broken.yaml").write_text("dpo:\n  beta: [0.1\n", encoding="utf-8")
    return tmp_path


def test_the_table_covers_every_command():
    commands = {row.args[0] for row in ROWS}
    assert {"run", "data", "train", "eval", "promote", "api"} <= commands
    assert {row.args[1] for row in ROWS if row.args[0] == "data"} >= {"validate", "add"}
    assert len(ROWS) >= 15


@pytest.mark.parametrize("bad", ROWS, ids=lambda bad: " ".join(bad.args))
def test_a_bad_input_is_answered_by_one_line_naming_its_source_and_the_fix(workspace, monkeypatch, bad: Bad):
    for name, value in bad.env.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(app, list(bad.args))
    output = result.output
    assert result.exit_code == bad.code, output
    assert (
        "Traceback" not in output and "errors.pydantic.dev" not in output and "validation error" not in output
    )
    answers = [line for line in output.splitlines() if line.startswith(bad.line)]
    assert len(answers) == 1, f"not one {bad.line!r} line:\n{output}"
    assert bad.source in answers[0] and bad.fix in answers[0], answers[0]


def test_debug_adds_the_traceback(workspace, monkeypatch):
    # --debug sets ALIGNFLOW_DEBUG for the rest of the process: undone after this test, or every
    # later in-process command of this worker would print tracebacks
    monkeypatch.setenv(DEBUG_ENV, "0")
    result = CliRunner().invoke(app, ["--debug", "run", "--set", "dpo.betaa=0.2"])
    assert result.exit_code == 2
    assert "Traceback" in result.output and "extra_forbidden" in result.output
    assert (
        result.output.rstrip()
        .splitlines()[-1]
        .startswith("error: --set dpo.betaa=0.2: unknown key dpo.betaa")
    )
