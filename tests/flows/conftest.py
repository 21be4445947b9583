"""One Prefect test API per session (its start-up is slow) and a fast pipeline config."""

from __future__ import annotations

import pytest

# the demo's own training steps (a minute on two cores: fewer leave the SFT reference unable
# to state an answer, and DPO on it degenerates); smaller data and evaluation for speed
FAST_OVERRIDES = [
    # the demo's 500 SFT steps buy its pinned accuracy (>= 0.9 on every seed tried); these
    # tests check wiring, caching and gates, which a 250-step SFT model passes as well at twice
    # the demo's step size (the demo's 1.5e-3 buys margin on every sum over 500 steps)
    "sft.max_steps=250",
    "sft.learning_rate=0.003",
    "data.demo_rows=1000",
    "data.demo_scored_rows=200",
    "evaluation.max_pairs=100",
    "evaluation.kl_samples=8",
    "evaluation.primary_judge=answer",
]

# the demo made tiny, a few steps a stage (the policy's own steps are the caller's): for tests
# of what a run shows and records, not of what it learns
TINY_FLOW = [
    "data.demo_rows=400",
    "data.demo_scored_rows=50",
    "sft.max_steps=30",
    "reward.max_steps=10",
    "evaluation.max_prompts=16",
    "evaluation.max_pairs=20",
    "evaluation.kl_samples=4",
    # a tiny model cannot pass the demo's gates; these let it be judged, registered and crowned
    "promotion.min_judged_rows=1",
    "promotion.min_task_accuracy_gain=null",
    "promotion.min_win_rate_vs_reference=null",
    "promotion.max_length_growth=null",
    "promotion.min_reward_accuracy=null",
]


@pytest.fixture(scope="session", autouse=True)
def prefect_api(tmp_path_factory):
    from alignflow.flows.environment import apply_defaults

    apply_defaults(tmp_path_factory.mktemp("prefect-project"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield
