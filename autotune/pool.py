"""The coordinator's side of parallel trials: hand a search's trials to `autotune worker`
processes through the study storage, and start local ones.

Optuna's storage is the only channel. The coordinator publishes what a worker needs to
measure (`run`: target, device, protocol, trial timeout, the machine fingerprint) and the
search in progress (`active`) as user attributes of the run's study; it enqueues trials
(Optuna's WAITING queue) no faster than the live workers take them, so trials of one
recipe run in parallel and the search's sampler still sees each finished one; workers
claim, measure, and tell. A trial whose worker stops beating is failed and queued again
(`heartbeat.reap`). Interleaved acceptance comparisons stay with the coordinator: both
configs measured by one process, on one machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import optuna

from .errors import UserError
from .heartbeat import MAX_RETRY, interval_and_grace, reap

__all__ = ["Dispatcher", "LocalWorkers", "from_flags", "pin", "split_cores"]

WORKER_PREFIX = "worker:"  # study user attribute per worker: who it is and when it was last seen
_WAITING, _RUNNING = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING
_FAIL = optuna.trial.TrialState.FAIL
_DONE = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def split_cores(cores: list[int], n: int) -> list[list[int]]:
    """`n` disjoint, equal sets of `cores` (a remainder is left unused, so every worker's
    measurements carry the same core count and compare)."""
    if n < 1 or n > len(cores):
        raise UserError(f"--workers {n}: this process may use {len(cores)} core(s) ({_ranges(cores)}), and each worker "
                        f"needs a core of its own; give --workers 1 to {len(cores)}.")
    size = len(cores) // n
    return [cores[i * size:(i + 1) * size] for i in range(n)]


def pin(text: str) -> None:
    """--cores 0-3,8: pin this process (and the trial processes it starts) to those cores."""
    try:
        cores: set[int] = set()
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            cores.update(range(int(lo), int(hi or lo) + 1))
        os.sched_setaffinity(0, cores)
    except (ValueError, OSError) as exc:
        raise UserError(f"--cores {text!r} cannot be used ({exc}); give core numbers this machine has, like 0-3 or "
                        "0,2, among those this process may use.") from None


def from_flags(workers: int | None, storage: Any, url: str, device: Any, out: Path) -> Dispatcher | None:
    """`autotune tune --workers N`: a dispatcher, and N local workers on disjoint cores.

    This process keeps the first worker's cores for its own measurements (baseline, A/A,
    comparisons; the workers are idle then), so every measurement of the run has the same
    core count and compares."""
    from . import machine

    if workers is None:
        return None
    local = None
    if workers:
        cores = machine.core_set()
        local = LocalWorkers(workers, url, "", device.type, cores, out)
        if device.type == "cpu" and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, local.sets[0])
    return Dispatcher(storage, local)


def _ranges(cores: list[int]) -> str:
    return ",".join(map(str, cores))


class LocalWorkers:
    """`n` `autotune worker` processes on this machine, each pinned to its own cores (or,
    on CUDA, its own GPU); restarted when one dies, stopped with the run."""

    RESTARTS = 3  # per worker, before the run gives up on local workers

    def __init__(self, n: int, url: str, study: str, device: str, cores: list[int], log_dir: Path) -> None:
        self.sets = split_cores(cores, n)
        if device == "cuda":
            import torch

            if torch.cuda.device_count() < n:
                raise UserError(f"--workers {n} on CUDA needs {n} GPUs (one per worker); "
                                f"{torch.cuda.device_count()} are visible.")
        self.url, self.study, self.device, self.log_dir = url, study, device, log_dir
        self.procs: list[subprocess.Popen | None] = [None] * n
        self.restarts = [0] * n

    def _spawn(self, i: int) -> subprocess.Popen:
        env = {**os.environ, "AUTOTUNE_STORAGE": self.url, "AUTOTUNE_PARENT_PID": str(os.getpid())}  # URL kept out of ps
        if self.device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = str(i)
        log = open(self.log_dir / f"worker-{i}.log", "ab")
        try:
            return subprocess.Popen(
                [sys.executable, "-m", "autotune", "worker", "--study", self.study, "--device", self.device,
                 "--cores", _ranges(self.sets[i]), "--idle-timeout", "0"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        finally:
            log.close()

    def start(self) -> None:
        for i in range(len(self.procs)):
            self.procs[i] = self._spawn(i)

    def check(self) -> None:
        """Restart a worker that died (its trial is queued again by the heartbeat)."""
        for i, p in enumerate(self.procs):
            if p is None or p.poll() is None:
                continue
            if self.restarts[i] >= self.RESTARTS:
                tail = (self.log_dir / f"worker-{i}.log").read_text(errors="replace")[-1500:]
                raise RuntimeError(f"local worker {i} died {self.restarts[i] + 1} times (last exit code {p.returncode}); "
                                   f"its log ends:\n{tail}")
            self.restarts[i] += 1
            self.procs[i] = self._spawn(i)

    def stop(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.terminate()
        for p in self.procs:
            if p is None:
                continue
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Dispatcher:
    """Runs `RecipeSearch`es on workers: `bind` publishes the run, `run` one search."""

    def __init__(self, storage: Any, local: LocalWorkers | None = None, poll_s: float = 0.3,
                 on_wait: Callable[[str], None] | None = None) -> None:
        self.storage, self.local, self.poll_s, self.on_wait = storage, local, poll_s, on_wait
        self.ledger: optuna.Study | None = None
        self.machine: str | None = None
        self.keepalive: Callable[[], None] | None = None  # renews the run's lease while a search waits
        self._renewed = time.time()

    def bind(self, study: str, run: dict[str, Any]) -> None:
        """Publish what workers need to measure this run's trials, and start local workers."""
        self.ledger = optuna.load_study(study_name=study, storage=self.storage)
        self.machine = run["machine_id"]
        self.ledger.set_user_attr("run", run)
        self.ledger.set_user_attr("done", False)
        if self.local:
            self.local.study = study
            self.local.start()

    def close(self, done: bool) -> None:
        """Stop local workers; with `done`, tell every worker the run is over."""
        try:
            if self.ledger is not None and done:
                self.ledger.set_user_attr("active", None)
                self.ledger.set_user_attr("done", True)
        finally:
            if self.local:
                self.local.stop()

    def workers(self) -> list[dict[str, Any]]:
        """Workers seen within the grace period on a machine like the coordinator's."""
        _, grace = interval_and_grace()
        now = time.time()
        return [w for k, w in self.ledger.user_attrs.items()
                if k.startswith(WORKER_PREFIX) and isinstance(w, dict) and now - w.get("seen", 0) <= grace
                and w.get("machine") == self.machine]

    def run(self, search: Any, n_trials: int, deadline: float | None, on_trial: Callable | None,
            cost_s: float | None) -> int:
        """Enqueue `search`'s trials as workers free up until `n_trials` are finished."""
        study = search.study
        target = min(n_trials, search.grid)
        seen = {t.number for t in study.get_trials(deepcopy=False, states=_DONE)}
        ran, search.skipped, waited = 0, 0, False
        self.ledger.set_user_attr("active", study.study_name)
        while True:
            trials = study.get_trials(deepcopy=False)  # one snapshot: a trial is finished or pending, never neither
            finished = [t for t in trials if t.state in _DONE]
            pending = [t for t in trials if t.state in (_WAITING, _RUNNING)]
            for t in finished:
                if t.number not in seen:
                    seen.add(t.number)
                    ran += 1
                    if on_trial:
                        on_trial(t)
            lost = given_up(study, search)
            done = len(seen) + len(lost)
            if done >= target:
                break
            if reap(self.storage, study):
                continue  # a lost trial was queued again: count anew
            if self.local:
                self.local.check()
            if deadline is not None and time.time() + (cost_s or 0.0) >= deadline:
                search.skipped = target - done - sum(t.state == _RUNNING for t in pending)
                cancel_waiting(self.storage, study)
                break
            live = len(self.workers())  # one read of the run's study per poll
            capacity = max(1, live)
            for _ in range(min(capacity - len(pending), target - done - len(pending))):
                nxt = [p for p in search.unqueued() if p not in lost]
                study.enqueue_trial(nxt[0] if nxt else {})  # {}: the worker's sampler picks the values
            if self.keepalive and time.time() - self._renewed > 30:
                self.keepalive()
                self._renewed = time.time()
            if not live and self.on_wait and not waited:
                self.on_wait("waiting for a worker (autotune worker --study "
                             f"{self.ledger.study_name} with the same storage)")
                waited = True
            time.sleep(self.poll_s)
        return ran


def given_up(study: optuna.Study, search: Any) -> list[dict[str, Any]]:
    """Points whose worker died more than MAX_RETRY times: not queued again."""
    failed: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False, states=(_FAIL,)):
        key = repr(sorted(t.params.items()))
        failed[key] = failed.get(key, 0) + 1
    return [p for p in search.points if failed.get(repr(sorted(p.items())), 0) > MAX_RETRY]


def cancel_waiting(storage: Any, study: optuna.Study) -> None:
    """Take back the queued trials no worker claimed yet (a resumed run queues them again)."""
    from .heartbeat import trial_id

    for t in study.get_trials(deepcopy=False, states=(_WAITING,)):
        try:
            tid = trial_id(storage, study, t.number)
            storage.set_trial_user_attr(tid, "reason", "cancelled: the time budget ran out before a worker took it")
            storage.set_trial_state_values(tid, _FAIL)
        except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
            continue
