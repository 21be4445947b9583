"""The demo champion served the MLflow way answers as the evaluation measured it.

One tiny demo run (the CLI, as a user runs it) registers and crowns a policy and a reward
model; then a real ``mlflow models serve`` of ``models:/<name>@champion`` must give the
greedy completions the evaluation recorded in its ``eval/completions.json``, through a
plain prompt body and an OpenAI chat body, and the reward model's scores; the version's
model card must carry the evaluation run's figures.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient

from alignflow.models.reward_scorer import load_reward_scorer
from alignflow.registry.model_card import CARD_FILE
from alignflow.registry.models import CHAMPION, download_model_dir
from tests.flows.conftest import TINY_FLOW
from tools.serve_check import evaluation_run, invoke, recorded_completions, served, user_environment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
PROJECT = "serve-demo"
POLICY, REWARD = f"{PROJECT}-policy", f"{PROJECT}-reward"
# the tiny demo with gates a tiny model passes (the loop gate too: a tiny policy loops)
DEMO = [*TINY_FLOW, f"project={PROJECT}", "dpo.max_steps=4"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, str, dict]:
    """The tiny demo run through the CLI: its workspace, tracking URI and summary."""
    workspace = tmp_path_factory.mktemp("serve-demo")
    uri = f"sqlite:///{workspace / 'mlflow.db'}"
    sets = [arg for item in [*DEMO, f"tracking.uri={uri}"] for arg in ("--set", item)]
    alignflow = str(Path(sys.executable).parent / "alignflow")
    done = subprocess.run(
        [alignflow, "run", *sets, "--summary-json", "summary.json"],
        cwd=workspace,
        env=user_environment(workspace),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((workspace / "summary.json").read_text())
    assert summary["promotions"]["policy"]["promoted"], summary["promotions"]
    return workspace, uri, summary


def test_the_served_champion_answers_as_the_evaluation_recorded(demo):
    workspace, uri, summary = demo
    pinned = recorded_completions(uri, summary["parent_run_id"])
    prompts, recorded = [r["prompt"] for r in pinned], [r["policy"] for r in pinned]
    assert len(prompts) >= 8 and all(isinstance(p, str) for p in prompts)
    with served(f"models:/{POLICY}@{CHAMPION}", uri, workspace) as url:
        plain = invoke(url, {"dataframe_records": [{"prompt": p} for p in prompts]})
        assert plain == {"predictions": recorded}, "the evaluation's completions, the prompt not echoed"
        for prompt, expected in zip(prompts[:4], recorded, strict=False):
            chat = invoke(url, {"messages": [{"role": "user", "content": prompt}]})
            assert chat["object"] == "chat.completion"
            assert chat["choices"][0]["message"] == {"role": "assistant", "content": expected}
        one = invoke(url, {"messages": [{"role": "user", "content": prompts[0]}], "max_new_tokens": 1})
        short = one["choices"][0]["message"]["content"]
        assert short and len(short) < len(recorded[0]) and recorded[0].startswith(short)
        assert one["choices"][0]["finish_reason"] == "length"
        capped = invoke(url, {"dataframe_records": [{"prompt": prompts[0]}], "params": {"max_new_tokens": 1}})
        assert capped == {"predictions": [short]}


def test_the_served_reward_champion_scores_as_the_scorer(demo, tmp_path):
    workspace, uri, _ = demo
    prompts = ["What is 2 plus 3?", "Compute 4 + 4."]
    responses = ["The answer is 5.", "The answer is 9."]
    folder = download_model_dir(uri, REWARD, CHAMPION, tmp_path / "reward")
    expected = load_reward_scorer(folder)(prompts, responses)
    rows = [{"prompt": p, "response": r} for p, r in zip(prompts, responses, strict=True)]
    with served(f"models:/{REWARD}@{CHAMPION}", uri, workspace) as url:
        scores = invoke(url, {"dataframe_records": rows})
        raw = invoke(url, {"dataframe_records": rows, "params": {"normalize": False}})
    assert [row["reward"] for row in scores["predictions"]] == pytest.approx(expected, abs=1e-4)
    assert [row["reward"] for row in raw["predictions"]] == pytest.approx(
        load_reward_scorer(folder).raw(prompts, responses), abs=1e-4
    )


CARD_ROW = re.compile(r"^\| `(?P<key>[^`]+)` \| (?P<value>[^|]+) \| \[(?P<low>[^,]+), (?P<high>[^\]]+)\] \|")


def model_card(uri: str, name: str) -> str:
    mlflow.set_tracking_uri(uri)
    return Path(mlflow.artifacts.download_artifacts(f"models:/{name}@{CHAMPION}/{CARD_FILE}")).read_text()


def test_the_champions_card_carries_the_evaluation_runs_figures_and_decision(demo):
    _, uri, summary = demo
    card = model_card(uri, POLICY)
    metrics = MlflowClient(uri).get_run(evaluation_run(uri, summary["parent_run_id"])).data.metrics
    rows = {m["key"]: m for line in card.splitlines() if (m := CARD_ROW.match(line))}
    assert "golden/task_accuracy" in rows and "golden/reward_accuracy" not in rows, "the policy's own figures"
    for key, row in rows.items():
        for part, suffix in (("value", ""), ("low", "/low"), ("high", "/high")):
            assert float(row[part]) == pytest.approx(metrics[key + suffix], rel=1e-3), (key, part)
    front = card.split("---")[1]
    assert "license: other" in front and "base_model: tiny" in front
    assert f"data_version: {summary['data_version']}" in front
    assert "built offline" in card and "| sft |" in card and "| policy |" in card
    assert "**promoted**" in card
    assert "golden/reward_accuracy" in model_card(uri, REWARD)
