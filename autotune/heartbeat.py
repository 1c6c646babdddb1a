"""Liveness in shared storage: a worker's trial beats while it is measured, and a trial
whose beat stopped (its worker was killed, its machine lost) is failed and queued again.

On an RDB storage (SQLite, PostgreSQL, MySQL) this is Optuna's own heartbeat: the storage
is opened with `heartbeat_interval`/`grace_period`, a worker calls `record_heartbeat`, and
`optuna.storages.fail_stale_trials` fails stale trials and calls Optuna's
`RetryHeartbeatStaleTrialCallback` (`RetryFailedTrialCallback` before 4.9), which enqueues a copy with the same parameters. A journal
storage has no heartbeat in Optuna: the beat is a trial system attribute holding the time
and `reap` does the same two steps itself (journal files live on one machine's clock).
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any

import optuna
from optuna.storages._heartbeat import is_heartbeat_enabled

__all__ = ["Beat", "MAX_RETRY", "give_back", "interval_and_grace", "reap", "retry_callback", "trial_id"]

KEY = "autotune:heartbeat"
MAX_RETRY = 2  # a trial whose worker died this often is given up (it may be what kills them)
_RUNNING = optuna.trial.TrialState.RUNNING


def interval_and_grace() -> tuple[int, int]:
    """Seconds between beats, and the silence after which a trial counts as lost
    (`AUTOTUNE_HEARTBEAT=interval,grace` overrides the default 5,30)."""
    raw = os.environ.get("AUTOTUNE_HEARTBEAT", "")
    try:
        interval, grace = (int(x) for x in raw.split(","))
        if 1 <= interval < grace:
            return interval, grace
    except ValueError:
        pass
    return 5, 30


def retry_callback() -> Any:
    """Optuna's callback that queues a copy of a stale trial (renamed in Optuna 4.9)."""
    cls = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None) or optuna.storages.RetryFailedTrialCallback
    with warnings.catch_warnings():  # marked experimental by Optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return cls(max_retry=MAX_RETRY)


def storage_kwargs() -> dict[str, Any]:
    """`RDBStorage` arguments that turn the heartbeat on, with the retry callback."""
    interval, grace = interval_and_grace()
    name = ("heartbeat_stale_trial_callback" if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback")
            else "failed_trial_callback")
    return {"heartbeat_interval": interval, "grace_period": grace, name: retry_callback()}


def native(storage: Any) -> bool:
    return is_heartbeat_enabled(storage)


class Beat:
    """`with Beat(storage, trial_id):` beats for the trial until the block ends."""

    def __init__(self, storage: Any, trial_id: int) -> None:
        self.storage, self.trial_id = storage, trial_id
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="autotune-heartbeat", daemon=True)

    def beat(self) -> None:
        if native(self.storage):
            self.storage.record_heartbeat(self.trial_id)
        else:
            self.storage.set_trial_system_attr(self.trial_id, KEY, self._mark())

    def _mark(self) -> list[int | float]:
        return [self.trial_id, time.time()]

    def _run(self) -> None:
        interval, _ = interval_and_grace()
        while not self.stop.wait(interval):
            try:
                self.beat()
            except Exception:  # noqa: BLE001 - a finished trial, a storage hiccup: the next beat or the reaper decides
                pass

    def __enter__(self) -> Beat:
        if native(self.storage):  # the first beat also as our own mark: `reap` tells a trial never beaten
            self.storage.set_trial_system_attr(self.trial_id, KEY, self._mark())
        self.beat()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def trial_id(storage: Any, study: optuna.Study, number: int) -> int:
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


def reap(storage: Any, study: optuna.Study) -> int:
    """Fail the study's running trials whose beat stopped, queue each again; how many."""
    before = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,)))
    by_optuna = native(storage)
    if by_optuna:
        with warnings.catch_warnings():  # marked experimental by Optuna
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
    # Optuna's heartbeat only knows trials that beat once: a worker killed between its claim
    # and its first beat left a trial a resumed run waited on forever. A trial never marked
    # (every trial, without Optuna's heartbeat) is judged by its mark or its claim's time.
    _, grace = interval_and_grace()
    now = time.time()
    for t in study.get_trials(deepcopy=False, states=(_RUNNING,)):
        mark = _own_mark(t)
        if by_optuna and mark:
            continue  # it beat: Optuna's heartbeat judges it
        last = mark or (t.datetime_start.timestamp() if t.datetime_start else now)
        if now - float(last) > grace:
            _fail_and_retry(storage, study, trial_id(storage, study, t.number))
    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))) - before


def _own_mark(t: optuna.trial.FrozenTrial) -> float | None:
    """The time of the trial's last beat, if the beat was its own. Optuna's retry callback
    copies a failed trial's system attributes onto the copy it queues, beat included: read
    as the copy's, that stale beat failed the copy between its claim and its first beat, and
    the point was lost twice (CI). A mark names the trial it was written for."""
    mark = t.system_attrs.get(KEY)
    if isinstance(mark, list):
        return float(mark[1]) if mark[0] == t._trial_id else None
    return None if mark is None else float(mark)  # a bare time: written before marks named their trial


def _fail_and_retry(storage: Any, study: optuna.Study, tid: int) -> None:
    try:
        changed = storage.set_trial_state_values(tid, optuna.trial.TrialState.FAIL)
    except optuna.exceptions.UpdateFinishedTrialError:  # it finished meanwhile
        return
    if changed:
        retry_callback()(study, storage.get_trial(tid))


def give_back(storage: Any, study: optuna.Study, number: int) -> None:
    """A trial its worker stops measuring (Ctrl-C, SIGTERM): failed and queued again now,
    rather than after the grace period."""
    _fail_and_retry(storage, study, trial_id(storage, study, number))
