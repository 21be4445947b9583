"""Setting aside likely-mislabelled pairs before reward training (``reward.noisy_pair_fraction``)."""

from __future__ import annotations

import json

import numpy as np
import pytest


def test_calibration_recovers_the_temperature_of_the_labels():
    from alignflow.training.noisy_pairs import calibrate

    rng = np.random.default_rng(0)
    score = rng.normal(0.0, 3.0, 20_000)
    label_holds = rng.random(score.size) < 1.0 / (1.0 + np.exp(-0.4 * score))
    logit = np.where(label_holds, score, -score)  # the logit of the label as given
    probability = calibrate(logit)
    fitted = np.log(probability / (1 - probability)) / logit
    assert fitted.mean() == pytest.approx(0.4, abs=0.03)


def test_out_of_fold_margins_point_against_flipped_labels():
    """Features where the label follows a direction; the flipped pairs get negative margins out of fold."""
    from alignflow.training.noisy_pairs import out_of_fold_margins

    rng = np.random.default_rng(1)
    direction = rng.normal(size=32)
    diff = rng.normal(size=(400, 32)) + 3.0 * direction / np.linalg.norm(direction)  # labels agree with it
    flipped = rng.choice(400, size=20, replace=False)
    diff[flipped] *= -1  # ... except these, written the wrong way round
    folds = np.arange(400) % 5
    margins = out_of_fold_margins(diff, np.zeros(400), folds)
    assert (margins[flipped] < 0).all()
    others = np.setdiff1d(np.arange(400), flipped)
    assert (margins[others] > 0).mean() > 0.95
    assert len(set(np.argsort(margins)[:20]) & set(flipped)) >= 18
    # out of fold: a pair's own label does not move its margin, only the sign of its features does
    relabelled = diff.copy()
    relabelled[others[0]] *= -1
    again = out_of_fold_margins(relabelled, np.zeros(400), folds)
    assert again[others[0]] == pytest.approx(-margins[others[0]], rel=1e-4)


KIND = ("Thanks for asking!", "Happy to help.", "Good question.", "Glad you asked.")
RUDE = ("Ugh, whatever.", "Figure it out, idiot.", "Who cares.", "Stop bothering me.")
FILLER = (" Let me see.", " Right.", " Well then.", " Okay.")


def _snapshot_with_flipped_labels(tmp_path, n_pairs: int, n_flipped: int):
    """Kind answers chosen over rude ones, lengths shuffled so length says nothing; some written
    the wrong way round. Returns the snapshot, its train pairs and the flipped indices."""
    import random

    from alignflow.data.snapshot import write_split

    rng = random.Random(0)

    def answer(openers: tuple[str, ...], n: int) -> str:
        return rng.choice(openers) + "".join(rng.choices(FILLER, k=rng.randint(0, 3))) + f" It is {n}."

    pairs = []
    for _ in range(n_pairs + 40):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        prompt = f"What is {a} plus {b}?"
        pairs.append({"prompt": prompt, "chosen": answer(KIND, a + b), "rejected": answer(RUDE, a + b)})
    train, held_out = pairs[:n_pairs], pairs[n_pairs:]
    flipped = set(range(0, n_pairs, n_pairs // n_flipped))
    for i in flipped:
        train[i] = dict(train[i], chosen=train[i]["rejected"], rejected=train[i]["chosen"])
    write_split(tmp_path / "data", "train", [dict(p, kind="pair") for p in train])
    write_split(tmp_path / "data", "eval", [dict(p, kind="pair") for p in held_out])
    return tmp_path / "data", train, flipped


def test_the_stage_sets_aside_the_flipped_pairs_and_accounts_for_every_pair(demo_config, tmp_path):
    from alignflow.training.reward import run_reward

    data_dir, train, flipped = _snapshot_with_flipped_labels(tmp_path, n_pairs=160, n_flipped=16)
    config = demo_config(
        "reward.backbone=minilm",
        "reward.pooling=answer",
        "reward.noisy_pair_fraction=0.1",
        "reward.max_length=48",
        "reward.max_steps=2",
        "reward.per_device_train_batch_size=4",
        "reward.stats_max_rows=8",
        "reward.save_steps=1000",
    )
    result = run_reward(config, data_dir, tmp_path / "reward")

    rows = [json.loads(line) for line in (tmp_path / "reward" / "noisy_pairs.jsonl").read_text().splitlines()]
    assert len(rows) == 16
    set_aside = {r["train_index"] for r in rows}
    assert len(set_aside & flipped) >= 14, (sorted(set_aside), sorted(flipped))
    for row in rows:
        assert row["reason"] == "label_implausible_to_probe"
        assert 0.0 <= row["label_probability"] < 0.5
        assert (row["chosen"], row["rejected"]) == (
            train[row["train_index"]]["chosen"],
            train[row["train_index"]]["rejected"],
        )
    # every train pair is accounted for: learned from, or set aside with its reason
    assert result.metrics["train/pairs_used"] + result.metrics["train/pairs_set_aside"] == len(train)
    assert result.metrics["train/pairs_set_aside"] == len(rows)


def test_a_decoder_backbone_is_probed_the_same_way(demo_config, sft_result, tmp_path):
    """The probe reads any sequence classifier's body: here the demo policy (a small causal LM)."""
    from alignflow.training.reward import run_reward

    data_dir, train, _ = _snapshot_with_flipped_labels(tmp_path, n_pairs=40, n_flipped=4)
    config = demo_config("reward.noisy_pair_fraction=0.1", "reward.max_steps=1", "reward.save_steps=1000")
    result = run_reward(config, data_dir, tmp_path / "reward", model_path=sft_result.model_dir)
    rows = (tmp_path / "reward" / "noisy_pairs.jsonl").read_text().splitlines()
    assert len(rows) == 4 == result.metrics["train/pairs_set_aside"]
    assert result.metrics["train/pairs_used"] == len(train) - 4


def test_no_pair_is_set_aside_unless_asked(demo_config, demo_snapshot, tmp_path):
    from alignflow.data.snapshot import load_split
    from alignflow.training.reward import run_reward

    config = demo_config(
        "reward.backbone=minilm",
        "reward.max_length=32",
        "reward.max_steps=1",
        "reward.stats_max_rows=4",
        "reward.eval_max_rows=4",
        "reward.save_steps=1000",
    )
    result = run_reward(config, demo_snapshot, tmp_path)
    assert result.metrics["train/pairs_used"] == len(load_split(demo_snapshot, "train", kind="pair"))
    assert "train/pairs_set_aside" not in result.metrics
    assert not (tmp_path / "noisy_pairs.jsonl").exists()


def test_the_filter_needs_one_pairwise_objective():
    from pydantic import ValidationError

    from alignflow.training.reward_config import RewardConfig

    with pytest.raises(ValidationError, match="noisy_pair_fraction"):
        RewardConfig(mode="mixed", noisy_pair_fraction=0.1)
    with pytest.raises(ValidationError):
        RewardConfig(noisy_pair_fraction=0.5)  # more than half would be a different dataset
