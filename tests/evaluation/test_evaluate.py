import json

import mlflow
import pytest
import torch

from alignflow.data.answers import correctness_reward, format_answer, format_reward
from alignflow.data.demo import iter_demo_pairs
from alignflow.data.split import distinct_prompt_rows
from alignflow.evaluation import evaluate, plots
from alignflow.evaluation.challenger import judge_policy_completions
from alignflow.evaluation.config import EvaluationConfig
from alignflow.evaluation.intervals import Estimate, put_estimate
from alignflow.evaluation.judges import RewardModelJudge
from alignflow.evaluation.report import EvalReport, read_report, samples_table, write_report
from alignflow.models import load_causal_lm
from alignflow.promotion import gates, promotion_config
from alignflow.registry.tracking import log_report


def answer_scorer(answers):
    """A stand-in reward model that knows the demo task: right and formatted scores highest."""
    lookup = dict(answers)

    def score(prompts, completions):
        return [
            2 * correctness_reward(c, lookup[p]) + format_reward(c)
            for p, c in zip(prompts, completions, strict=True)
        ]

    return score


@pytest.fixture(scope="module")
def eval_records():
    return [{**r, "kind": "pair"} for r in iter_demo_pairs(120, seed=7)]


@pytest.fixture(scope="module")
def scorer(eval_records):
    return answer_scorer((r["prompt"], r["metadata"]["answer"]) for r in eval_records)


def test_reward_model_evaluation_ranks_held_out_pairs(eval_records, scorer):
    report = evaluate.evaluate_reward_model(scorer, eval_records)
    assert report.metrics["eval/reward_accuracy"] == 1.0
    flipped = evaluate.evaluate_reward_model(lambda p, c: [-s for s in scorer(p, c)], eval_records)
    assert flipped.metrics["eval/reward_accuracy"] == 0.0
    assert len(report.series["reward/chosen"]) == len(eval_records)


def _pinned_decision(prompts, metadata, policy, reference, champion, scorer):
    """The promotion decision on these completions, judged by answers and a champion reward model."""
    pinned = judge_policy_completions(
        prompts,
        [m["answer"] for m in metadata],
        policy,
        reference,
        champion,
        judges={"champion_reward": RewardModelJudge(scorer)},
    )
    config = promotion_config.PromotionConfig()
    return gates.decide("p", "2", pinned.gate_metrics(), config, "policy", "1", ["champion_reward"])


def test_worse_challenger_completions_fail_the_champion_gate(eval_records, scorer):
    rows = distinct_prompt_rows(eval_records, 40)
    prompts, metadata = [r["prompt"] for r in rows], [r["metadata"] for r in rows]
    right = [format_answer(m["answer"]) for m in metadata]
    wrong = [format_answer(m["answer"] + 1) for m in metadata]
    sloppy = [f"I think {m['answer']}" for m in metadata]
    config = EvaluationConfig(primary_judge="answer")
    report = evaluate.evaluate_policy_completions(
        prompts, metadata, wrong, sloppy, right, scorer, config=config, pair_records=eval_records
    )
    assert report.metrics["eval/win_rate_vs_champion"] == 0.0
    assert report.metrics["eval/reward/win_rate_vs_champion"] == 0.0
    assert report.metrics["eval/task_accuracy"] == 0.0
    assert report.metrics["eval/champion_task_accuracy"] == 1.0
    decision = _pinned_decision(prompts, metadata, wrong, sloppy, right, scorer)
    assert {r.name for r in decision.failed} == {
        "task_accuracy_gain",
        "task_accuracy_vs_champion",
        "champion_reward_win_rate_vs_champion",
        "slice_regression",  # wrong on every item: every slice of the pinned prompts broke
    }

    better = evaluate.evaluate_policy_completions(
        prompts, metadata, right, sloppy, wrong, scorer, config=config, pair_records=eval_records
    )
    assert better.metrics["eval/win_rate_vs_champion"] == 1.0
    assert better.metrics["eval/task_accuracy_gain"] == 1.0
    assert better.metrics["eval/normalised_reward"] > report.metrics["eval/normalised_reward"]
    promoted = _pinned_decision(prompts, metadata, right, sloppy, wrong, scorer)
    assert promoted.promoted, promoted.reason


def test_length_blow_up_is_reported(eval_records):
    rows = distinct_prompt_rows(eval_records, 10)
    prompts, metadata = [r["prompt"] for r in rows], [r["metadata"] for r in rows]
    short = [format_answer(m["answer"]) for m in metadata]
    long = [s + " " + "and so on " * 10 for s in short]
    report = evaluate.evaluate_policy_completions(prompts, metadata, long, short, judges=[])
    assert report.metrics["eval/length_growth_ratio"] > 3


@pytest.mark.slow
def test_policy_evaluation_on_tiny_models_is_deterministic_and_kl_sees_drift(
    tiny_model_dir, eval_records, scorer, tmp_path
):
    policy, tokenizer = load_causal_lm(tiny_model_dir)
    reference, _ = load_causal_lm(tiny_model_dir)
    config = EvaluationConfig(max_prompts=12, kl_samples=8, max_new_tokens=6, num_samples=5)
    first = evaluate.evaluate_policy(policy, tokenizer, reference, eval_records, scorer, config=config)
    again = evaluate.evaluate_policy(policy, tokenizer, reference, eval_records, scorer, config=config)
    assert first.samples == again.samples and len(first.samples) == 5
    assert first.metrics["eval/kl_to_reference"] == pytest.approx(0.0, abs=1e-6)
    assert first.metrics["eval/reward/win_rate_vs_reference"] == 0.5  # identical greedy completions tie

    torch.manual_seed(1)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5 * torch.randn_like(p))
    drifted = evaluate.evaluate_policy(policy, tokenizer, reference, eval_records, scorer, config=config)
    assert drifted.metrics["eval/kl_to_reference"] > 0.1

    paths = write_report(drifted, tmp_path / "report")
    assert read_report(paths["json"]).metrics == drifted.metrics
    assert "eval/kl_to_reference" in paths["markdown"].read_text()
    assert list(samples_table(drifted)) == ["prompt", "policy", "reference", "answer"]


def test_report_plots_and_mlflow_logging(tmp_path, eval_records, scorer):
    report = evaluate.evaluate_reward_model(scorer, eval_records).merge(
        EvalReport(
            metrics={"eval/win_rate_vs_reference": 0.7, "eval/kl_to_reference": None},
            samples=[{"prompt": "p", "policy": "a|b", "reference": "c"}],
            series={"length/policy": [3.0, 4.0], "length/reference": [3.0, 3.0]},
        )
    )
    figures = plots.report_plots(report, tmp_path / "plots")
    assert sorted(figures) == ["response_lengths", "reward_distributions", "win_rates"]
    assert all(p.stat().st_size > 1000 for p in figures.values())

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.set_tracking_uri(uri)
    experiment = mlflow.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    with mlflow.start_run(experiment_id=experiment) as run:
        for step, loss in enumerate([3.0, 2.0, 1.0]):
            mlflow.log_metric("train/loss", loss, step=step)
        log_report(report, tmp_path / "out", figures)
    client = mlflow.MlflowClient(uri)
    logged = client.get_run(run.info.run_id).data.metrics
    assert logged["eval/win_rate_vs_reference"] == 0.7 and "eval/kl_to_reference" not in logged
    files = {a.path for a in client.list_artifacts(run.info.run_id, "eval")}
    assert {"eval/eval_report.json", "eval/eval_report.md", "eval/samples.json"} <= files
    table = json.loads(
        (tmp_path / "art" / run.info.run_id / "artifacts" / "eval" / "samples.json").read_text()
    )
    assert table["columns"] == ["prompt", "policy", "reference"]
    curves = plots.plot_learning_curves(uri, {"sft": run.info.run_id}, tmp_path / "curves.png")
    assert curves is not None and curves.stat().st_size > 1000


def test_learning_curves_are_the_logged_histories_of_each_stage(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    sft, policy, empty = (client.create_run(experiment).info.run_id for _ in range(3))
    for step, loss in [(2, 1.0), (0, 3.0), (1, 2.0)]:
        client.log_metric(sft, "train/loss", loss, step=step, timestamp=1000 + step)
    client.log_metric(sft, "train/loss", 2.0, step=2, timestamp=2000)  # the run's mean, logged at its end
    for step, reward in enumerate([0.2, 0.5]):
        client.log_metric(policy, "train/reward", reward, step=step)
    client.log_metric(policy, "eval/loss", 0.4, step=2)  # one point: not a curve
    client.log_metric(policy, "train/grad_norm", 1.0, step=1)  # not a learning curve
    client.log_metric(empty, "train/loss", 1.0, step=0)

    curves = plots.learning_curves(uri, {"sft": sft, "policy": policy, "reward": empty})
    assert [(stage, key, steps, values) for stage, key, steps, values in curves] == [
        ("sft", "train/loss", [0, 1, 2], [3.0, 2.0, 1.0]),
        ("policy", "train/reward", [0, 1], [0.2, 0.5]),
    ]
    assert plots.plot_learning_curves(uri, {"reward": empty}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def test_a_ppo_stage_curve_shows_its_held_out_reward_and_the_step_it_handed_on(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = mlflow.MlflowClient(uri)
    ppo = client.create_run(
        client.create_experiment("e", artifact_location=(tmp_path / "a").as_uri())
    ).info.run_id
    for step in range(1, 7):
        client.log_metric(ppo, "train/reward/mean", step / 10, step=step)
    for step, held_out in [(2, 0.6), (4, 0.8), (6, 0.5)]:  # the training reward climbs, held-out falls late
        client.log_metric(ppo, "eval/reward", held_out, step=step)
    client.log_metric(ppo, "ppo/handed_on_step", 4.0)  # as the PPO stage logs it
    lines: list[float] = []
    real_axvline = Axes.axvline
    monkeypatch.setattr(
        Axes, "axvline", lambda ax, x, *a, **k: lines.append(x) or real_axvline(ax, x, *a, **k)
    )
    assert plots.plot_learning_curves(uri, {"policy": ppo}, tmp_path / "curves.png") is not None
    keys = [key for _, key, _, _ in plots.learning_curves(uri, {"policy": ppo})]
    assert keys == ["train/reward/mean", "eval/reward"] and lines == [4, 4]


def test_the_win_rate_plot_draws_rates_with_their_intervals_never_counts(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    drawn = []
    barh = Axes.barh

    def spy(self, labels, widths, *args, **kwargs):
        drawn.append((list(labels), list(widths), kwargs.get("xerr")))
        return barh(self, labels, widths, *args, **kwargs)

    monkeypatch.setattr(Axes, "barh", spy)
    pinned: dict[str, float | None] = {"golden/task_accuracy": 0.6}
    put_estimate(pinned, "golden/reward/win_rate_vs_reference", Estimate(0.7, 0.6, 0.85, 120, "bootstrap"))
    report = EvalReport(metrics={**pinned, "eval/win_rate_vs_reference": 0.65})
    figures = plots.report_plots(report, tmp_path / "plots")
    assert figures["win_rates"].stat().st_size > 1000
    ((labels, widths, xerr),) = drawn
    assert labels == ["golden/reward/win_rate_vs_reference", "win_rate_vs_reference"], "rates only"
    assert widths == [0.7, 0.65] and all(0 <= w <= 1 for w in widths), "no row count drawn as a bar"
    assert xerr[0] == pytest.approx([0.1, 0.0]) and xerr[1] == pytest.approx([0.15, 0.0]), "the 95% interval"


def test_the_evaluation_table_keeps_every_pinned_prompt_with_each_completion_and_verdict(
    eval_records, scorer
):
    """Not a sample: a user looking for the prompts the challenger got wrong finds every one."""
    from alignflow.tasks.evaluation import completions_table

    rows = distinct_prompt_rows(eval_records, 60)
    prompts, answers = [r["prompt"] for r in rows], [r["metadata"]["answer"] for r in rows]
    right = [format_answer(a) for a in answers]
    wrong = [format_answer(a + 1) if i % 3 == 0 else format_answer(a) for i, a in enumerate(answers)]
    assert len(prompts) > EvaluationConfig().num_samples
    judges = {"champion_reward": RewardModelJudge(scorer)}
    report = judge_policy_completions(prompts, answers, wrong, right, right, judges=judges)
    table = completions_table(report.samples)
    assert table["prompt"] == prompts, "one row per pinned prompt, in order"
    assert {"policy", "reference", "champion", "policy_correct", "champion_correct"} <= set(table)
    assert {"champion_reward: policy vs reference", "champion_reward: policy vs champion"} <= set(table)
    policy, champion = table["policy_correct"], table["champion_correct"]
    lost = [p for i, p in enumerate(prompts) if champion[i] and not policy[i]]
    assert lost == prompts[::3], "every item the challenger got wrong and the champion right"


def test_each_model_answers_a_prompt_once_per_evaluation(tiny_model_dir, eval_records, monkeypatch):
    """The pinned set is frozen from the first eval split: evaluating both must not generate
    the same prompts twice, and what is remembered is what the model says."""
    policy, tokenizer = load_causal_lm(tiny_model_dir)
    reference, _ = load_causal_lm(tiny_model_dir)
    config = EvaluationConfig(max_new_tokens=4)
    prompts = [r["prompt"] for r in distinct_prompt_rows(eval_records, 6)]
    asked: list[tuple[int, list]] = []
    generate = evaluate.generate_answers

    def counted(model, tok, batch, cfg):
        asked.append((id(model), list(batch)))
        return generate(model, tok, batch, cfg)

    monkeypatch.setattr(evaluate, "generate_answers", counted)
    complete = evaluate.RememberedAnswers(config)
    first = complete(policy, tokenizer, prompts[:4])
    both = complete(policy, tokenizer, prompts)
    theirs = complete(reference, tokenizer, prompts)

    assert both[:4] == first and both == generate(policy, tokenizer, prompts, config)
    assert theirs == generate(reference, tokenizer, prompts, config)
    assert [(m, len(b)) for m, b in asked] == [(id(policy), 4), (id(policy), 2), (id(reference), 6)]
    assert asked[1][1] == prompts[4:]
