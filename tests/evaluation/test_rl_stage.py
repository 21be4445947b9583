"""The RL stage judged against the model it started from, on real model outputs, and said in one line."""

import pytest
import torch

from alignflow.data.demo import iter_demo_pairs
from alignflow.evaluation.config import EvaluationConfig
from alignflow.evaluation.evaluate import evaluate_on_golden
from alignflow.evaluation.intervals import Estimate, put_estimate
from alignflow.evaluation.report import EvalReport, to_markdown
from alignflow.evaluation.rl_stage import NOTHING_MEASURABLE, rl_gain_line
from alignflow.models import load_causal_lm
from tests.evaluation.test_evaluate import answer_scorer

CONFIG = EvaluationConfig(max_prompts=12, max_new_tokens=6, kl_samples=0)


@pytest.fixture(scope="module")
def golden_records():
    return [{**r, "kind": "pair"} for r in iter_demo_pairs(60, seed=11)]


def moved(model, seed: int):
    """The model with its weights moved at random (an untrained tiny model says nothing at all)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    """A policy, a separately loaded copy of it as its RL start, and a base model that differs."""
    model, tokenizer = load_causal_lm(tiny_model_dir)
    start = moved(load_causal_lm(tiny_model_dir)[0], seed=1)
    return (moved(model, seed=1), tokenizer), start, moved(load_causal_lm(tiny_model_dir)[0], seed=2)


def measured(golden_records, policy, reference, rl_start) -> EvalReport:
    scorer = answer_scorer((r["prompt"], r["metadata"]["answer"]) for r in golden_records)
    return evaluate_on_golden(golden_records, policy, reference, scorer, config=CONFIG, rl_start=rl_start)


@pytest.mark.slow
def test_a_policy_identical_to_its_rl_start_gains_exactly_nothing_over_it(golden_records, models):
    policy, start, base = models
    report = measured(golden_records, policy, base, start)
    metrics = report.metrics
    assert metrics["golden/rl_start_is_reference"] == 0.0
    assert (metrics["golden/rl_gain"], metrics["golden/rl_gain/low"], metrics["golden/rl_gain/high"]) == (
        0.0,
        0.0,
        0.0,
    )
    assert metrics["golden/rl_gain/n"] == 12
    assert metrics["golden/rl_start_task_accuracy"] == metrics["golden/task_accuracy"]
    assert metrics["golden/length_growth_vs_rl_start"] == 1.0, "the same greedy completions"
    assert metrics["golden/reward/win_rate_vs_rl_start"] == 0.5, "every row a tie"
    assert metrics["golden/length_growth_ratio"] != 1.0, "the base model answers otherwise"
    assert all(row["policy"] for row in report.samples), "each completion says something"
    assert [row["rl_start"] for row in report.samples] == [row["policy"] for row in report.samples]
    assert rl_gain_line(metrics).startswith(
        f"{NOTHING_MEASURABLE}: task accuracy gain +0.000 [0.000, 0.000] n=12"
    )
    assert NOTHING_MEASURABLE in to_markdown(report)


@pytest.mark.slow
def test_an_rl_start_that_is_the_reference_is_generated_and_judged_once(golden_records, models):
    policy, _, base = models
    metrics = measured(golden_records, policy, base, base).metrics
    assert metrics["golden/rl_start_is_reference"] == 1.0
    for suffix in ("", "/low", "/high", "/n"):
        assert metrics[f"golden/rl_gain{suffix}"] == metrics[f"golden/task_accuracy_gain{suffix}"]
        assert (
            metrics[f"golden/reward/win_rate_vs_rl_start{suffix}"]
            == (metrics[f"golden/reward/win_rate_vs_reference{suffix}"])
        )
    assert "its start is the reference model itself" in rl_gain_line(metrics)


def test_without_an_rl_start_nothing_is_said_about_one(golden_records, models):
    policy, _, base = models
    metrics = measured(golden_records, policy, base, None).metrics
    assert not [k for k in metrics if "rl_" in k]
    assert rl_gain_line(metrics) is None


def figures(**estimates: Estimate) -> dict[str, float | None]:
    metrics: dict[str, float | None] = {}
    for name, estimate in estimates.items():
        put_estimate(metrics, f"golden/{name.replace('__', '/')}", estimate)
    return metrics


def test_a_gain_whose_interval_clears_zero_is_said_with_its_interval():
    line = rl_gain_line(figures(rl_gain=Estimate(0.08, 0.03, 0.13, 215, "paired_bootstrap")))
    assert line is not None and line.startswith(
        "RL stage over its start: task accuracy gain +0.080 [0.030, 0.130] n=215"
    )


@pytest.mark.parametrize("low", [0.0, -0.02])
def test_an_interval_that_reaches_zero_or_below_says_rl_added_nothing_measurable(low):
    line = rl_gain_line(figures(rl_gain=Estimate(0.03, low, 0.08, 215, "paired_bootstrap")))
    assert line is not None and line.startswith(f"{NOTHING_MEASURABLE}: task accuracy gain +0.030 [")


def test_without_answers_each_judges_win_rate_against_the_start_says_it_and_a_tie_is_no_gain():
    tied = figures(champion_reward__win_rate_vs_rl_start=Estimate(0.55, 0.48, 0.62, 400, "bootstrap"))
    assert rl_gain_line(tied).startswith(
        f"{NOTHING_MEASURABLE}: champion_reward win rate 0.550 [0.480, 0.620] n=400"
    )
    preferred = figures(champion_reward__win_rate_vs_rl_start=Estimate(0.62, 0.57, 0.67, 400, "bootstrap"))
    assert rl_gain_line(preferred).startswith("RL stage over its start: champion_reward win rate 0.620")
