"""The acceptance rule by outcome: placebos rarely kept, real gains kept, its numbers honest."""

from __future__ import annotations

import math
import random

import pytest

from autotune.policy import DEFAULT, Look, NoiseModel, Policy, Verdict, judge
from autotune.policy._tdist import t_cdf, t_ppf


def test_t_distribution_matches_known_quantiles():
    assert t_ppf(0.975, 6) == pytest.approx(2.447, abs=1e-3)
    assert t_ppf(0.95, 7) == pytest.approx(1.895, abs=1e-3)
    assert t_cdf(0.0, 3) == pytest.approx(0.5)
    assert t_cdf(-1.96, math.inf) == pytest.approx(0.025, abs=1e-4)


def test_policy_rejects_inconsistent_constants_all_at_once():
    with pytest.raises(ValueError) as err:
        Policy(alpha=0, floor=1.5, max_looks=0)
    assert "alpha" in str(err.value) and "floor" in str(err.value) and "max_looks" in str(err.value)


def flat(ratio: float, pairs: int = 5) -> Look:
    """A look whose pairs all read `ratio` (its own pairs say nothing of the noise)."""
    return Look.of([100.0] * pairs, [100.0 * ratio] * pairs)


def model_with_look_sd(sd: float, dof: int = 6) -> NoiseModel:
    return NoiseModel(ss=dof * sd * sd, dof=dof, within=0.0)


@pytest.mark.parametrize("first, second, sd", [(1.13, 1.14, 0.06), (1.35, 1.31, 0.134)])
def test_a_gain_two_looks_agree_on_is_kept(first, second, sd):
    # one fresh look alone spans about [0.98, 1.32] (sd 0.06) or [0.95, 1.81] (sd 0.134) here
    model = model_with_look_sd(sd)
    decision = judge([flat(first), flat(second)], model)
    assert decision.verdict is Verdict.KEEP, decision.text()
    assert decision.p_gain >= 1 - DEFAULT.alpha


def test_one_look_at_a_modest_gain_is_not_enough():
    assert judge([flat(1.13)], model_with_look_sd(0.06)).verdict is Verdict.LOOK


def test_looks_reading_no_gain_are_dropped():
    assert judge([flat(1.0), flat(0.99)], model_with_look_sd(0.06)).verdict is Verdict.DROP


def test_nothing_known_of_the_noise_means_another_look():
    assert judge([flat(1.5)], NoiseModel()).verdict is Verdict.LOOK


def test_max_looks_ends_the_looks():
    policy = Policy(max_looks=3)
    model = model_with_look_sd(0.5)
    decision = judge([flat(1.2)] * 3, model, policy)
    assert decision.verdict is Verdict.DROP


class Machine:
    """Looks as this kind of machine gives them: a session offset per look, Student-t (df 4) window
    noise with occasional bursts that slow one window 20-50%, and configs of different noise."""

    def __init__(self, seed: int, window: float = 0.05, session: float = 0.05):
        self.rng, self.window, self.session = random.Random(seed), window, session

    def _window(self, scale: float) -> float:
        t = self.rng.gauss(0, 1) / math.sqrt(self.rng.gammavariate(2.0, 2.0) / 4.0)  # Student-t, df 4
        burst = math.log(1 + self.rng.uniform(0.2, 0.5)) if self.rng.random() < 0.05 else 0.0
        return scale * t * math.sqrt(0.5) - burst

    def look(self, gain: float, pairs: int = 5) -> Look:
        offset = self.rng.gauss(0, self.session)
        a = [100 * math.exp(self._window(self.window)) for _ in range(pairs)]
        b = [100 * gain * math.exp(offset + self._window(self.window * 1.3)) for _ in range(pairs)]
        return Look.of(a, b)


def run(machine: Machine, gain: float, policy: Policy = DEFAULT) -> tuple[Verdict, int]:
    nulls = [machine.look(1.0), machine.look(1.0)]
    model = NoiseModel.fit(nulls)
    looks: list[Look] = []
    while True:
        looks.append(machine.look(gain))
        decision = judge(looks, model, policy)
        if decision.verdict is not Verdict.LOOK:
            return decision.verdict, len(looks)


def test_placebos_are_kept_at_most_alpha_of_the_time():
    kept = sum(run(Machine(seed), 1.0)[0] is Verdict.KEEP for seed in range(400))
    assert kept / 400 <= DEFAULT.alpha


def test_a_clear_gain_is_kept_most_of_the_time():
    kept = sum(run(Machine(seed), 1.20)[0] is Verdict.KEEP for seed in range(200))
    assert kept / 200 >= 0.8
