"""Windows sized to the step: `tune` raises the steps per window until the baseline's windows
last `window_s`, records it in the protocol, and measures everything after with the same steps."""

from __future__ import annotations

import math

import optuna
import pytest

from autotune.agent import SIZED, Agent, Settings
from autotune.errors import UserError
from autotune.measure import MAX_STEPS, WINDOW_S, Protocol
from autotune.recipes import load_recipes
from autotune.testing import FakeRunner

FACTS = {"conv": False, "checkpoint_blocks": True}
BATCH = 32


def test_steps_grow_to_last_the_window_and_never_shrink():
    p = Protocol(steps=12, window_s=0.5)
    assert p.sized(0.002).steps == math.ceil(0.5 / 0.002)
    assert p.sized(0.3) == p  # 12 steps of 0.3 s already last 3.6 s
    assert p.sized(1e-7).steps == MAX_STEPS
    assert p.sized(None) == p and Protocol(steps=12).sized(0.002) == Protocol(steps=12)


def test_the_flags_size_windows_unless_steps_are_given():
    assert Protocol.from_flags().window_s == WINDOW_S
    fixed = Protocol.from_flags(steps=20)
    assert fixed.window_s is None and fixed.steps == 20
    with pytest.raises(UserError, match="--steps 0"):
        Protocol.from_flags(steps=0)


def _run(tmp_path, speed: float, protocol: Protocol, study: str = "s"):
    runner = FakeRunner(lambda c: speed * (1.5 if c.optimizer.impl == "fused" else 1.0), noise=0.01,
                        batch_size=BATCH, protocol=protocol)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    report = Agent(runner, load_recipes(), storage, study, Settings(only=("optimizer-impl",)), FACTS).run()
    return runner, report, storage


def test_a_fast_step_gets_longer_windows_for_the_whole_run_and_its_resume(tmp_path):
    runner, r, storage = _run(tmp_path, 10_000.0, Protocol(windows=4, window_s=0.5))
    step_s = BATCH / 10_000.0
    assert r.protocol.window_s == 0.5 and abs(r.protocol.steps - 0.5 / step_s) < 5  # from a noisy step time
    assert runner.protocol.steps == r.protocol.steps  # the rounds and the final comparison used it too
    assert r.steps and r.steps[0].accepted
    ledger = optuna.load_study(study_name=r.study.name, storage=storage)
    assert ledger.user_attrs[SIZED] == r.protocol.steps
    # Resumed, the stored steps are reused before anything is measured: the same protocol.
    again, r2, _ = _run(tmp_path, 10_000.0, Protocol(windows=4, window_s=0.5))
    assert r2.study.name == r.study.name and again.protocol.steps == r.protocol.steps


def test_a_slow_step_keeps_the_given_steps(tmp_path):
    runner, r, _ = _run(tmp_path, 100.0, Protocol(windows=4, window_s=0.5))  # 0.32 s per step
    assert r.protocol.steps == 12 and runner.protocol.steps == 12


def test_fixed_steps_are_never_sized(tmp_path):
    _, r, _ = _run(tmp_path, 10_000.0, Protocol(windows=4, steps=5))
    assert r.protocol.steps == 5 and r.protocol.window_s is None
