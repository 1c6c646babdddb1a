"""Cost counted honestly: every window a method measured, and the targets that read it."""

from __future__ import annotations

import optuna

from autotune.agent import Agent, Settings
from autotune.recipes import load_recipes
from autotune.testing import FakeRunner
from benchmarks.methods import Metered
from benchmarks.targets import case_targets, suite_targets


class CountedFake(Metered, FakeRunner):
    pass


def test_every_window_the_agent_measured_is_counted():
    """Baseline, A/As, trials, comparisons and duels all open handles on the runner: the
    count is every window drawn, and more than its trials' own windows."""
    runner = CountedFake(lambda c: 100.0 * (1.3 if c.optimizer.impl == "foreach" else 1.0), noise=0.05, seed=0)
    rep = Agent(runner, load_recipes(), optuna.storages.InMemoryStorage(), "cost",
                Settings(seed=0, only=("optimizer-impl",)), {"conv": False, "checkpoint_blocks": False}).run()
    count = runner.count()
    assert count["windows"] == runner.windows_taken
    assert count["measurements"] == len(runner.measured)
    assert count["sessions"] == count["measurements"] + 2 * len(runner.interleaved)
    trials = sum(len(st.trials) for st in rep.steps)
    assert count["windows"] > (trials + 1) * runner.protocol.windows  # comparisons cost windows too
    runner.reset()
    assert runner.count() == {"windows": 0, "sessions": 0, "measurements": 0, "interleaved_pairs": 0}


def _case(name: str, ratio: dict, windows: int, wall_s: float) -> dict:
    r1 = {"ratio": 1.1, "low": 1.02, "high": 1.2, "pairs": 10}
    return {"methods": {"autotune": {"ratio_to_oracle": ratio, "trials": 6, "windows": windows, "wall_s": wall_s,
                                     "feasible": True}},
            "comparisons": {k: r1 for k in ("autotune_vs_blind", "autotune_vs_random", "autotune_vs_default",
                                            "autotune_vs_rule", "rule_vs_oracle")},
            "grid_summary": {"trials": 24, "windows": 120, "wall_s": 100.0}, "name": name}


def test_the_fraction_target_counts_the_point_and_the_lower_bound_and_the_budget_is_windows_and_seconds():
    near = _case("near", {"ratio": 0.97, "low": 0.91, "high": 1.03, "pairs": 32}, windows=30, wall_s=20.0)
    t = case_targets(near)
    assert t["oracle"]["met"] and not t["oracle_lower"]["met"]
    assert t["windows"]["met"] and t["wall"]["met"]  # 30 of 120 windows, 20 of 100 s
    costly = _case("costly", {"ratio": 1.0, "low": 0.96, "high": 1.04, "pairs": 32}, windows=31, wall_s=26.0)
    t2 = case_targets(costly)
    assert t2["oracle"]["met"] and t2["oracle_lower"]["met"]
    assert not t2["windows"]["met"] and not t2["wall"]["met"]
    for c, t_ in ((near, t), (costly, t2)):
        c["targets"], c["diagnosis"] = t_, {"planted": None}
    s = suite_targets([near, costly], None, 60.0, quick=True)
    assert s["oracle_every_example"]["met"] and not s["oracle_lower_every_example"]["met"]
    assert s["windows_quarter_every_example"]["missed"] == ["costly (31)"]
