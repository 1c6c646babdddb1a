"""A trial far slower than a config that fits is stopped after its first window, as an
engineer stops a run they can see lost (fp16 emulated on a CPU read 5 samples/s against
330: a window of 96 s, a trial of 8 minutes, past the run's budget). All on `FakeRunner`."""

from __future__ import annotations

import time as real_time

import optuna
import pytest

from autotune import machine
from autotune import runner as runner_mod
from autotune import search as search_mod
from autotune.config import TrainConfig
from autotune.errors import TrialCut
from autotune.measure import Protocol
from autotune.record import TrialState
from autotune.search import Constraints, RecipeSearch, trial_record
from autotune.testing import FakeRunner

from test_decisions import run_agent


class Counting(FakeRunner):
    """Counts the windows each config was measured for."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.windows_of: dict[str, int] = {}

    def draw(self, config: TrainConfig) -> float:
        k = config.short()
        self.windows_of[k] = self.windows_of.get(k, 0) + 1
        return super().draw(config)


def test_measure_stops_a_config_whose_windows_read_below_the_floor():
    runner = Counting(lambda c: 10.0, noise=0.0, protocol=Protocol(windows=5))
    with pytest.raises(TrialCut) as cut:
        runner.measure(TrainConfig(), floor=100.0)
    assert cut.value.windows == [10.0] and cut.value.of == 5
    assert runner.windows_taken == 1
    assert "stopped after 1 of 5 windows" in str(cut.value)


def test_measure_runs_every_window_when_one_reaches_the_floor():
    seen = iter([150.0, 10.0, 10.0, 10.0, 10.0])
    runner = FakeRunner(lambda c: next(seen), noise=0.0, protocol=Protocol(windows=5))
    s = runner.measure(TrainConfig(), floor=100.0)  # a window above it: not surely slow
    assert len(s.windows_samples_per_s) == 5
    assert len(FakeRunner(lambda c: 10.0, noise=0.0, protocol=Protocol(windows=3)).measure(
        TrainConfig(), floor=None).windows_samples_per_s) == 3


def test_a_far_slower_config_is_stopped_and_its_reading_reported(tmp_path):
    """fp16 is emulated (50x slower): its trial is stopped after one window and reported
    as slow with what it read; bf16 (as fast as fp32) is measured in full."""

    def speed(c):
        return 100.0 * {"none": 1.0, "bf16": 1.0, "fp16": 0.02}[c.precision.amp]

    runner = Counting(speed, noise=0.01, protocol=Protocol(windows=5))
    r = run_agent(runner, tmp_path, only=("amp",))
    trials = {t.config["precision.amp"]: t for s in r.steps for t in s.trials}
    assert trials["bf16"].state is TrialState.OK
    slow = trials["fp16"]
    assert slow.state is TrialState.SLOW, slow
    assert slow.samples_per_s is not None and slow.samples_per_s < 5
    assert "stopped after 1 of 5 windows" in slow.reason
    assert runner.windows_of[TrainConfig(precision={"amp": "fp16"}).short()] == 1
    assert runner.windows_of[TrainConfig(precision={"amp": "bf16"}).short()] >= 5
    assert r.final_config["precision.amp"] == "none"


def test_the_most_promising_config_stopped_as_slow_ends_the_round(tmp_path):
    def speed(c):
        return 100.0 * {"none": 1.0, "bf16": 0.02, "fp16": 0.9}[c.precision.amp]

    runner = Counting(speed, noise=0.01, protocol=Protocol(windows=5))
    r = run_agent(runner, tmp_path, only=("amp",))
    step = r.steps[0]
    assert [t.state for t in step.trials] == [TrialState.SLOW]
    assert "measured 0.02x the current config's pooled estimate" in step.reason
    assert TrainConfig(precision={"amp": "fp16"}).short() not in runner.windows_of


def test_nothing_is_stopped_while_the_incumbent_does_not_fit(tmp_path):
    """Over a memory limit the incumbent's speed is no floor: a slow config that fits may
    be the answer (checkpointing at a fifth of the speed is the only fit)."""

    def speed(c):
        return 100.0 * (0.2 if c.memory.activation_checkpointing else 1.0)

    def memory(c):
        return 50 if c.memory.activation_checkpointing else 190

    runner = Counting(speed, memory=memory, noise=0.01, protocol=Protocol(windows=5),
                      stages=lambda c: {"forward": 0.5, "backward": 0.5})
    r = run_agent(runner, tmp_path, memory_limit=100, only=("activation-checkpointing",))
    assert r.final_config["memory.activation_checkpointing"] is True
    assert all(t.state is not TrialState.SLOW for s in r.steps for t in s.trials)


def test_a_ladder_rung_stopped_as_slow_ends_the_climb(tmp_path, monkeypatch):
    """Loader workers help up to 2; at 4 the host thrashes (50x slower): that rung is
    stopped after a window and the climb does not go on to 8."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        w = c.data.num_workers
        return 100.0 * (0.02 if w >= 4 else 1 + w)

    runner = Counting(speed, noise=0.005, protocol=Protocol(windows=5),
                      stages=lambda c: {"data": 0.8, "forward": 0.1, "backward": 0.1})
    r = run_agent(runner, tmp_path, only=("dataloader",))
    tried = {t.config["data.num_workers"]: t.state for s in r.steps for t in s.trials}
    assert tried.get(4) is TrialState.SLOW, tried
    assert 8 not in tried, tried
    assert r.final_config["data.num_workers"] in (2, 3)


def test_a_trial_running_past_the_deadline_stops_after_its_window(monkeypatch):
    """The budget is kept: a trial whose cost was underestimated (a first compilation) stops
    after the window in which the deadline passed, reported as failed, not as a reading."""
    class Clock:
        now = 1000.0

        def __getattr__(self, name):
            return getattr(real_time, name)

        def time(self):
            return self.now

    clock = Clock()
    monkeypatch.setattr(runner_mod, "time", clock)
    monkeypatch.setattr(search_mod, "time", clock)

    class Slow(FakeRunner):
        def draw(self, config):
            clock.now += 10.0  # each window takes 10 s of the run's clock
            return super().draw(config)

    runner = Slow(lambda c: 100.0, noise=0.0, protocol=Protocol(windows=5))
    storage = optuna.storages.InMemoryStorage()
    s = RecipeSearch(storage, "r", {"precision.amp": ["bf16"]}, TrainConfig(), runner, Constraints(None, []), 0,
                     incumbent_known=True)
    s.run(1, deadline=1025.0)
    [t] = s.finished()
    rec = trial_record(t)
    assert rec.state is TrialState.FAILED and rec.samples_per_s is None
    assert "stopped after 3 of 5 windows: the run's time budget was spent" in rec.reason
    assert not s.ranked()
