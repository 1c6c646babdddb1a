"""False acceptances on a FakeRunner whose noise has the shape measured here: heavy-tailed
windows (bursts), session offsets, drift, carry-over from the previous config and a
candidate noisier than the baseline. Seeds are fixed; the agent runs for real."""

from __future__ import annotations

import math
import statistics

import pytest

from autotune.config import TrainConfig
from autotune.testing import FakeRunner
from benchmarks import placebo

RUNS = 150  # 50 per workload shape, ~0.15 s each


def _kurtosis(xs: list[float]) -> float:
    m = statistics.fmean(xs)
    v = statistics.fmean([(x - m) ** 2 for x in xs])
    return statistics.fmean([(x - m) ** 4 for x in xs]) / v**2


def _aa_pair_logs(runner: FakeRunner, looks: int = 500) -> list[float]:
    c = TrainConfig()
    logs = []
    for _ in range(looks):
        xs, ys = runner.interleave(c, c, 4)
        logs += [math.log(y / x) for x, y in zip(xs, ys)]
    return logs


def test_fakerunners_heavy_tails_have_the_measured_kurtosis():
    """A/A pair log ratios here had a kurtosis of 6.6-8.8 (gpt, overhead_bound,
    transformer_encoder); the Gaussian default's is 3."""
    heavy = _kurtosis(_aa_pair_logs(FakeRunner(lambda c: 100.0, noise=0.05, tails="burst", seed=0)))
    assert 6.6 <= heavy <= 8.8, heavy
    assert _kurtosis(_aa_pair_logs(FakeRunner(lambda c: 100.0, noise=0.05, seed=0))) < 3.5


def test_fakerunner_noise_per_config_and_carry_over():
    """A config's own noise level; a window after another config runs partly at its speed."""
    noisy = TrainConfig().with_changes({"layout.channels_last": True})
    r = FakeRunner(lambda c: 100.0, noise=lambda c: 0.2 if c == noisy else 0.01, seed=0)
    quiet, loud = (statistics.pstdev([r.draw(c) for _ in range(400)]) for c in (TrainConfig(), noisy))
    assert loud > 10 * quiet
    slow = FakeRunner(lambda c: 50.0 if c == noisy else 100.0, noise=0.0, carry=0.2)
    slow.draw(noisy)
    after, again = slow.draw(TrainConfig()), slow.draw(TrainConfig())
    assert after == pytest.approx(1 / (0.8 / 100 + 0.2 / 50)) and again == 100.0
    with pytest.raises(ValueError, match="tails"):
        FakeRunner(lambda c: 1.0, tails="cauchy")


def test_the_false_acceptance_rate_on_heavy_tails_is_at_most_five_percent():
    got = placebo.simulate(RUNS)
    assert got["decided"] >= 0.9 * RUNS  # nearly every run compares a candidate
    assert got["false"]["rate"] <= placebo.ALPHA, got["false"]
    assert got["kept"]["count"] == 0  # no gain to keep


def test_power_grows_with_the_true_gain():
    """The same runs with channels_last truly 1.2x faster: kept far more often than a placebo."""
    got = placebo.simulate(60, gain=1.2)
    assert got["kept"]["rate"] >= 0.4, got["kept"]
    assert got["false"]["count"] <= 3


def test_wilson_interval():
    assert placebo.wilson(0, 20) == (0.0, pytest.approx(0.1611, abs=1e-4))
    lo, hi = placebo.wilson(5, 100)
    assert lo == pytest.approx(0.0215, abs=1e-4) and hi == pytest.approx(0.1118, abs=1e-4)
    assert placebo.wilson(0, 0) == (None, None)
