"""``alignflow eval reward`` on real files: the shared HH-RLHF test split, a file with bad
rows, and a registered model whose evaluation lands on its version in MLflow."""

from __future__ import annotations

import json

import mlflow
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from alignflow.cli import app

runner = CliRunner()


def _invoke(*args: str):
    return runner.invoke(app, ["eval", "reward", *args], catch_exceptions=False)


def _evaluate(model_dir, data, out, *args: str):
    """``eval reward`` of ``data`` into ``out``: the CLI result and the report it wrote."""
    result = _invoke("--model", str(model_dir), "--data", str(data), "--output", str(out), *args)
    path = out / "report.json"
    return result, json.loads(path.read_text()) if path.exists() else None


def test_reward_model_on_the_hh_rlhf_test_split(hh_rlhf_path, reward_model_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "out"
    result = _invoke(
        "--model",
        str(reward_model_dir),
        "--data",
        str(hh_rlhf_path),
        "--max-rows",
        "60",
        "--output",
        str(out),
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert (out / "report.md").read_text().startswith("# Reward evaluation on `hh-rlhf-harmless-base-test`")
    assert report["benchmark"]["name"] == "hh-rlhf-harmless-base-test"
    assert len(report["benchmark"]["sha256"]) == 64 and report["benchmark"]["max_rows"] == 60
    rows = report["rows"]
    assert rows["read"] == 60 and rows["valid"] + rows["quarantined"] == 60
    assert rows["scored"] == report["pairs"] == report["accuracy"]["n"] > 50
    accuracy = report["accuracy"]
    assert 0.0 <= accuracy["low"] <= accuracy["value"] <= accuracy["high"] <= 1.0
    assert accuracy["high"] - accuracy["low"] < 0.35  # ~55 pairs: a Wilson interval about ±0.13
    assert 0.0 <= report["ece"] <= 1.0 and report["reward_std"] > 0.0
    bias = report["length_bias"]
    assert bias["chosen_longer"]["n"] + bias["chosen_shorter"]["n"] + bias["equal_length"] == rows["scored"]
    assert bias["chosen_longer"]["n"] > 0 and bias["chosen_shorter"]["n"] > 0
    assert bias["gap"] == pytest.approx(abs(bias["chosen_longer"]["value"] - bias["chosen_shorter"]["value"]))
    assert -1.0 <= bias["spearman_reward_length"] <= 1.0 and bias["responses"] == 2 * rows["scored"]
    assert report["model"]["path"] == str(reward_model_dir) and report["tracking"] is None
    assert report["metrics"]["reward_accuracy/n"] == float(rows["scored"])
    assert "reward_accuracy" in result.output and "length_bias/gap" in result.output


def _bad_rows_file(path):
    good = [
        {
            "prompt": f"What is {i} plus 1?",
            "chosen": f"The answer is {i + 1}.",
            "rejected": f"No {i}",
            "topic": t,
        }
        for i, t in zip(range(6), ["math", "math", "math", "chat", "chat", "chat"], strict=True)
    ]
    for row in good[3:]:  # chosen shorter than rejected: both sides of the length split
        row["rejected"] = f"I would rather not answer {row['prompt']!r} at all."
    bad = [
        {"prompt": "Missing a side?", "chosen": "Only this one."},
        {"prompt": "A boolean?", "chosen": True, "rejected": "no"},
        {"prompt": "Empty chosen?", "chosen": "  ", "rejected": "no"},
    ]
    lines = [json.dumps(r) for r in good[:3] + bad + good[3:]] + ['{"prompt": "broken']
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bad_rows_are_quarantined_counted_and_reported(reward_model_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    data, out = _bad_rows_file(tmp_path / "mixed.jsonl"), tmp_path / "out"
    result, report = _evaluate(reward_model_dir, data, out, "--subset-column", "topic")
    assert result.exit_code == 0, result.output
    rows = report["rows"]
    assert (rows["read"], rows["scored"], rows["quarantined"]) == (10, 6, 4)
    assert rows["quarantined_by_reason"] == {
        "empty_field": 1,
        "invalid_json": 1,
        "missing_field": 1,
        "non_string_field": 1,
    }
    where = {(q["row"], q["code"], q["field"]) for q in rows["quarantined_rows"]}
    assert where == {
        (4, "missing_field", "rejected"),
        (5, "non_string_field", "chosen"),
        (6, "empty_field", "chosen"),
        (10, "invalid_json", None),
    }
    assert all(q["file"] == str(data) for q in rows["quarantined_rows"])
    assert report["exit_code"] == 0 and report["accuracy"]["n"] == 6
    assert {k: g["pairs"] for k, g in report["subsets"]["groups"].items()} == {"chat": 3, "math": 3}
    assert "quarantined non_string_field: 1" in result.output
    assert f"{data}:5 [chosen]" in result.output
    assert "`non_string_field`" in (out / "report.md").read_text()


def test_a_file_of_only_bad_rows_exits_1_with_the_reasons(reward_model_dir, tmp_path):
    data, out = tmp_path / "all-bad.jsonl", tmp_path / "out"
    data.write_text('{"prompt": "q", "chosen": true, "rejected": "no"}\n{"prompt": "q", "chosen": "a"}\n')
    result = _invoke("--model", str(reward_model_dir), "--data", str(data), "--output", str(out))
    assert result.exit_code == 1
    assert "no valid pair rows" in result.output
    report = json.loads((out / "report.json").read_text())
    assert report["exit_code"] == 1 and report["rows"]["quarantined"] == 2 and report["rows"]["scored"] == 0


def test_usage_errors_exit_2(reward_model_dir, tmp_path):
    assert _invoke("--model", str(reward_model_dir), "--data", str(tmp_path / "nope.jsonl")).exit_code == 2
    data = _bad_rows_file(tmp_path / "mixed.jsonl")
    assert _invoke("--model", str(tmp_path / "no-model"), "--data", str(data)).exit_code == 2
    hub = _invoke("--model", "OpenAssistant/reward-model-deberta-v3-large-v2", "--data", str(data))
    assert hub.exit_code == 2 and "huggingface-cli download OpenAssistant/reward-model" in hub.output
    assert (
        _invoke("--model", str(reward_model_dir), "--data", str(data), "--set", "data.nope=1").exit_code == 2
    )


def test_a_policy_given_as_the_reward_model_exits_2_naming_it(tiny_model_dir, tmp_path):
    """A causal LM would load as a classifier with a random head and score noise: refused instead."""
    data = _bad_rows_file(tmp_path / "mixed.jsonl")
    result = _invoke("--model", str(tiny_model_dir), "--data", str(data), "--output", str(tmp_path / "out"))
    assert result.exit_code == 2
    assert "not a reward model" in result.output and "score.weight" in result.output
    assert not (tmp_path / "out" / "report.json").exists()


def test_column_mapping_reaches_the_reader(reward_model_dir, tmp_path):
    data, out = tmp_path / "mapped.jsonl", tmp_path / "out"
    rows = [{"question": f"q{i}?", "good": f"good answer {i}", "bad": f"bad {i}"} for i in range(4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mapping = ["--set", "data.column_mapping.question=prompt", "--set", "data.column_mapping.good=chosen"]
    mapping += ["--set", "data.column_mapping.bad=rejected"]
    result = _invoke("--model", str(reward_model_dir), "--data", str(data), "--output", str(out), *mapping)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "report.json").read_text())["rows"]["scored"] == 4


def test_a_benchmark_coding_its_winner_as_an_index_is_read_with_preferred_values(reward_model_dir, tmp_path):
    """PKU-SafeRLHF codes the better response as 0/1, which the default reading leaves ambiguous."""
    data, out = tmp_path / "pku.jsonl", tmp_path / "out"
    rows = [{"prompt": f"q{i}?", "response_0": f"answer {i}", "response_1": f"other {i}"} for i in range(6)]
    for i, row in enumerate(rows):
        row["better_response_id"] = i % 2
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mapping = ["--set", "data.column_mapping.response_0=response_a"]
    mapping += ["--set", "data.column_mapping.response_1=response_b"]
    mapping += ["--set", "data.column_mapping.better_response_id=preferred"]
    args = ["--model", str(reward_model_dir), "--data", str(data), "--output", str(out), *mapping]

    result = _invoke(*args)  # 0 names no response by default: those rows are quarantined, not guessed
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())["rows"]
    assert (report["scored"], report["quarantined_by_reason"]) == (3, {"bad_label": 3})
    assert "data.preferred_values" in report["quarantined_rows"][0]["message"]

    result = _invoke(*args, "--set", "data.preferred_values.0=a", "--set", "data.preferred_values.1=b")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())["rows"]
    assert (report["scored"], report["quarantined"]) == (6, 0)


def test_a_webgpt_shaped_benchmark_reads_nested_prompts_and_per_answer_scores(reward_model_dir, tmp_path):
    """WebGPT comparisons nest the question's text and score each answer -1/0/+1."""
    data, out = tmp_path / "webgpt.jsonl", tmp_path / "out"
    rows = [
        {
            "question": {"dataset": "eli5", "full_text": f"Why is the sky blue, part {i}?"},
            "answer_0": f"Rayleigh scattering, part {i}.",
            "answer_1": f"No idea {i}",
            "score_0": [1.0, -1.0, 0.0][i % 3],
            "score_1": [-1.0, 1.0, 0.0][i % 3],
        }
        for i in range(9)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = {
        "data.column_mapping.question.full_text": "prompt",
        "data.column_mapping.answer_0": "response_a",
        "data.column_mapping.answer_1": "response_b",
        "data.column_mapping.score_0": "preferred",
        "data.preferred_values.1": "a",
        "data.preferred_values.-1": "b",
        "data.preferred_values.0": "tie",
    }
    args = [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]
    result = _invoke("--model", str(reward_model_dir), "--data", str(data), "--output", str(out), *args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["rows"]["scored"] == 6 and report["rows"]["quarantined_by_reason"] == {"tie": 3}


def test_a_benchmark_of_rated_responses_is_paired_per_prompt(reward_model_dir, tmp_path):
    """HelpSteer2 rates each response 0-4: pairs come from two ratings of one prompt."""
    data, out = tmp_path / "helpsteer2.jsonl", tmp_path / "out"
    rows = [
        {"prompt": f"Question {i}?", "response": f"Answer {i}{side}, rated {rating}", "helpfulness": rating}
        for i in range(5)
        for side, rating in (("a", i), ("b", 4 - i % 3))
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--model", str(reward_model_dir), "--data", str(data), "--output", str(out)]
    args += ["--set", "data.column_mapping.helpfulness=score"]

    result = _invoke(*args)  # ratings above 1 are off the default [0, 1] scale: no pair is left
    assert result.exit_code == 1, result.output
    rows_report = json.loads((out / "report.json").read_text())["rows"]
    assert rows_report["quarantined_by_reason"] == {"score_out_of_range": 8}
    assert "outside [0, 1] (data.score_range)" in result.output

    result = _invoke(*args, "--set", "data.score_range=[0, 4]")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["pairs"] == 4 and report["rows"]["scored"] == 8  # question 2 is rated 2 twice
    assert report["rows"]["valid_not_scored"] == 2 and report["rows"]["quarantined"] == 0
    assert -1.0 <= report["scored_responses"]["spearman_reward_score"] <= 1.0
    assert "scored/spearman_reward_score" in result.output


def test_benchmarks_that_rank_several_responses_per_prompt(reward_model_dir, tmp_path):
    """RewardBench 2 lists one chosen and three rejected answers; Nectar ranks its answers."""
    data, out = tmp_path / "rewardbench2.jsonl", tmp_path / "out"
    rows = [
        {
            "id": f"rb-{i}",
            "prompt": f"What is {i} plus 1?",
            "chosen": [f"The answer is {i + 1}."],
            "rejected": [f"The answer is {i + 2}.", f"No {i}", f"It is {i}."],
            "subset": ["Math", "Focus"][i % 2],
        }
        for i in range(6)
    ]
    rows.append({"id": "rb-bad", "prompt": "Broken?", "chosen": ["Yes."], "rejected": ["No.", 3]})
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result, report = _evaluate(reward_model_dir, data, out, "--subset-column", "subset")
    assert result.exit_code == 0, result.output
    assert report["rows"]["scored"] == 6 and report["pairs"] == 18
    assert (
        report["rows"]["quarantined_rows"][0]["message"] == "'rejected[1]' is int, expected text or messages"
    )
    best = report["ranked"]["best_of_n_accuracy"]
    assert best["n"] == 6 and 0.0 <= best["low"] <= best["value"] <= best["high"] <= 1.0
    assert set(report["subsets"]["groups"]) == {"Focus", "Math"}
    assert report["subsets"]["groups"]["Math"]["best_of_n_accuracy"]["n"] == 3
    assert "ranked/best_of_n_accuracy" in result.output

    nectar = tmp_path / "nectar.jsonl"
    answers = ["I can help with that.", "Sure, here it is.", "No."]
    rows = [
        {
            "prompt": f"\n\nHuman: Help me with task {i}\n\nAssistant:",
            "answers": [
                {"answer": f"{a} ({i})", "model": f"m{k}", "rank": k + 1} for k, a in enumerate(answers)
            ],
        }
        for i in range(4)
    ]
    nectar.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result, _ = _evaluate(reward_model_dir, nectar, out)  # unmapped, `answers` is just another column
    assert result.exit_code == 1, result.output
    result, report = _evaluate(
        reward_model_dir, nectar, out, "--set", "data.column_mapping.answers=responses"
    )
    assert result.exit_code == 0, result.output
    assert report["pairs"] == 12 and report["ranked"]["rows"] == 4 and report["rows"]["quarantined"] == 0


@pytest.mark.slow
def test_evaluation_run_lands_on_the_registered_version(reward_model_dir, tmp_path, monkeypatch):
    from alignflow.registry import models

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow.set_tracking_uri(uri)
    experiment = MlflowClient(uri).create_experiment("demo", str(tmp_path / "art"))
    with mlflow.start_run(experiment_id=experiment):  # not set_experiment: later tests get a fresh store
        logged = models.log_model(reward_model_dir, uri, "demo-reward")
    data, out = _bad_rows_file(tmp_path / "mixed.jsonl"), tmp_path / "out"
    result = _invoke(
        "--model", "models:/demo-reward@challenger", "--data", str(data), "--output", str(out),
        "--tracking-uri", uri, "--name", "mixed-bench",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    client = MlflowClient(uri)
    version = client.get_model_version("demo-reward", logged.version)
    model_id = version.model_id or version.source.removeprefix("models:/")  # the SQL store keeps the source
    assert model_id.startswith("m-") and report["model"]["model_id"] == model_id
    run_id = report["tracking"]["run_id"]
    assert version.tags["eval.mixed-bench.run_id"] == run_id

    # the logged model lists the benchmark's figures, from this run, on this dataset
    logged_model = client.get_logged_model(model_id)
    on_bench = {m.key: m for m in logged_model.metrics if m.run_id == run_id}
    accuracy = on_bench["mixed-bench/reward_accuracy"]
    assert accuracy.value == pytest.approx(report["accuracy"]["value"])
    assert accuracy.dataset_name == "mixed-bench" and accuracy.dataset_digest
    assert on_bench["mixed-bench/rows/quarantined"].value == 4.0
    assert "mixed-bench/length_bias/gap" in on_bench

    # the run names the model as its input and the benchmark as its dataset
    run = client.get_run(run_id)
    assert [i.model_id for i in run.inputs.model_inputs] == [model_id]
    assert [d.dataset.name for d in run.inputs.dataset_inputs] == ["mixed-bench"]
    assert run.data.tags["alignflow.eval.model"] == f"demo-reward/{logged.version}"
    assert run.info.experiment_id == logged_model.experiment_id
    artifacts = {a.path for a in client.list_artifacts(run_id, "eval/mixed-bench")}
    assert artifacts == {"eval/mixed-bench/report.json", "eval/mixed-bench/report.md"}


def test_a_failure_while_scoring_exits_3_not_1(reward_model_dir, tmp_path, monkeypatch):
    """Exit 1 means "nothing to evaluate"; a crash in the middle must not be read as that."""
    from alignflow.evaluation import benchmark

    def breaks(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(benchmark, "evaluate_reward_benchmark", breaks)
    data = _bad_rows_file(tmp_path / "mixed.jsonl")
    result = runner.invoke(app, ["eval", "reward", "--model", str(reward_model_dir), "--data", str(data)])
    assert result.exit_code == 3
    assert "evaluation failed: RuntimeError: CUDA out of memory (simulated)" in result.output
