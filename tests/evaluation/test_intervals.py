"""95% intervals behind the promotion gates: Wilson shares and (paired) bootstrap means."""

import numpy as np
import pytest

from alignflow.evaluation.intervals import (
    Estimate,
    bootstrap_mean,
    disagreement,
    items_to_tell,
    paired_bootstrap_difference,
    paired_bootstrap_ratio,
    wilson,
    wilson_of,
)


def noisy(n: int, seed: int, loc: float = 0.0) -> list[float]:
    return np.random.default_rng(seed).normal(loc, 1.0, n).tolist()


# ---------------------------------------------------------------- Wilson


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [
        (8, 14, 0.3259, 0.7862),  # a lucky 0.57: anything from a third to four fifths
        (5, 10, 0.2366, 0.7634),
        (10, 10, 0.7225, 1.0),
        (80, 140, 0.4886, 0.6504),
    ],
)
def test_wilson_matches_known_intervals(successes, n, low, high):
    estimate = wilson(successes, n)
    assert estimate.value == pytest.approx(successes / n)
    assert estimate.low == pytest.approx(low, abs=5e-4)
    assert estimate.high == pytest.approx(high, abs=5e-4)
    assert estimate.n == n
    assert estimate.method == "wilson"


def test_wilson_of_no_successes_starts_at_zero_but_still_allows_some():
    estimate = wilson(0, 10)
    assert estimate.value == 0.0
    assert estimate.low == pytest.approx(0.0, abs=1e-12)
    assert estimate.high == pytest.approx(0.2775, abs=5e-4)


def test_wilson_of_no_rows_has_no_value():
    estimate = wilson(0, 0)
    assert (estimate.value, estimate.low, estimate.high, estimate.n) == (None, None, None, 0)
    assert estimate.describe() == "n/a (n=0)"


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5, 0.57, 0.9, 1.0])
def test_wilson_bounds_contain_the_point_and_narrow_as_rows_grow(share):
    widths = []
    for n in (10, 40, 160, 640):
        estimate = wilson(round(share * n), n)
        assert 0.0 <= estimate.low <= estimate.value <= estimate.high <= 1.0
        widths.append(estimate.high - estimate.low)
    assert widths == sorted(widths, reverse=True)
    assert widths[-1] < widths[0] / 3


@pytest.mark.parametrize("n", [10, 40, 640])
def test_wilson_of_all_or_nothing_contains_the_point_exactly(n):
    nothing, everything = wilson(0, n), wilson(n, n)
    assert nothing.low == 0.0
    assert everything.high == 1.0


def test_wilson_widens_with_the_confidence_asked_for():
    narrow, wide = wilson(8, 14, confidence=0.8), wilson(8, 14, confidence=0.99)
    assert wide.low < narrow.low and wide.high > narrow.high


def test_wilson_of_outcomes_skips_rows_that_were_not_judged():
    estimate = wilson_of([1.0, None, 0.0, 1.0, None, 1.0])
    assert estimate.n == 4
    assert estimate.value == pytest.approx(0.75)
    assert estimate == wilson(3, 4)


def test_estimate_describes_itself_and_round_trips_as_a_dict():
    estimate = wilson(8, 14)
    assert estimate.describe() == "0.571 [0.326, 0.786] n=14"
    assert Estimate(**estimate.as_dict()) == estimate


# ---------------------------------------------------------------- bootstrap of a mean


def test_bootstrap_of_all_ties_is_exactly_one_half_where_wilson_is_wide():
    ties = [0.5] * 40
    bootstrap = bootstrap_mean(ties)
    assert bootstrap.value == bootstrap.low == bootstrap.high == 0.5
    assert bootstrap.n == 40
    # Wilson reads the same share as 20 coin flips out of 40
    coin_flips = wilson(20, 40)
    assert coin_flips.low < 0.4 and coin_flips.high > 0.6


def test_bootstrap_bounds_contain_the_mean_and_narrow_as_rows_grow():
    widths = []
    for n in (20, 80, 320):
        verdicts = [1.0, 0.5, 0.0, 1.0] * (n // 4)
        estimate = bootstrap_mean(verdicts)
        assert estimate.value == pytest.approx(0.625)
        assert estimate.low <= estimate.value <= estimate.high
        widths.append(estimate.high - estimate.low)
    assert widths[0] > widths[1] > widths[2]


def test_bootstrap_skips_unjudged_rows_and_is_empty_without_any():
    estimate = bootstrap_mean([1.0, None, 1.0, 0.0, None])
    assert estimate.n == 3
    assert estimate.value == pytest.approx(2 / 3)
    assert bootstrap_mean([None, None]).value is None
    assert bootstrap_mean([]).n == 0


def test_bootstrap_is_reproducible_for_a_seed_and_varies_with_it():
    values = noisy(50, seed=3)
    assert bootstrap_mean(values, seed=7) == bootstrap_mean(values, seed=7)
    assert bootstrap_mean(values, seed=7) != bootstrap_mean(values, seed=8)


# ---------------------------------------------------------------- paired bootstrap


def test_paired_difference_keeps_rows_paired():
    champion = noisy(60, seed=1)
    better = [x + 0.1 for x in champion]  # better by exactly 0.1 on every row
    paired = paired_bootstrap_difference(better, champion)
    assert paired.value == pytest.approx(0.1)
    assert paired.low == pytest.approx(0.1, abs=1e-9)
    assert paired.high == pytest.approx(0.1, abs=1e-9)
    assert paired.n == 60
    # the same gain hidden in noise that is not shared row by row cannot be told from zero
    independent = paired_bootstrap_difference(noisy(60, seed=2, loc=0.1), champion)
    assert independent.low < 0.0 < independent.high
    assert independent.high - independent.low > 0.3


def test_paired_difference_of_a_clear_gain_excludes_zero():
    ours, theirs = [1.0] * 36 + [0.0] * 4, [1.0] * 20 + [0.0] * 20
    estimate = paired_bootstrap_difference(ours, theirs)
    assert estimate.value == pytest.approx(0.4)
    assert 0.0 < estimate.low < 0.4 < estimate.high


def test_paired_difference_needs_equal_lengths():
    with pytest.raises(ValueError, match="paired rows needed: 3 vs 2"):
        paired_bootstrap_difference([1.0, 0.0, 1.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="paired rows needed"):
        paired_bootstrap_ratio([1.0], [1.0, 2.0])


def test_paired_difference_skips_rows_where_either_side_is_missing():
    a = [1.0, None, 1.0, 0.0, 1.0]
    b = [0.0, 1.0, None, 0.0, 0.0]
    estimate = paired_bootstrap_difference(a, b)
    assert estimate.n == 3  # rows 0, 3 and 4
    assert estimate.value == pytest.approx(2 / 3)
    assert paired_bootstrap_difference([None, 1.0], [1.0, None]).value is None


def test_paired_ratio_of_lengths_twice_as_long_is_two():
    reference = [float(x) for x in np.random.default_rng(0).integers(5, 30, 50)]
    doubled = [2 * x for x in reference]
    estimate = paired_bootstrap_ratio(doubled, reference)
    assert estimate.value == pytest.approx(2.0)
    assert estimate.low == pytest.approx(2.0) and estimate.high == pytest.approx(2.0)
    assert estimate.n == 50
    assert estimate.method == "paired_bootstrap"


def test_paired_ratio_bounds_contain_the_ratio_of_means():
    a = [float(x) for x in np.random.default_rng(1).integers(10, 40, 80)]
    b = [float(x) for x in np.random.default_rng(2).integers(10, 40, 80)]
    estimate = paired_bootstrap_ratio(a, b)
    assert estimate.value == pytest.approx(np.mean(a) / np.mean(b))
    assert estimate.low < estimate.value < estimate.high


def test_paired_ratio_floors_the_denominator_mean_at_one():
    estimate = paired_bootstrap_ratio([3.0, 3.0], [0.0, 0.0])
    assert estimate.value == pytest.approx(3.0)


def test_paired_ratio_skips_missing_rows_and_is_empty_without_any():
    assert paired_bootstrap_ratio([10.0, None, 20.0], [5.0, 5.0, None]).n == 1
    assert paired_bootstrap_ratio([None], [None]).value is None


def test_paired_estimates_are_reproducible_for_a_seed():
    a, b = noisy(40, seed=4), noisy(40, seed=5)
    assert paired_bootstrap_difference(a, b, seed=11) == paired_bootstrap_difference(a, b, seed=11)
    assert paired_bootstrap_difference(a, b, seed=11) != paired_bootstrap_difference(a, b, seed=12)
    lengths_a = [abs(x) * 10 + 5 for x in a]
    lengths_b = [abs(x) * 10 + 5 for x in b]
    assert paired_bootstrap_ratio(lengths_a, lengths_b, seed=3) == paired_bootstrap_ratio(
        lengths_a, lengths_b, seed=3
    )


def test_welch_difference_covers_the_true_gain_and_says_n():
    import random

    from alignflow.evaluation.intervals import welch_difference

    rng = random.Random(0)
    a = [rng.gauss(0.7, 0.1) for _ in range(200)]
    b = [rng.gauss(0.5, 0.1) for _ in range(50)]
    estimate = welch_difference(a, b)
    assert estimate.low < 0.2 < estimate.high and estimate.low > 0.1 and estimate.n == 50
    assert welch_difference([0.5], b).value is None  # one rating has no spread to speak of


# ---------------------------------------------------------------- power of "not clearly worse"


def test_disagreement_counts_rows_where_exactly_one_side_is_right_and_skips_unjudged():
    assert disagreement([1, 1, 0, 0, None], [1, 0, 1, 0, 1]) == 0.5
    assert disagreement([1, 1], [1, 1]) == 0.0
    assert disagreement([None], [1]) is None


def test_items_needed_grow_with_disagreement_and_with_a_finer_drop():
    assert items_to_tell(0.05, 0.1) > items_to_tell(0.05, 0.03) > items_to_tell(0.1, 0.03)
    assert items_to_tell(0.05, 0.0) == 1  # two systems that agree everywhere: any item tells
    with pytest.raises(ValueError, match="positive"):
        items_to_tell(0.0, 0.1)


def _share_passing(n: int, disagree: float, drop: float, shortfall: float = 0.0, trials: int = 300) -> float:
    """Simulated paired comparisons of a challenger trailing by ``shortfall``: the share whose
    bootstrap lower bound clears ``-drop`` (the task gate's rule)."""
    rng = np.random.default_rng(7)
    passed = 0
    for trial in range(trials):
        up, down = (disagree - shortfall) / 2, (disagree + shortfall) / 2
        step = rng.choice([1.0, -1.0, 0.0], size=n, p=[up, down, 1 - up - down])
        ours, theirs = (step > 0).astype(float), (step < 0).astype(float)
        low = paired_bootstrap_difference(ours, theirs, resamples=400, seed=trial).low
        passed += low >= -drop
    return passed / trials


def test_the_items_it_names_pass_a_true_tie_about_as_often_as_promised():
    n = items_to_tell(0.05, 0.1)  # about 314 items
    assert 0.7 <= _share_passing(n, 0.1, 0.05) <= 0.92
    assert _share_passing(n // 4, 0.1, 0.05) < 0.5  # a quarter of them: a tie often fails
    # and a challenger a full drop worse still fails about as often as the interval's tail says
    assert _share_passing(n, 0.1, 0.05, shortfall=0.05) < 0.1
