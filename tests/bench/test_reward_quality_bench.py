"""The reward-quality bench's ensemble arithmetic: the members' mean margin decides, lengths split it."""

from __future__ import annotations

import pytest

from bench.reward_quality_bench import ENSEMBLES, VARIANTS, ensemble, summarise


def _member(margins, minutes=1.0):
    return {"eval_margins": margins, "minutes": minutes, "cpu_minutes": 2 * minutes}


# chosen longer, longer, shorter, shorter
LENGTHS = [[30, 10], [40, 20], [5, 50], [8, 80]]


def test_the_mean_margin_decides_each_pair():
    # alone 0.5 and 0.25; where they disagree the more confident member wins (means 0.75, 1, 0.4, -1)
    members = [_member([2.0, -1.0, 1.0, -1.0]), _member([-0.5, 3.0, -0.2, -1.0], minutes=2.0)]
    result = ensemble(members, LENGTHS)
    assert result["accuracy"] == pytest.approx(0.75)
    assert result["accuracy_chosen_longer"] == pytest.approx(1.0)
    assert result["accuracy_chosen_shorter"] == pytest.approx(0.5)
    assert result["minutes"] == 3.0 and result["cpu_minutes"] == 6.0


def test_the_length_gap_is_signed_longer_minus_shorter():
    # right only where the chosen answer is the shorter one: "shorter wins"
    result = ensemble([_member([-1.0, -1.0, 1.0, 1.0])], LENGTHS)
    assert result["length_gap"] == pytest.approx(-1.0)
    assert result["accuracy_low"] < result["accuracy"] < result["accuracy_high"]


def test_ensembles_need_every_member_measured_with_margins():
    name, members = next(iter(ENSEMBLES.items()))
    assert all(m in VARIANTS for m in members)
    base = {"phase": "screen"}  # not read as the committed config's measurement
    variants = {m: base | _member([1.0, 1.0, -1.0, 1.0]) for m in members}
    assert name in summarise(variants, {"train": 1, "eval": 4}, LENGTHS)["ensembles"]
    del variants[members[-1]]["eval_margins"]  # a row measured before margins were stored
    assert summarise(variants, {"train": 1, "eval": 4}, LENGTHS)["ensembles"] == {}


def _row(overrides: list[str], **extra) -> dict:
    return {"phase": "full", "overrides": overrides, "pooling": "answer", "max_length": 128, **extra}


def test_a_row_measures_the_committed_config_only_if_it_ran_its_settings():
    from alignflow.config import load_config
    from bench.reward_quality_bench import CONFIG, measures_committed_config, reward_settings

    reward = load_config(CONFIG, []).reward
    assert measures_committed_config(_row([], reward_config=reward_settings()), reward)
    changed = reward_settings(["reward.learning_rate=0.0002"])
    assert not measures_committed_config(_row([], reward_config=changed), reward)
    # rows from before settings were recorded: the knobs added since ran at their old defaults
    stated = [f"reward.noisy_pair_fraction={reward.noisy_pair_fraction}"]
    assert measures_committed_config(_row(stated), reward)
    silent = measures_committed_config(_row([]), reward)
    assert silent == (reward.noisy_pair_fraction == 0.0)
    # a config that turns on a knob the old rows did not have is not credited to them
    filtered = load_config(CONFIG, ["reward.noisy_pair_fraction=0.1"]).reward
    assert not measures_committed_config(_row([]), filtered)
    assert measures_committed_config(_row(["reward.noisy_pair_fraction=0.1"]), filtered)
    assert not measures_committed_config(_row(stated, pooling="mean"), reward)
