"""Paired ratios, Student-t quantiles and the noise margin: pure arithmetic, checked exactly."""

from __future__ import annotations

import math
import statistics

import pytest

from autotune.stats import _T95, look_mean, look_variance, looks_ratio, noise_margin, paired_ratio, t95

# --- paired_ratio --------------------------------------------------------------------------


def test_identical_ratios_give_that_ratio_and_a_zero_width_interval():
    r = paired_ratio([1.0, 2.0, 4.0], [2.0, 4.0, 8.0])
    assert r["pairs"] == 3
    assert r["ratio"] == pytest.approx(2.0, rel=1e-12)
    assert r["low"] == pytest.approx(2.0, rel=1e-12)
    assert r["high"] == pytest.approx(2.0, rel=1e-12)


def test_ratio_is_the_geometric_mean_of_the_pair_ratios():
    # pair ratios 2 and 8: geometric mean 4 (the arithmetic mean would be 5)
    r = paired_ratio([1.0, 1.0], [2.0, 8.0])
    assert r["ratio"] == pytest.approx(4.0, rel=1e-12)
    # pair ratios 0.5, 1, 2: geometric mean 1
    r = paired_ratio([100.0, 100.0, 100.0], [50.0, 100.0, 200.0])
    assert r["ratio"] == pytest.approx(1.0, rel=1e-12)


def test_interval_is_t_times_standard_error_in_log_space():
    a = [10.0, 10.0, 10.0, 10.0]
    b = [11.0, 12.0, 10.5, 11.5]
    logs = [math.log(y / x) for x, y in zip(a, b)]
    m = sum(logs) / 4
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 3)
    half = 3.182 * sd / 2  # t95(3) * sd / sqrt(4)
    r = paired_ratio(a, b)
    assert r["ratio"] == pytest.approx(math.exp(m), rel=1e-12)
    assert r["low"] == pytest.approx(math.exp(m - half), rel=1e-12)
    assert r["high"] == pytest.approx(math.exp(m + half), rel=1e-12)


def test_interval_contains_the_ratio():
    a = [100.0, 98.0, 103.0, 99.0, 101.0]
    b = [120.0, 110.0, 125.0, 118.0, 116.0]
    r = paired_ratio(a, b)
    assert r["low"] < r["ratio"] < r["high"]


def test_interval_narrows_with_more_consistent_pairs():
    a = [100.0] * 5
    steady = paired_ratio(a, [119.0, 121.0, 120.0, 119.5, 120.5])
    shaky = paired_ratio(a, [100.0, 140.0, 120.0, 110.0, 130.0])
    assert steady["ratio"] == pytest.approx(shaky["ratio"], rel=0.01)
    assert steady["high"] / steady["low"] < shaky["high"] / shaky["low"]


def test_interval_narrows_with_more_pairs_of_the_same_spread():
    few = paired_ratio([100.0] * 4, [110.0, 130.0] * 2)
    many = paired_ratio([100.0] * 20, [110.0, 130.0] * 10)
    assert few["ratio"] == pytest.approx(many["ratio"], rel=1e-12)
    assert many["high"] / many["low"] < few["high"] / few["low"]
    assert many["low"] <= many["ratio"] <= many["high"]


def test_one_pair_has_an_infinite_interval():
    r = paired_ratio([100.0], [150.0])
    assert r["pairs"] == 1
    assert r["ratio"] == pytest.approx(1.5)
    assert r["high"] == math.inf
    assert r["low"] == 0.0


def test_non_positive_values_are_skipped():
    r = paired_ratio([1.0, 0.0, 2.0, -1.0, 3.0], [2.0, 5.0, 4.0, 3.0, 0.0])
    assert r["pairs"] == 2  # (1, 2) and (2, 4); zero and negative on either side dropped
    assert r["ratio"] == pytest.approx(2.0, rel=1e-12)


def test_pairs_stop_at_the_shorter_list():
    r = paired_ratio([1.0, 1.0, 1.0], [3.0, 3.0])
    assert r["pairs"] == 2
    assert r["ratio"] == pytest.approx(3.0)


@pytest.mark.parametrize("a, b", [([], []), ([0.0, -1.0], [1.0, 2.0]), ([1.0], [0.0])])
def test_no_usable_pair_gives_nan_and_zero_pairs(a, b):
    r = paired_ratio(a, b)
    assert r["pairs"] == 0
    assert math.isnan(r["ratio"]) and math.isnan(r["low"]) and math.isnan(r["high"])


# --- t95 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("df", [0, -1, -10])
def test_t95_without_degrees_of_freedom_is_infinite(df):
    assert t95(df) == math.inf


@pytest.mark.parametrize("df", sorted(_T95))
def test_t95_table_keys_are_returned_exactly(df):
    assert t95(df) == _T95[df]


@pytest.mark.parametrize("df, key", [(11, 10), (13, 12), (14, 12), (16, 15), (19, 15), (21, 20), (24, 20),
                                     (26, 25), (29, 25)])
def test_t95_between_table_keys_takes_the_lower_key(df, key):
    assert t95(df) == _T95[key]


def test_t95_known_values():
    assert t95(1) == 12.706
    assert t95(4) == 2.776
    assert t95(30) == 2.042


@pytest.mark.parametrize("df", [31, 40, 100, 10_000])
def test_t95_beyond_30_is_the_normal_quantile(df):
    assert t95(df) == 1.96


def test_t95_never_increases_with_df():
    values = [t95(df) for df in range(1, 60)]
    assert all(x >= y for x, y in zip(values, values[1:]))
    # between keys the lower key's (larger) quantile is used: never below the normal one
    assert all(t95(df) >= 1.96 for df in range(1, 60))


# --- noise_margin --------------------------------------------------------------------------


def test_margin_is_1_plus_min_gain_when_aa_shows_no_bias():
    assert noise_margin(1.0, 10, 0.03) == pytest.approx(1.03, rel=1e-12)
    assert noise_margin(1.01, 10, 0.03) == pytest.approx(1.03, rel=1e-12)


def test_margin_is_the_aa_bias_when_it_exceeds_min_gain():
    assert noise_margin(1.1, 10, 0.03) == pytest.approx(1.1, rel=1e-12)
    assert noise_margin(1.5, 3, 0.0) == pytest.approx(1.5, rel=1e-12)


@pytest.mark.parametrize("ratio", [1.05, 1.1, 1.3, 2.0])
def test_margin_is_symmetric_in_log(ratio):
    assert noise_margin(1 / ratio, 8, 0.01) == pytest.approx(noise_margin(ratio, 8, 0.01), rel=1e-12)
    assert noise_margin(1 / ratio, 8, 0.01) == pytest.approx(ratio, rel=1e-12)


@pytest.mark.parametrize("ratio", [0.5, 0.9, 0.97, 1.0, 1.02, 1.03, 1.2, 3.0])
@pytest.mark.parametrize("min_gain", [0.0, 0.03, 0.1])
def test_margin_is_never_below_1_plus_min_gain(ratio, min_gain):
    assert noise_margin(ratio, 5, min_gain) >= 1 + min_gain - 1e-12


@pytest.mark.parametrize("ratio, pairs", [(None, 5), (float("nan"), 5), (float("inf"), 5), (0.0, 5), (-1.2, 5),
                                          (1.5, 0), (None, 0)])
def test_margin_without_a_usable_aa_ratio_is_1_plus_min_gain(ratio, pairs):
    assert noise_margin(ratio, pairs, 0.03) == pytest.approx(1.03, rel=1e-12)


# --- looks_ratio ---------------------------------------------------------------------------

BASE = [100.0] * 5


def _look(ratio: float, jitter: float = 0.0) -> tuple[list[float], list[float]]:
    """Five pairs whose log ratios are log(ratio) +- jitter, alternating (mean exactly log(ratio))."""
    signs = [1, -1, 1, -1, 0]
    return BASE, [100.0 * ratio * math.exp(s * jitter) for s in signs]


def test_each_look_counts_once_and_the_spread_is_the_one_between_looks_and_the_aas():
    looks = [_look(1.10, 0.01), _look(1.20, 0.01), _look(1.00, 0.01)]
    nulls = [_look(1.02, 0.01), _look(0.98, 0.01)]
    r = looks_ratio(looks, nulls)
    means = [math.log(1.1), math.log(1.2), 0.0]
    m = sum(means) / 3
    ss = sum((x - m) ** 2 for x in means) + math.log(1.02) ** 2 + math.log(0.98) ** 2
    half = t95(2 + 2) * math.sqrt(ss / 4 / 3)
    assert r["looks"] == 3 and r["dof"] == 4 and r["pairs"] == 15
    assert r["ratio"] == pytest.approx(math.exp(m), rel=1e-9)
    assert r["low"] == pytest.approx(math.exp(m - half), rel=1e-9)
    assert r["high"] == pytest.approx(math.exp(m + half), rel=1e-9)


def test_looks_that_disagree_give_a_wider_interval_than_their_pairs_pooled():
    """Fifteen pairs pooled as if independent say 1.10x [1.02, 1.18]-ish; three sessions that
    read 1.0, 1.1 and 1.2 say far less."""
    looks = [_look(1.00, 0.02), _look(1.10, 0.02), _look(1.20, 0.02)]
    pooled = paired_ratio([x for a, _ in looks for x in a], [y for _, b in looks for y in b])
    r = looks_ratio(looks, [])
    assert r["ratio"] == pytest.approx(pooled["ratio"], rel=1e-9)
    assert r["low"] < pooled["low"] and r["high"] > pooled["high"]


def test_a_quiet_aa_cannot_make_the_interval_narrower_than_the_looks_own_pairs_say():
    """Looks that agree exactly and A/As at exactly 1 would give no spread at all: each
    look's own pairs still vary, and their variance of the mean is the floor."""
    looks = [_look(1.10, 0.05), _look(1.10, 0.05)]
    r = looks_ratio(looks, [_look(1.0), _look(1.0)])
    logs = [0.05, -0.05, 0.05, -0.05, 0.0]  # winsorized (one each end): the same five
    within = (sum(x * x for x in logs) / 4) / (0.6 ** 2 * 5)  # the trimmed mean's variance (Tukey-McLaughlin)
    half = t95(1 + 2) * math.sqrt(within / 2)
    assert r["low"] == pytest.approx(1.10 * math.exp(-half), rel=1e-9)


def test_a_wide_aa_widens_the_interval():
    looks = [_look(1.10, 0.01), _look(1.12, 0.01)]
    quiet = looks_ratio(looks, [_look(1.01, 0.01), _look(0.99, 0.01)])
    loud = looks_ratio(looks, [_look(1.08, 0.01), _look(0.92, 0.01)])
    assert loud["low"] < quiet["low"] and loud["high"] > quiet["high"]


def test_no_usable_look_gives_nan_and_no_looks():
    r = looks_ratio([([1.0], [2.0]), ([], [])], [_look(1.0)])
    assert r["looks"] == 0 and math.isnan(r["low"])


def _burst(ratio: float, at: int, burst: float) -> tuple[list[float], list[float]]:
    """Five pairs at exactly `ratio`, but for pair `at`, whose window of A (burst > 0) or of
    B (burst < 0) a burst slowed by `abs(burst)` in log terms."""
    a = [100.0 * (math.exp(-burst) if i == at and burst > 0 else 1.0) for i in range(5)]
    b = [100.0 * ratio * (math.exp(burst) if i == at and burst < 0 else 1.0) for i in range(5)]
    return a, b


def test_a_burst_in_one_pair_does_not_move_its_look():
    """A window a burst slowed 40% reads its pair 1.49x (or 0.67x): the plain mean of five
    pairs moves 8%, the look's trimmed mean not at all."""
    logs = [0.0, 0.0, 0.0, 0.0, 0.4]
    assert statistics.fmean(logs) == pytest.approx(0.08)
    assert look_mean(logs) == 0.0
    r = looks_ratio([_burst(1.05, 0, 0.4), _burst(1.05, 2, -0.4), _burst(1.05, 4, 0.4)], [_burst(1.0, 1, -0.4)])
    assert r["ratio"] == pytest.approx(1.05, rel=1e-9)


def test_looks_with_bursts_either_way_give_a_narrower_interval_than_their_plain_means_would():
    looks = [_burst(1.05, i, 0.4 if i % 2 else -0.4) for i in range(4)]
    nulls = [_burst(1.0, 1, 0.4), _burst(1.0, 3, -0.4)]
    r = looks_ratio(looks, nulls)
    plain = [statistics.fmean(math.log(y / x) for x, y in zip(a, b)) for a, b in looks]
    plain_nulls = [statistics.fmean(math.log(y / x) for x, y in zip(a, b)) for a, b in nulls]
    m = statistics.fmean(plain)
    ss = sum((x - m) ** 2 for x in plain) + sum(x * x for x in plain_nulls)
    plain_half = t95(3 + 2) * math.sqrt(ss / 5 / 4)
    assert r["ratio"] == pytest.approx(1.05, rel=1e-9)
    assert math.log(r["high"] / r["low"]) / 2 < plain_half / 2


@pytest.mark.parametrize("logs", [[0.1, -0.1], [0.3, 0.1, -0.2], [0.0, 0.1, 0.2, 0.4]])
def test_under_five_pairs_a_look_is_its_plain_mean(logs):
    assert look_mean(logs) == pytest.approx(statistics.fmean(logs))
    assert look_variance(logs) == pytest.approx(statistics.variance(logs) / len(logs))


def test_ten_pairs_trim_two_at_each_end():
    logs = [-0.9, -0.5, 0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.6, 0.8]
    assert look_mean(logs) == pytest.approx(statistics.fmean([0.0, 0.01, 0.02, 0.03, 0.04, 0.05]))
