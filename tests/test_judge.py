"""The benchmark's judge on FakeRunner truths: symmetric whichever config leads, its figures
on blocks its pick never saw, and intervals that hold the true ratio at their nominal rate.

The machine is this project's noise model at its harsh end: 5% window noise and 8% session
offsets (each session of a config is a fresh process, placed on its own). Seeds are fixed.
"""

from __future__ import annotations

import math
import statistics

import pytest

from autotune.config import TrainConfig
from autotune.measure import Protocol
from autotune.testing import FakeRunner
from benchmarks import methods
from benchmarks.methods import fastest, judge, ratio

TOP = ["grid_1", "grid_2", "grid_3"]
SEEDS = range(150)


def _cfg(i: int) -> TrainConfig:
    return TrainConfig().with_changes({"data.num_workers": i})


def _judged(seed: int, speeds: dict[int, float], labels: dict[str, int], **noise) -> tuple[dict, dict]:
    """The judge's result with the oracle picked, and each label's true fraction of the oracle."""
    runner = FakeRunner(lambda c: 1000.0 * speeds[c.data.num_workers], seed=seed, protocol=Protocol(),
                        **({"noise": 0.05, "session": 0.08} | noise))
    chosen = {label: _cfg(i) for label, i in labels.items()}
    judged = judge(runner, chosen, set(), lambda _: None, top=TOP)
    best = fastest(judged, TOP)
    judged["labels"]["oracle"] = judged["labels"][best]
    truth = {label: speeds[i] / speeds[labels[best]] for label, i in labels.items()}
    return judged, truth


def _autotune_among_three(seed: int, speeds: dict[int, float]) -> dict:
    """autotune's config is one of the grid's three (which one turns with the seed)."""
    labels = {"grid_1": 1, "grid_2": 2, "grid_3": 3, "autotune": 1 + seed % 3}
    return ratio(_judged(seed, speeds, labels)[0], "oracle", "autotune")


def test_autotunes_config_tied_with_two_others_is_the_best_by_chance():
    """Three equal configs: autotune's is reported as the grid's best in about a third of
    runs (the old judge, whose extra rounds stopped once autotune's led: 37 of 60), and its
    fraction reads 1 on average (the old judge without extra rounds: 0.945)."""
    got = [_autotune_among_three(seed, {1: 1.0, 2: 1.0, 3: 1.0}) for seed in SEEDS]
    best = sum(bool(r.get("same_config")) for r in got)
    n = len(got)
    assert abs(best - n / 3) <= 3 * math.sqrt(n * 2 / 9), best  # chance: 50 of 150, sd 5.8
    assert abs(statistics.fmean(math.log(r["ratio"]) for r in got)) < math.log(1.015)


def test_a_pick_at_093_meets_095_no_more_often_than_under_fixed_rounds(monkeypatch):
    """autotune's config truly 0.93x of the best (the grid's other two alike): read >= 0.95
    no more often than by the same judge with its fewest blocks always, and less often than
    the old judge's fixed rounds did (about 23 of 60; with its extra rounds 33 of 60)."""
    speeds = {1: 1.0, 2: 0.93, 3: 0.93}

    def met() -> int:
        return sum(_autotune_among_three(seed, speeds)["ratio"] >= 0.95 for seed in SEEDS if seed % 3)

    n = sum(1 for seed in SEEDS if seed % 3)  # autotune's config is grid_2 or grid_3
    adaptive = met()
    monkeypatch.setattr(methods, "JUDGE_LOOKS", (methods.JUDGE_LOOKS[0],) * 2)
    fixed = met()
    assert adaptive <= fixed, (adaptive, fixed)
    assert adaptive <= n * 23 / 60, adaptive


def test_every_fraction_holds_the_true_ratio_at_about_its_nominal_rate():
    """Every method's fraction of the grid's best, against the true one: its 95% interval holds
    it in 90-99% of runs pooled, at least 80% for each method (the old judge: 0.43-0.58 for the methods outside
    its extra rounds, one session each)."""
    speeds = {1: 1.0, 2: 0.98, 3: 0.95, 4: 0.93, 5: 0.6, 6: 0.85, 7: 0.9}
    labels = {"grid_1": 1, "grid_2": 2, "grid_3": 3, "autotune": 4, "default": 5, "rule_of_thumb": 6, "blind_tpe": 2,
              "random": 7}
    held = {label: 0 for label in labels if label not in TOP}
    runs = 60
    for seed in range(runs):
        judged, truth = _judged(seed, speeds, labels)
        for label in held:
            r = ratio(judged, "oracle", label)
            held[label] += r["low"] <= truth[label] <= r["high"]
    assert 0.90 <= sum(held.values()) / (runs * len(held)) <= 0.99, held
    assert min(held.values()) >= 0.8 * runs, held


def test_every_config_gets_the_same_blocks_and_the_pick_none_of_them():
    """Every method's config has as many figure windows, from the same sessions; the grid's
    best few also play pick blocks of their own, in other sessions."""
    labels = {"grid_1": 1, "grid_2": 2, "grid_3": 3, "autotune": 4, "default": 5, "blind_tpe": 2}
    judged, _ = _judged(0, {i: 1.0 for i in range(1, 6)}, labels)
    figures = {label: (len(v["windows"]), tuple(v["sessions"])) for label, v in judged["labels"].items()}
    assert len(set(figures.values())) == 1
    assert figures["autotune"][0] == methods.JUDGE_WINDOWS * judged["looks"]
    picks = {t: len(judged["labels"][t]["selection_windows"]) for t in TOP}
    assert set(picks.values()) == {figures["autotune"][0]}
    assert "selection_windows" not in judged["labels"]["autotune"]
    distinct = 5
    assert judged["sessions"] == judged["looks"] * (distinct + len(TOP))
    assert judged["windows"] == methods.JUDGE_WINDOWS * judged["sessions"]


@pytest.mark.parametrize("noise", [{"noise": 0.005, "session": 0.0}, {"noise": 0.05, "session": 0.08}])
def test_the_judges_length_depends_on_widths_alone(noise):
    """The same machine and seed, autotune holding the best config, another grid config or
    its own: the judge takes as many blocks (the fewest on a quiet machine, the most on a
    noisy one), whichever config leads."""
    speeds = {1: 1.0, 2: 0.97, 3: 0.95, 4: 0.9}
    looks = set()
    for mine in (1, 2, 4):
        judged, _ = _judged(3, speeds, {"grid_1": 1, "grid_2": 2, "grid_3": 3, "autotune": mine}, **noise)
        looks.add(judged["looks"])
    assert len(looks) == 1
    quiet = noise["session"] == 0
    assert looks == {methods.JUDGE_LOOKS[0] if quiet else methods.JUDGE_LOOKS[1]}
