"""The agent's decisions, on a fake runner whose true speeds we choose."""

from __future__ import annotations

import optuna
import pytest

from autotune.agent import Agent, Settings
from autotune.record import Bottleneck, TrialState
from autotune.recipes import load_recipes
from autotune.errors import TrialFailed
from autotune.testing import FakeRunner

INPUT = {"data": 0.8, "forward": 0.1, "backward": 0.1}
COMPUTE = {"data": 0.0, "forward": 0.5, "backward": 0.5}


def run_agent(runner, tmp_path, study="s", **settings):
    tmp_path.mkdir(parents=True, exist_ok=True)
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    agent = Agent(runner, load_recipes(), storage, study, Settings(**settings), {"conv": False, "checkpoint_blocks": True})
    return agent.run()


def io_speed(c):
    """Latency-bound loading: throughput grows with workers, past the cores too."""
    return 100.0 * (1 + c.data.num_workers) if c.data.num_workers else 100.0


def io_stages(c):
    return INPUT if c.data.num_workers < 4 else COMPUTE


def test_accepts_the_measured_best_worker_count(tmp_path):
    r = run_agent(FakeRunner(io_speed, stages=io_stages), tmp_path)
    assert r.steps[0].recipe == "dataloader" and r.steps[0].accepted
    assert r.final_config["data.num_workers"] >= 4
    assert r.speedup.low > 2.5
    assert r.recommendations[0].accepted and "data.num_workers" in r.recommendations[0].changes


def test_no_knob_helps_nothing_is_accepted(tmp_path):
    """The false-acceptance guard: equal true speeds, noisy windows, several seeds."""
    for seed in range(4):
        runner = FakeRunner(lambda c: 100.0, noise=0.08, seed=seed, stages=lambda c: INPUT)
        r = run_agent(runner, tmp_path / str(seed))
        assert not any(s.accepted for s in r.steps), r.steps
        assert r.final_config["data.num_workers"] == 0
        assert r.speedup.ratio == 1.0


def test_compute_bound_wastes_no_trial_on_the_data_loader(tmp_path):
    runner = FakeRunner(lambda c: 100.0 * (1.3 if c.precision.amp == "bf16" else 1.0), stages=lambda c: COMPUTE)
    r = run_agent(runner, tmp_path)
    assert "dataloader" not in [s.recipe for s in r.steps]
    assert all(m["data.num_workers"] == 0 for m in runner.measured)
    assert r.final_config["precision.amp"] == "bf16"


def test_memory_limit_makes_trials_infeasible_and_a_fitting_config_wins(tmp_path):
    def memory(c):
        return 100 if c.memory.activation_checkpointing or (c.memory.micro_batch_size or 32) <= 8 else 1000

    runner = FakeRunner(lambda c: 100.0, stages=lambda c: COMPUTE, memory=memory)
    r = run_agent(runner, tmp_path, memory_limit=500)
    assert r.initial_diagnosis.bottleneck is Bottleneck.MEMORY
    trials = [t for s in r.steps for t in s.trials]
    assert any(t.state is TrialState.INFEASIBLE and "exceeds the limit" in t.reason for t in trials)
    final = r.final_config
    assert final["memory.activation_checkpointing"] or final["memory.micro_batch_size"] <= 8
    assert r.final.peak_memory_bytes <= 500


def test_crashing_trials_fail_with_reason_and_the_search_goes_on(tmp_path):
    def speed(c):
        if c.data.num_workers == 2:  # a rung of the workers ladder (1, 2, 4, 8)
            raise TrialFailed("crash", "the trial process killed by signal 11 (SIGSEGV)")
        return io_speed(c)

    r = run_agent(FakeRunner(speed, stages=io_stages), tmp_path)
    failed = [t for t in r.steps[0].trials if t.state is TrialState.FAILED]
    assert failed and "SIGSEGV" in failed[0].reason
    assert r.steps[0].accepted
    assert r.final_config["data.num_workers"] > 2  # the ladder went on past the crash


def test_resume_reuses_finished_trials(tmp_path):
    first = FakeRunner(io_speed, stages=io_stages)
    r1 = run_agent(first, tmp_path)
    second = FakeRunner(io_speed, stages=io_stages)
    r2 = run_agent(second, tmp_path)
    assert second.measured == []
    assert second.interleaved == [], "stored comparisons are not measured again"
    assert r2.final_config == r1.final_config
    assert r2.model_dump(exclude={"budget"}) == r1.model_dump(exclude={"budget"})


def test_trial_budget_is_respected(tmp_path):
    runner = FakeRunner(io_speed, stages=io_stages)
    r = run_agent(runner, tmp_path, trials=3)
    assert r.budget.trials_used <= 3
    assert len(runner.measured) <= 1 + 3  # the baseline, then at most 3 trials


def test_a_run_stopped_mid_round_reports_the_trials_that_round_finished(tmp_path):
    """SIGTERM (or Ctrl-C) during a round: its finished trials are in the report as an
    undecided step, counted in the budget, with the wall time so far."""

    class Stopping(FakeRunner):
        def measure(self, config, trace=None, on_window=None, floor=None, until=None):
            if config.data.num_workers == 4:  # the third rung of the workers ladder
                raise KeyboardInterrupt
            return super().measure(config, trace, on_window, floor, until)

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    agent = Agent(Stopping(io_speed, stages=io_stages), load_recipes(), storage, "s", Settings(), {"conv": False})
    with pytest.raises(KeyboardInterrupt):
        agent.run()
    r = agent.report
    assert not r.complete and len(r.steps) == 1
    step = r.steps[0]
    assert step.recipe == "dataloader" and not step.accepted and "stopped before" in step.reason
    assert [t.config["data.num_workers"] for t in step.trials] == [1, 2]
    assert r.budget.trials_used == 2 and r.budget.wall_s > 0
