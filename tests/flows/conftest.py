"""One Prefect test API per session (its start-up is slow) and a fast pipeline config."""

from __future__ import annotations

import pytest

# the demo's own training steps (a minute on two cores: fewer leave the SFT reference unable
# to state an answer, and DPO on it degenerates); smaller data and evaluation for speed
FAST_OVERRIDES = [
    # the demo's 500 SFT steps buy its pinned accuracy (>= 0.9 on every seed tried); these
    # tests check wiring, caching and gates, which a 250-step SFT model passes as well
    "sft.max_steps=250",
    "data.demo_rows=1000",
    "data.demo_scored_rows=200",
    "evaluation.max_pairs=100",
    "evaluation.kl_samples=8",
    "evaluation.primary_judge=answer",
]


@pytest.fixture(scope="session", autouse=True)
def prefect_api(tmp_path_factory):
    from flows.environment import apply_defaults

    apply_defaults(tmp_path_factory.mktemp("prefect-project"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield
