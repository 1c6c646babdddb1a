"""Parallel trials through shared storage, with in-process stand-ins for the workers
(threads running the worker's own claim / objective / tell on a `FakeRunner`): the queue
is fed no faster than workers take it, every planned point is measured once, a trial
whose worker stops beating is failed and measured again by another, two workers never
claim one trial, and core sets never overlap. The real processes are in test_workers.py."""

from __future__ import annotations

import threading
import time

import optuna
import pytest

from autotune.config import TrainConfig
from autotune.errors import UserError
from autotune.heartbeat import Beat, reap
from autotune.pool import Dispatcher, given_up, split_cores
from autotune.search import Constraints, RecipeSearch
from autotune.serve import _measure, claim
from autotune.storage import open_storage
from autotune.testing import FakeRunner

SPACE = {"data.num_workers": [0, 1, 2, 3], "data.prefetch_factor": [2, 4]}
_DONE = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


@pytest.fixture(autouse=True)
def fast_heartbeat(monkeypatch):
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT", "1,5")


@pytest.fixture(params=["journal", "sqlite"])
def storage(request, tmp_path):
    url = f"journal:///{tmp_path}/j.log" if request.param == "journal" else f"sqlite:///{tmp_path}/s.db"
    return open_storage(url, shared=True)


def runner() -> FakeRunner:
    return FakeRunner(lambda c: 100.0 * (1 + c.data.num_workers), noise=0.0)


def fake_worker(storage, name: str, stop: threading.Event, log: list, die_on: int | None = None,
                gone: threading.Event | None = None) -> None:
    """What `serve` does with one search, on a FakeRunner (its own claim and `_measure`);
    `die_on`: the n-th claim is abandoned without a word (a worker killed mid-trial)."""
    sampler = optuna.samplers.TPESampler(seed=threading.get_ident() % 2**31, constant_liar=True)
    search = RecipeSearch.attach(storage, name, runner(), sampler)
    claims = 0
    while not stop.is_set():
        tid = claim(storage, search.study)
        if tid is None:
            time.sleep(0.05)
            continue
        claims += 1
        trial = optuna.Trial(search.study, tid)
        if die_on == claims:  # one beat, then silence: the worker is gone mid-trial
            Beat(storage, tid).beat()
            gone.set()
            return
        said: list[str] = []
        _measure(storage, search, tid, said.append)  # the worker's own measure / beat / tell
        if "given up" not in said[-1]:  # a trial reaped before or while measured is dropped, not counted
            log.append((threading.get_ident(), trial.number))


def run_search(storage, workers: int, die_on: int | None = None, n_trials: int = 8):
    ledger = optuna.create_study(study_name="run", storage=storage)
    pool = Dispatcher(storage, poll_s=0.2)
    pool.bind("run", {"machine_id": runner_machine(), "machine": {}})
    search = RecipeSearch(storage, "run/01-r", SPACE, TrainConfig(), runner(), Constraints(None, []), 0, pool=pool)
    stop, log, gone = threading.Event(), [], threading.Event()
    threads = [threading.Thread(target=fake_worker, args=(storage, "run/01-r", stop, log, die_on if i == 0 else None,
                                                          gone)) for i in range(workers)]
    for i in range(workers):  # present in the run's study, as `serve` makes them
        ledger.set_user_attr(f"worker:test:{i}", {"machine": runner_machine(), "seen": time.time() + 3600})
    reported: list = []
    runs = threading.Thread(target=lambda: reported.append(search.run(n_trials, None, on_trial=reported.append,
                                                                      cost_s=None)))
    runs.start()
    threads[0].start()
    if die_on is not None:  # the dying worker takes its trial before the others start
        assert gone.wait(60)
    for t in threads[1:]:
        t.start()
    try:
        runs.join(120)
        assert not runs.is_alive(), "the search never finished"
        ran = reported.pop()
    finally:
        stop.set()
        for t in threads:
            t.join()
    return search, ran, reported, log


def runner_machine() -> str:
    from autotune import machine

    return machine.worker_ref(runner().device).machine


def test_two_workers_measure_every_planned_point_once(storage):
    search, ran, reported, log = run_search(storage, workers=2)
    done = search.finished()
    assert ran == len(reported) == len(done) == 7  # the distinct configs: prefetch without workers is one
    configs = [repr(sorted(t.user_attrs["config"].items())) for t in done if "reused_from" not in t.user_attrs]
    assert len(configs) == len(set(configs)), "a config was measured twice"
    assert search.best().user_attrs["config"]["data.num_workers"] == 3


def test_the_queue_is_fed_no_faster_than_the_workers_take_it(storage):
    """With one worker, never more than one trial waits or runs: the sampler sees each result."""
    peak = []
    orig = optuna.Study.enqueue_trial

    def spy(self, *a, **k):
        pending = self.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING))
        peak.append(len(pending))
        return orig(self, *a, **k)

    optuna.Study.enqueue_trial = spy
    try:
        run_search(storage, workers=1, n_trials=5)
    finally:
        optuna.Study.enqueue_trial = orig
    assert peak and max(peak) == 0


def test_a_trial_whose_worker_died_is_failed_and_measured_again(storage):
    search, ran, reported, log = run_search(storage, workers=2, die_on=1, n_trials=6)
    trials = search.study.get_trials(deepcopy=False)
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 1, "the abandoned trial is failed once, by the heartbeat"
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == failed[0].number]
    assert len(retried) == 1 and retried[0].state in _DONE
    assert retried[0].params == failed[0].system_attrs["fixed_params"]  # the same point, measured now
    assert len(search.finished()) == 6
    assert given_up(search.study, search) == []


def test_a_fresh_beat_is_left_alone_and_a_stale_one_is_reaped(storage, monkeypatch):
    study = optuna.create_study(study_name="s", storage=storage)
    study.enqueue_trial({"x": 1})
    study.enqueue_trial({"x": 2})
    a, b = claim(storage, study), claim(storage, study)
    assert a is not None and b is not None and a != b
    Beat(storage, a).beat()  # a's worker beat once, then went silent
    with Beat(storage, b):
        time.sleep(6.5)  # past the grace period: a's silence counts, b's beat is fresh
        assert reap(storage, study) == 1
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states[0] == optuna.trial.TrialState.FAIL and states[1] == optuna.trial.TrialState.RUNNING
    assert [t.system_attrs.get("fixed_params") for t in study.get_trials(deepcopy=False)
            if t.state == optuna.trial.TrialState.WAITING] == [{"x": 1}]


def test_a_trial_claimed_and_never_beaten_is_reaped(storage):
    """A worker killed between its claim and its first beat (its coordinator was killed,
    PR_SET_PDEATHSIG) left a trial that Optuna's own heartbeat never saw: a resumed run
    waited on it forever. Claimed longer than the grace period ago and never beaten: lost."""
    study = optuna.create_study(study_name="n", storage=storage)
    study.enqueue_trial({"x": 1})
    study.enqueue_trial({"x": 2})
    lost, live = claim(storage, study), claim(storage, study)
    assert lost is not None and live is not None
    with Beat(storage, live):
        time.sleep(6.5)  # past the grace period
        assert reap(storage, study) == 1
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states[0] == optuna.trial.TrialState.FAIL and states[1] == optuna.trial.TrialState.RUNNING


def test_a_copy_queued_for_a_lost_trial_is_not_reaped_for_its_predecessors_beat(storage):
    """CI, journal storage: Optuna's retry callback copies the lost trial's system
    attributes, its last beat included, onto the copy it queues; the reaper read that stale
    beat as the copy's and failed the copy between its claim and its first beat. Only a
    trial's own beat counts; a copy never beaten is judged from its own claim."""
    study = optuna.create_study(study_name="r", storage=storage)
    study.enqueue_trial({"x": 1})
    lost = claim(storage, study)
    with Beat(storage, lost):  # its worker beat once, then went silent
        pass
    time.sleep(6.5)  # past the grace period
    assert reap(storage, study) == 1
    copy = claim(storage, study)
    assert copy is not None and copy != lost
    assert "autotune:heartbeat" in storage.get_trial(copy).system_attrs  # Optuna copied the stale beat
    assert reap(storage, study) == 0, "the copy was reaped for its predecessor's silence"
    assert storage.get_trial(copy).state == optuna.trial.TrialState.RUNNING
    time.sleep(6.5)  # past the grace period, never beaten: lost too
    assert reap(storage, study) == 1
    assert storage.get_trial(copy).state == optuna.trial.TrialState.FAIL


def test_a_trial_reaped_before_its_first_beat_is_dropped_not_a_crash(storage):
    """CI, a loaded host: the reaper failed a claimed trial before its worker's first beat,
    and the beat raised out of the worker (UpdateFinishedTrialError): its thread died and
    the search never finished. The worker drops that trial, says so, and goes on."""
    search = RecipeSearch(storage, "run/01-r", SPACE, TrainConfig(), runner(), Constraints(None, []), 0)
    search.study.enqueue_trial({"data.num_workers": 1, "data.prefetch_factor": 2})
    tid = claim(storage, search.study)
    assert tid is not None
    storage.set_trial_state_values(tid, optuna.trial.TrialState.FAIL)  # what `reap` does to it
    said: list[str] = []
    _measure(storage, search, tid, said.append)
    assert "given up as lost" in said[-1]
    assert storage.get_trial(tid).state == optuna.trial.TrialState.FAIL and storage.get_trial(tid).value is None


def test_two_claimants_never_take_the_same_trial(storage):
    study = optuna.create_study(study_name="c", storage=storage)
    for i in range(6):
        study.enqueue_trial({"x": i})
    got: list[int] = []
    lock = threading.Lock()

    def take():
        while (tid := claim(storage, study)) is not None:
            with lock:
                got.append(tid)

    threads = [threading.Thread(target=take) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(set(got)) and len(got) == 6


def test_core_sets_are_disjoint_and_equal():
    assert split_cores([0, 1], 2) == [[0], [1]]
    assert split_cores([0, 1, 2, 3, 4], 2) == [[0, 1], [2, 3]]
    assert split_cores([4, 5, 6, 7], 1) == [[4, 5, 6, 7]]
    with pytest.raises(UserError, match="--workers 3"):
        split_cores([0, 1], 3)
    with pytest.raises(UserError, match="--workers 0"):
        split_cores([0, 1], 0)



def test_the_time_budget_takes_back_what_no_worker_took(storage):
    """No worker ever comes: at the deadline the queued trial is taken back (a resumed run
    queues it again) and every trial not measured counts as skipped for the budget."""
    optuna.create_study(study_name="run", storage=storage)
    pool = Dispatcher(storage, poll_s=0.1)
    pool.bind("run", {"machine_id": runner_machine(), "machine": {}})
    waits: list[str] = []
    pool.on_wait = waits.append
    search = RecipeSearch(storage, "run/01-r", SPACE, TrainConfig(), runner(), Constraints(None, []), 0, pool=pool)
    ran = search.run(4, time.time() + 1.0, on_trial=None, cost_s=0.1)
    assert ran == 0 and search.skipped == 4
    trials = search.study.get_trials(deepcopy=False)
    assert trials and all(t.state == optuna.trial.TrialState.FAIL for t in trials)
    assert "cancelled" in trials[0].user_attrs["reason"]
    assert waits and "autotune worker --study run" in waits[0]
    assert search.unqueued()[0] == {"data.num_workers": 0, "data.prefetch_factor": None}, "queued again next time"
