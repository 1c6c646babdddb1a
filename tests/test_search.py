"""One recipe's Optuna search, driven by a `FakeRunner`: what is measured, in what order,
what is stored, what is resumed, and how failures and constraint violations are recorded."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import time

import optuna
import pytest

from autotune.config import TrainConfig
from autotune.errors import ConfigError, TrialFailed
from autotune.record import FailureKind, Signals, StageTime, StepTime, Summary, TrialState
from autotune.search import (
    LOSS_TOLERANCE, Constraints, RecipeSearch, loss_diverged, normalized, quiet_optuna, trial_record,
)
from autotune.testing import FakeRunner

WORKERS = {"data.num_workers": [0, 1, 2]}


@pytest.fixture(autouse=True)
def _restore_optuna_verbosity():
    before = optuna.logging.get_verbosity()
    yield
    optuna.logging.set_verbosity(before)


def speed_by_workers(c: TrainConfig) -> float:
    return 100.0 * (1 + c.data.num_workers)


def search(runner, space=WORKERS, storage=None, name="recipe", incumbent=None, memory_limit=None, seed=0):
    return RecipeSearch(storage or optuna.storages.InMemoryStorage(), name, space, incumbent or TrainConfig(),
                        runner, Constraints(memory_limit, [1.0, 0.9]), seed)


def summary(peak: int | None = 1000, losses: list[float] | None = None) -> Summary:
    return Summary(
        config=TrainConfig().flat(), step_time_s=StepTime(median=0.01, p90=0.011, mean=0.01), samples_per_s=100.0,
        windows_samples_per_s=[100.0, 100.0], window_cv=0.0,
        stages={"data": StageTime(s=0.0, share=0.0), "forward": StageTime(s=0.01, share=1.0)},
        peak_memory_bytes=peak, signals=Signals(), measured_steps=4,
        first_losses=[1.0, 0.9] if losses is None else losses,
    )


def by_workers(s: RecipeSearch) -> dict[int, optuna.trial.FrozenTrial]:
    return {t.params["data.num_workers"]: t for t in s.study.trials}


# --- normalized ----------------------------------------------------------------------------


def test_normalized_drops_prefetch_and_persistent_without_workers():
    c = normalized(TrainConfig(), {"data.prefetch_factor": 4, "data.persistent_workers": True})
    assert c.data.num_workers == 0
    assert c.data.prefetch_factor is None
    assert c.data.persistent_workers is False


def test_normalized_drops_them_when_the_change_removes_the_workers():
    incumbent = TrainConfig().with_changes({"data.num_workers": 2, "data.prefetch_factor": 4,
                                            "data.persistent_workers": True})
    c = normalized(incumbent, {"data.num_workers": 0})
    assert (c.data.num_workers, c.data.prefetch_factor, c.data.persistent_workers) == (0, None, False)


def test_normalized_keeps_them_with_workers_and_keeps_other_keys():
    incumbent = TrainConfig().with_changes({"backend.num_threads": 2})
    c = normalized(incumbent, {"data.num_workers": 2, "data.prefetch_factor": 4, "data.persistent_workers": True})
    assert (c.data.num_workers, c.data.prefetch_factor, c.data.persistent_workers) == (2, 4, True)
    assert c.backend.num_threads == 2


def test_normalized_still_rejects_invalid_values():
    with pytest.raises(ConfigError, match="prefetch_factor"):
        normalized(TrainConfig(), {"data.num_workers": 2, "data.prefetch_factor": 0})


# --- loss_diverged -------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_loss_diverged(bad):
    assert "not finite" in loss_diverged([1.0, bad], [1.0, 1.0])
    assert "not finite" in loss_diverged([bad], [])  # even without a reference


def test_loss_beyond_tolerance_diverged():
    msg = loss_diverged([1.3, 1.3], [1.0, 1.0])
    assert msg is not None
    assert "first 2 steps" in msg and "1.3" in msg and "25%" in msg
    assert loss_diverged([0.7], [1.0]) is not None  # below the reference counts too


def test_loss_within_tolerance_is_fine():
    assert LOSS_TOLERANCE == 0.25
    assert loss_diverged([1.2, 1.2], [1.0, 1.0]) is None
    assert loss_diverged([0.8], [1.0]) is None
    assert loss_diverged([1.0, 0.9], [1.0, 0.9]) is None


def test_loss_compares_only_the_common_prefix():
    assert loss_diverged([1.0, 100.0], [1.0]) is None
    assert loss_diverged([1.0], [1.0, 100.0]) is None


def test_empty_reference_or_losses_never_diverge():
    assert loss_diverged([5.0, 6.0], []) is None
    assert loss_diverged([], [1.0]) is None


# --- Constraints ---------------------------------------------------------------------------


def test_constraints_reject_peak_memory_over_the_limit():
    msg = Constraints(memory_limit=1500, reference_losses=[1.0, 0.9]).check(summary(peak=2000))
    assert msg is not None and "2000" in msg and "1500" in msg and "exceeds" in msg


def test_constraints_reject_diverged_loss():
    msg = Constraints(memory_limit=None, reference_losses=[1.0, 0.9]).check(summary(losses=[3.0, 3.0]))
    assert msg is not None and "mean loss" in msg
    assert "not finite" in Constraints(None, [1.0]).check(summary(losses=[float("nan")]))


def test_constraints_pass_a_good_summary():
    assert Constraints(memory_limit=1500, reference_losses=[1.0, 0.9]).check(summary(peak=1500)) is None
    assert Constraints(memory_limit=None, reference_losses=[1.0, 0.9]).check(summary(peak=10**12)) is None
    assert Constraints(memory_limit=1500, reference_losses=[1.0, 0.9]).check(summary(peak=None)) is None


# --- RecipeSearch --------------------------------------------------------------------------


def test_small_space_is_walked_whole_with_the_incumbent_first():
    runner = FakeRunner(speed_by_workers, noise=0.0)
    incumbent = TrainConfig().with_changes({"data.num_workers": 1})
    s = search(runner, incumbent=incumbent)
    assert s.grid == 3
    ran = s.run(n_trials=10, deadline=None)
    assert ran == 3
    assert runner.measured[0] == normalized(incumbent, {}).flat()  # DataLoader's default prefetch depth, named
    assert runner.measured[0]["data.prefetch_factor"] == 2
    assert s.study.trials[0].params == {"data.num_workers": 1}
    assert sorted(c["data.num_workers"] for c in runner.measured) == [0, 1, 2]
    assert len(runner.measured) == 3  # every point once
    records = [trial_record(t) for t in s.study.trials]
    assert all(r.state is TrialState.OK for r in records)
    assert records[0].changes == {}
    first_other = next(r for r in records if r.number != 0)
    assert "data.num_workers" in first_other.changes
    assert s.best().params == {"data.num_workers": 2}
    assert s.best().value == pytest.approx(300.0)


def test_trial_count_is_capped_by_n_trials():
    runner = FakeRunner(speed_by_workers, noise=0.0)
    s = search(runner)
    assert s.run(n_trials=2, deadline=None) == 2
    assert len(runner.measured) == 2
    assert runner.measured[0] == TrainConfig().flat()


def test_a_passed_deadline_runs_nothing():
    runner = FakeRunner(speed_by_workers, noise=0.0)
    s = search(runner)
    assert s.run(n_trials=10, deadline=0.0) == 0
    assert runner.measured == []


def test_resumed_search_measures_nothing_again(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    first = FakeRunner(speed_by_workers, noise=0.0)
    s1 = search(first, storage=url, name="dataloader")
    assert s1.run(n_trials=2, deadline=None) == 2  # interrupted after two trials

    second = FakeRunner(speed_by_workers, noise=0.0)
    s2 = search(second, storage=url, name="dataloader")
    assert s2.run(n_trials=10, deadline=None) == 1
    done = {c["data.num_workers"] for c in first.measured}
    assert [c["data.num_workers"] for c in second.measured] == sorted({0, 1, 2} - done)
    assert len(s2.finished()) == 3
    assert s2.best().params == {"data.num_workers": 2}

    third = FakeRunner(speed_by_workers, noise=0.0)
    s3 = search(third, storage=url, name="dataloader")
    assert s3.run(n_trials=10, deadline=None) == 0
    assert third.measured == []
    # the stored records survive the restart
    assert sorted(trial_record(t).samples_per_s for t in s3.finished()) == [100.0, 200.0, 300.0]


def test_resumed_search_does_not_enqueue_waiting_points_twice(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    waiting = (optuna.trial.TrialState.WAITING,)
    s1 = search(FakeRunner(speed_by_workers, noise=0.0), storage=url, name="dataloader")
    s1.run(n_trials=1, deadline=None)
    assert len(s1.study.get_trials(states=waiting)) == 2
    s2 = search(FakeRunner(speed_by_workers, noise=0.0), storage=url, name="dataloader")
    assert len(s2.study.get_trials(states=waiting)) == 2
    assert len(s2.study.trials) == 3


def test_oom_is_infeasible_and_crash_is_failed_with_reasons():
    def speed(c: TrainConfig) -> float:
        if c.data.num_workers == 1:
            raise TrialFailed(FailureKind.OOM, "CUDA out of memory. Tried to allocate 2 GiB")
        if c.data.num_workers == 2:
            raise TrialFailed(FailureKind.CRASH, "the trial process killed by signal 11 (SIGSEGV)")
        return 100.0

    runner = FakeRunner(speed, noise=0.0)
    s = search(runner)
    assert s.run(n_trials=10, deadline=None) == 3
    trials = by_workers(s)
    assert trials[1].state == optuna.trial.TrialState.PRUNED
    assert trials[2].state == optuna.trial.TrialState.PRUNED
    oom, crash, ok = trial_record(trials[1]), trial_record(trials[2]), trial_record(trials[0])
    assert oom.state is TrialState.INFEASIBLE
    assert oom.reason == "oom: CUDA out of memory. Tried to allocate 2 GiB"
    assert oom.samples_per_s is None
    assert crash.state is TrialState.FAILED
    assert crash.reason == "crash: the trial process killed by signal 11 (SIGSEGV)"
    assert crash.samples_per_s is None
    assert ok.state is TrialState.OK and ok.reason is None and ok.samples_per_s == pytest.approx(100.0)
    assert s.best().params == {"data.num_workers": 0}


def test_timeout_and_user_code_failures_are_failed():
    def speed(c: TrainConfig) -> float:
        if c.data.num_workers == 1:
            raise TrialFailed(FailureKind.TIMEOUT, "no answer to 'window' within 3 s")
        if c.data.num_workers == 2:
            raise TrialFailed(FailureKind.USER_CODE, "ValueError: boom")
        return 100.0

    s = search(FakeRunner(speed, noise=0.0))
    s.run(n_trials=10, deadline=None)
    trials = by_workers(s)
    assert trial_record(trials[1]).state is TrialState.FAILED
    assert trial_record(trials[1]).reason.startswith("timeout: ")
    assert trial_record(trials[2]).state is TrialState.FAILED
    assert trial_record(trials[2]).reason == "user_code: ValueError: boom"


def test_constraint_violations_are_infeasible_with_the_summary_kept():
    runner = FakeRunner(speed_by_workers, noise=0.0, memory=lambda c: 5000 if c.data.num_workers == 2 else 1000,
                        losses=lambda c: [9.0, 9.0] if c.data.num_workers == 1 else [1.0, 0.9])
    s = search(runner, memory_limit=2000)
    s.run(n_trials=10, deadline=None)
    trials = by_workers(s)
    mem, loss = trial_record(trials[2]), trial_record(trials[1])
    assert mem.state is TrialState.INFEASIBLE and "exceeds the limit 2000" in mem.reason
    assert mem.peak_memory_bytes == 5000  # measured, so its summary is stored
    assert loss.state is TrialState.INFEASIBLE and "mean loss" in loss.reason
    assert "summary" in trials[1].user_attrs
    # the fastest trials are infeasible: best() is the only one that fits
    assert s.best().params == {"data.num_workers": 0}


def test_invalid_combination_is_infeasible_and_normalised_duplicates_are_not_planned():
    space = {"data.num_workers": [0, 1], "data.prefetch_factor": [None, 0]}
    runner = FakeRunner(speed_by_workers, noise=0.0)
    s = search(runner, space=space)
    # without workers a prefetch depth means nothing: (0, 0) is (0, None) again, not planned
    assert s.grid == 3 and {"data.num_workers": 0, "data.prefetch_factor": 0} not in s.points
    assert s.run(n_trials=10, deadline=None) == 3
    trials = {(t.params["data.num_workers"], t.params["data.prefetch_factor"]): t for t in s.study.trials}
    invalid = trial_record(trials[(1, 0)])
    assert invalid.state is TrialState.INFEASIBLE
    assert invalid.reason.startswith("invalid combination: ")
    assert "prefetch_factor" in invalid.reason
    assert len(runner.measured) == 2
    assert s.best().params["data.num_workers"] == 1


def test_a_config_sampled_twice_is_measured_once():
    """TPE may suggest a config already measured: the stored measurement is reused."""
    runner = FakeRunner(speed_by_workers, noise=0.0)
    s = search(runner, space={"data.num_workers": [0, 1, 2]})
    s.run(n_trials=3, deadline=None)
    with quiet_optuna():
        s.study.enqueue_trial({"data.num_workers": 2})
        s.study.optimize(s.objective, n_trials=1)
    again = s.study.trials[-1]
    assert again.user_attrs.get("reused_from") is not None and again.value == 300.0
    assert len(runner.measured) == 3


def test_a_config_an_earlier_round_measured_takes_that_reading():
    """resnet_jpeg's loader round measured one thread alone (from no workers); the threads
    round's only config was the same, and was measured again. A later search takes the
    earlier reading (or the state that ruled it out), says where it came from, and
    measures only what is new; a crash is measured again."""
    from autotune.search import remember

    def speed(c: TrainConfig) -> float:
        if c.data.num_workers == 2:
            raise TrialFailed(FailureKind.CRASH, "a worker died")
        return 100.0 * (1 + c.data.num_workers)

    storage = optuna.storages.InMemoryStorage()
    runner = FakeRunner(speed, noise=0.0, memory=lambda c: 2000 if c.data.num_workers == 3 else 500)
    first = RecipeSearch(storage, "r01", {"data.num_workers": [1, 2, 3]}, TrainConfig(), runner,
                         Constraints(1000, [1.0, 0.9]), 0, incumbent_known=True)
    first.run(3, deadline=None)
    assert len(runner.measured) == 3
    earlier: dict = {}
    remember(earlier, "r01", first.finished())
    later = RecipeSearch(storage, "r02", {"data.num_workers": [1, 2, 3, 4]}, TrainConfig(), runner,
                         Constraints(1000, [1.0, 0.9]), 0, incumbent_known=True, earlier=earlier)
    later.run(4, deadline=None)
    records = {t.params["data.num_workers"]: trial_record(t) for t in later.finished()}
    assert [c["data.num_workers"] for c in runner.measured[3:]] == [2, 4], "only the crash and the new config"
    assert records[1].reused_from and records[1].reused_from.startswith("r01#") and records[1].samples_per_s == 200.0
    assert records[3].state is TrialState.INFEASIBLE and records[3].reused_from
    assert records[2].reused_from is None and records[4].reused_from is None


def test_best_is_none_when_nothing_is_feasible():
    def speed(c: TrainConfig) -> float:
        raise TrialFailed(FailureKind.OOM, "out of memory")

    s = search(FakeRunner(speed, noise=0.0))
    s.run(n_trials=10, deadline=None)
    assert len(s.finished()) == 3
    assert s.best() is None
    assert {trial_record(t).state for t in s.study.trials} == {TrialState.INFEASIBLE}


def test_trials_store_their_config_changes_and_summary():
    runner = FakeRunner(speed_by_workers, noise=0.0)
    s = search(runner)
    s.run(n_trials=10, deadline=None)
    for t in s.study.trials:
        r = trial_record(t)
        assert r.config == normalized(TrainConfig(), t.params).flat()
        assert r.changes == TrainConfig().diff(normalized(TrainConfig(), t.params))
        stored = Summary.model_validate(t.user_attrs["summary"])
        assert stored.config == r.config
        assert r.samples_per_s == pytest.approx(stored.samples_per_s)


def test_on_trial_is_called_once_per_trial_run_now():
    seen = []
    s = search(FakeRunner(speed_by_workers, noise=0.0))
    s.run(n_trials=2, deadline=None, on_trial=seen.append)
    assert len(seen) == 2


def test_on_trial_sees_the_trial_that_just_finished():
    seen = []
    s = search(FakeRunner(speed_by_workers, noise=0.0))
    s.run(n_trials=10, deadline=None, on_trial=seen.append)
    assert [t.number for t in seen] == [0, 1, 2]
    assert all(trial_record(t).state is TrialState.OK for t in seen)


# --- Optuna's logging ----------------------------------------------------------------------


def test_search_is_quiet_inside_and_restores_the_callers_verbosity():
    inside = []

    def speed(c: TrainConfig) -> float:
        inside.append(optuna.logging.get_verbosity())
        return 100.0

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = search(FakeRunner(speed, noise=0.0))
    assert optuna.logging.get_verbosity() == optuna.logging.WARNING
    s.run(n_trials=10, deadline=None)
    assert optuna.logging.get_verbosity() == optuna.logging.WARNING
    assert inside and set(inside) == {optuna.logging.ERROR}


def test_quiet_optuna_restores_verbosity_after_an_error():
    optuna.logging.set_verbosity(optuna.logging.DEBUG)
    with pytest.raises(RuntimeError):
        with quiet_optuna():
            assert optuna.logging.get_verbosity() == optuna.logging.ERROR
            raise RuntimeError("x")
    assert optuna.logging.get_verbosity() == optuna.logging.DEBUG


def test_importing_and_searching_leave_the_callers_verbosity(tmp_path):
    """In a fresh interpreter, so the import itself is checked, not a cached module."""
    code = textwrap.dedent("""
        import optuna
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        import autotune.search
        from autotune.config import TrainConfig
        from autotune.search import Constraints, RecipeSearch
        from autotune.testing import FakeRunner
        assert optuna.logging.get_verbosity() == optuna.logging.WARNING, "import"
        s = RecipeSearch(optuna.storages.InMemoryStorage(), "r", {"data.num_workers": [0, 1]}, TrainConfig(),
                         FakeRunner(lambda c: 100.0, noise=0.0), Constraints(None, []), 0)
        s.run(5, None)
        assert optuna.logging.get_verbosity() == optuna.logging.WARNING, "search"
        print("verbosity", optuna.logging.get_verbosity())
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"verbosity {optuna.logging.WARNING}" in p.stdout
    assert "Trial 0 finished" not in p.stderr  # Optuna's INFO lines stayed off


def test_no_trial_is_left_unfinished():
    s = search(FakeRunner(speed_by_workers, noise=0.0))
    s.run(n_trials=10, deadline=None)
    assert all(t.state.is_finished() for t in s.study.trials)
    assert not any(math.isnan(t.value) for t in s.study.trials if t.value is not None)


def test_a_search_whose_trials_run_long_does_not_start_one_past_the_deadline():
    """The run's earlier trials took a second; this search's first took 50 s (a compile):
    with 30 s left, the next one is not started, whatever the run-wide estimate says."""

    class Slow(FakeRunner):
        def measure(self, config, trace=None, on_window=None, floor=None, until=None):
            return super().measure(config, trace, on_window, floor, until).model_copy(update={"wall_s": 50.0})

    runner = Slow(speed_by_workers, noise=0.0)
    s = search(runner)
    assert s.run(n_trials=1, deadline=None) == 1
    assert s.run(n_trials=3, deadline=time.time() + 30, cost_s=1.0) == 0
    assert s.skipped == 2 and len(runner.measured) == 1
    assert s.run(n_trials=3, deadline=time.time() + 300, cost_s=1.0) == 2  # with time, it goes on
