import numpy as np
import pytest

from alignflow.evaluation.calibration import (
    bradley_terry_probability,
    expected_calibration_error,
    pairwise_report,
)


def test_bradley_terry_probability_is_sigmoid_of_margin():
    p = bradley_terry_probability([2.0, 0.0, -1.0], [0.0, 0.0, 1.0])
    expected = 1 / (1 + np.exp(-np.array([2.0, 0.0, -2.0])))
    assert np.allclose(p, expected)


def test_perfectly_calibrated_predictions_have_near_zero_ece():
    rng = np.random.default_rng(0)
    p = rng.uniform(0, 1, 200_000)
    y = rng.uniform(0, 1, p.size) < p
    assert expected_calibration_error(p, y) < 0.01


def test_overconfident_predictions_have_large_ece():
    # says 0.99 but is right only half the time
    p = np.full(1000, 0.99)
    y = np.arange(1000) % 2 == 0
    assert expected_calibration_error(p, y) == pytest.approx(0.49, abs=1e-9)


def test_pairwise_report_accuracy_margin_and_stats():
    report = pairwise_report([1.0, 2.0, 0.0], [0.0, 0.0, 1.0])
    assert report.accuracy == pytest.approx(2 / 3)
    assert report.margin_mean == pytest.approx((1 + 2 - 1) / 3)
    assert report.reward_mean == pytest.approx(4 / 6)
    assert report.reward_std == pytest.approx(np.std([1, 2, 0, 0, 0, 1]))
    assert 0.0 <= report.ece <= 1.0
    assert report.as_metrics("eval/")["eval/accuracy"] == pytest.approx(2 / 3)


def test_mismatched_inputs_are_rejected():
    with pytest.raises(ValueError, match="shape"):
        expected_calibration_error([0.5, 0.6], [True])
    with pytest.raises(ValueError, match="at least one"):
        pairwise_report([], [])


def test_a_model_that_outputs_nan_is_not_called_calibrated():
    """NaN falls in no confidence bin: left out, a diverged reward model would score ECE 0."""
    nan = float("nan")
    report = pairwise_report([nan, 2.0, nan], [0.0, 1.0, nan])
    assert np.isnan(report.ece)
    assert report.accuracy == pytest.approx(1 / 3)  # a NaN pair is not a correct ranking
    assert np.isnan(expected_calibration_error([0.7, nan], [True, True]))
