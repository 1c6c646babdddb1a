"""`autotune worker`: measure the trials a coordinating `autotune tune` enqueues.

A worker opens the run's study in the shared storage, reads what the coordinator
published (`run`: target, device, protocol, trial timeout, machine fingerprint), refuses
to measure when its own machine's fingerprint differs (its figures would not compare),
and then, while the run lasts: takes a WAITING trial of the search in progress (`active`)
by moving it to RUNNING (the storage lets one process win), measures it under the run's
protocol in a trial process of its own, and tells the result. While it measures, the trial
beats (`heartbeat.Beat`); a worker stopped by a signal gives its trial back at once. It
exits when the coordinator marks the run done, or after `idle_timeout_s` with nothing to do.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any, Callable, Iterator

import optuna

from . import machine
from .errors import UserError
from .heartbeat import Beat, give_back, interval_and_grace, trial_id
from .pool import WORKER_PREFIX
from .search import RecipeSearch, quiet_optuna

__all__ = ["claim", "serve"]

_WAITING, _RUNNING = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING


@contextlib.contextmanager
def _sqlite_lock(storage: Any) -> Iterator[None]:
    """SQLite has no row locks (Optuna's `SELECT ... FOR UPDATE` is a no-op there), so two
    processes could both move one trial from WAITING to RUNNING: on SQLite a claim holds
    a file lock beside the database (SQLite is one machine's anyway)."""
    url = str(getattr(storage, "url", ""))
    if not url.startswith("sqlite:///"):
        yield
        return
    import fcntl

    with open(url[len("sqlite:///"):] + ".claim", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def claim(storage: Any, study: optuna.Study) -> int | None:
    """Take one waiting trial of `study` for this process: its trial id, or None."""
    with _sqlite_lock(storage):
        return _claim(storage, study)


def _claim(storage: Any, study: optuna.Study) -> int | None:
    for t in study.get_trials(deepcopy=False, states=(_WAITING,)):
        tid = trial_id(storage, study, t.number)
        try:
            if storage.set_trial_state_values(tid, _RUNNING):
                return tid
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


def _ledger(storage: Any, name: str, wait_s: float, log: Callable[[str], None]) -> optuna.Study:
    """The run's study once its coordinator has published the run (waiting for it)."""
    start, said = time.time(), False
    while True:
        try:
            study = optuna.load_study(study_name=name, storage=storage)
            if study.user_attrs.get("run"):
                return study
        except KeyError:  # no such study yet
            pass
        if wait_s and time.time() - start > wait_s:
            raise UserError(f"--study {name!r}: no autotune run published it in this storage within {wait_s:.0f} s; "
                            "start `autotune tune ... --workers N` with the same --storage and --study, "
                            "or check the study name it printed.")
        if not said:
            log(f"waiting for a run to publish study {name!r}")
            said = True
        time.sleep(1.0)


def _check_machine(run: dict[str, Any], mine: dict[str, Any]) -> None:
    theirs = run.get("machine") or {}
    diff = [f"{k}: {mine.get(k)!r} here, {theirs.get(k)!r} on the coordinator" for k in sorted(set(mine) | set(theirs))
            if mine.get(k) != theirs.get(k)]
    if diff:
        raise UserError("this worker's machine differs from the coordinator's (" + "; ".join(diff) + "): its "
                        "measurements would not compare with the run's. Start workers on machines like the "
                        "coordinator's (same CPU model, core count per worker, GPU, torch), with --cores "
                        "giving each as many cores as the coordinator's workers have.")


class _Presence:
    """This worker's entry in the run's study, refreshed every heartbeat interval."""

    def __init__(self, ledger: optuna.Study, me: Any) -> None:
        self.ledger, self.key = ledger, f"{WORKER_PREFIX}{me.host}:{me.pid}"
        self.entry = me.model_dump(mode="json")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="autotune-presence", daemon=True)

    def _run(self) -> None:
        interval, _ = interval_and_grace()
        while not self.stop.wait(interval):
            try:
                self.ledger.set_user_attr(self.key, {**self.entry, "seen": time.time()})
            except Exception:  # noqa: BLE001 - a storage hiccup: the next beat tries again
                pass

    def __enter__(self) -> _Presence:
        self.ledger.set_user_attr(self.key, {**self.entry, "seen": time.time()})
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        try:
            self.ledger.set_user_attr(self.key, None)
        except Exception:  # noqa: BLE001 - leaving: the entry simply goes stale
            pass


def _measure(storage: Any, search: RecipeSearch, tid: int, log: Callable[[str], None]) -> None:
    study = search.study
    trial = optuna.Trial(study, tid)
    value, state = None, optuna.trial.TrialState.COMPLETE
    try:  # given up as lost before its first beat (a loaded host) or while measured: dropped, not a crash
        with Beat(storage, tid):
            try:
                value = search.objective(trial)
            except optuna.TrialPruned:
                state = optuna.trial.TrialState.PRUNED
            except optuna.exceptions.UpdateFinishedTrialError:
                raise
            except BaseException:
                give_back(storage, study, trial.number)  # queued again now, not after the grace period
                raise
    except optuna.exceptions.UpdateFinishedTrialError:
        log(f"trial {trial.number} of {study.study_name} was given up as lost while this worker measured it "
            "(its heartbeat was late); another worker measures it again")
        return
    frozen = study.tell(trial, value if state == optuna.trial.TrialState.COMPLETE else None, state=state,
                        skip_if_finished=True)
    if frozen.state != state:
        log(f"trial {trial.number} of {study.study_name} was given up as lost before it finished; "
            "its result is dropped (another worker measures it again)")
    else:
        log(f"trial {trial.number} of {study.study_name}: {frozen.user_attrs.get('state')} "
            + (f"{value:.1f} samples/s" if value is not None else str(frozen.user_attrs.get("reason"))))


def serve(storage: Any, study_name: str, device_flag: str | None, idle_timeout_s: float,
          log: Callable[[str], None]) -> int:
    """Measure the run's trials until it is done; how many this worker measured."""
    from .loop import resolve_device
    from .measure import Protocol
    from .runner import Runner
    from .workload import load_workload

    with quiet_optuna():
        ledger = _ledger(storage, study_name, idle_timeout_s, log)
        run = ledger.user_attrs["run"]
        device = resolve_device(device_flag or run["device"])
        _check_machine(run, machine.fingerprint(device))
        runner = Runner(load_workload(run["target"]), run["target"], device, Protocol(**run["protocol"]),
                        isolate=True, timeout_s=run["timeout_s"])
        me = machine.worker_ref(device)
        log(f"worker {me.host}:{me.pid} on cores {','.join(map(str, me.cores))} for study {study_name!r}")
        searches: dict[str, RecipeSearch] = {}
        measured, idle_since = 0, time.time()
        with _Presence(ledger, me):
            while True:
                attrs = ledger.user_attrs
                if attrs.get("done"):
                    log("the run is done")
                    return measured
                active, tid = attrs.get("active"), None
                if active:
                    if active not in searches:
                        sampler = optuna.samplers.TPESampler(seed=(int(run["seed"]) * 1_000_003 + os.getpid()) % 2**32,
                                                             n_startup_trials=4, constant_liar=True)
                        searches[active] = RecipeSearch.attach(storage, active, runner, sampler)
                    tid = claim(storage, searches[active].study)
                if tid is None:
                    if idle_timeout_s and time.time() - idle_since > idle_timeout_s:
                        log(f"nothing to measure for {idle_timeout_s:.0f} s: leaving")
                        return measured
                    time.sleep(0.3)
                    continue
                _measure(storage, searches[active], tid, log)
                measured, idle_since = measured + 1, time.time()
