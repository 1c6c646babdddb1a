"""Workers as real processes through the real CLI: `autotune tune --workers 2` on one
machine, and a coordinator with `autotune worker` processes on PostgreSQL (the server
`.ci/run` starts; `AUTOTUNE_TEST_POSTGRES` names it) and on a journal file, one worker
SIGKILLed mid-trial (stopped there by the `AUTOTUNE_PAUSE_AT` hook, never a race): the
study still completes with every trial measured once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import optuna
import pytest

from autotune.storage import open_storage

from test_faults_cli import RECIPES, tagged_processes, wait_paused

pytestmark = pytest.mark.slow

FAST = ["--windows", "2", "--steps", "4", "--warmup", "1", "--trials", "3", "--recipes", str(RECIPES), "--only", "always"]
PG = os.environ.get("AUTOTUNE_TEST_POSTGRES")
HEARTBEAT = "1,5"


def _env(tag: str, url: str | None = None, **extra: str) -> dict[str, str]:
    env = {**os.environ, "AUTOTUNE_TEST_TAG": tag, "AUTOTUNE_HEARTBEAT": HEARTBEAT, **extra}
    if url:
        env["AUTOTUNE_STORAGE"] = url  # kept out of argv, as a user would
    return env


def _finish(proc: subprocess.Popen, timeout: float = 400) -> tuple[int, str, str]:
    """Its exit code and output; past `timeout` it is killed, and a descendant that still
    holds its pipes cannot keep the test waiting (its output is then cut short)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # its threads' stacks on stderr: where it was stuck
        time.sleep(2)
        proc.kill()
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.wait()
            out, err = b"", b"(its output could not be read: a descendant still held its pipes)"
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def _wait_paused(worker: subprocess.Popen, coord: subprocess.Popen, marker, timeout: float = 600) -> None:
    """Until the worker stops at its pause point; if it or the coordinator ends first, both outputs."""
    deadline = time.time() + timeout
    while not marker.exists():
        if worker.poll() is not None or coord.poll() is not None or time.time() > deadline:
            for p in (worker, coord):
                if p.poll() is None:
                    p.kill()
            outs = [_finish(p, 30) for p in (worker, coord)]
            pytest.fail("no worker reached its pause point:\nworker: " + outs[0][1][-1500:] + outs[0][2][-1500:]
                        + "\ncoordinator: " + outs[1][1][-2500:] + outs[1][2][-2500:])
        time.sleep(0.2)


def _no_leftovers(tag: str) -> None:
    deadline = time.time() + 20
    while tagged_processes(tag) and time.time() < deadline:
        time.sleep(0.2)
    assert tagged_processes(tag) == [], "a process of the run outlived it"


def test_tune_with_two_local_workers_measures_on_disjoint_cores(example, tmp_path):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    tag, out = uuid.uuid4().hex, tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "tune", example("input_bound"), "--out", str(out),
                             "--workers", "2", *FAST], env=_env(tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    code, stdout, stderr = _finish(proc)
    assert code == 0, stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is True
    trials = [t for st in report["steps"] for t in st["trials"]]
    workers = {(t["worker"]["pid"], tuple(t["worker"]["cores"])) for t in trials}
    assert len({pid for pid, _ in workers}) == 2, f"both workers measured: {workers}"
    core_sets = [set(c) for _, c in workers]
    assert all(len(c) == 1 for c in core_sets) and core_sets[0].isdisjoint(core_sets[1])
    assert len({t["worker"]["machine"] for t in trials}) == 1
    assert (out / "tuned.yaml").is_file() and (out / "worker-0.log").is_file()
    _no_leftovers(tag)


@pytest.mark.parametrize("kind", ["journal", "postgresql"])
def test_a_worker_killed_mid_trial_loses_nothing(example, tmp_path, kind):
    if kind == "postgresql" and not PG:
        pytest.skip("AUTOTUNE_TEST_POSTGRES is unset (.ci/run starts a PostgreSQL server and sets it)")
    url = PG if kind == "postgresql" else f"journal:///{tmp_path}/journal.log"
    study, tag = f"killed-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    marker = tmp_path / "paused"
    coord = subprocess.Popen([sys.executable, "-m", "autotune", "tune", example("input_bound"), "--out",
                              str(tmp_path / "run"), "--study", study, "--workers", "0", *FAST],
                             env=_env(tag, url), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    worker = [sys.executable, "-m", "autotune", "worker", "--study", study, "--idle-timeout", "0"]
    # The first worker takes the first trial and stops inside it; only then does the second start.
    a = subprocess.Popen(worker, env=_env(tag, url, AUTOTUNE_PAUSE_AT="trial", AUTOTUNE_PAUSE_FILE=str(marker)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    _wait_paused(a, coord, marker)
    b = subprocess.Popen(worker, env=_env(tag, url), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.killpg(a.pid, signal.SIGKILL)
    a.wait()
    code, _, stderr = _finish(coord)
    assert code == 0, stderr[-3000:]
    b_code, b_out, b_err = _finish(b, timeout=60)
    assert b_code == 0, b_err[-2000:]  # it left because the run was done
    assert "the run is done" in b_out

    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["complete"] is True
    storage = open_storage(url)
    rounds = [s.study_name for s in optuna.study.get_all_study_summaries(storage) if s.study_name.startswith(study + "/")]
    assert rounds
    first = optuna.load_study(study_name=sorted(rounds)[0], storage=storage)
    trials = first.get_trials(deepcopy=False)
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 1, "the killed worker's trial is failed once"
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and "reused_from" not in t.user_attrs]
    configs = [json.dumps(t.user_attrs["config"], sort_keys=True) for t in done]
    # the recipe's two worker counts (the run's config is not measured again: its readings are pooled)
    assert len(configs) == len(set(configs)) == 2, "every planned trial measured exactly once"
    retried = [t for t in trials if t.system_attrs.get("failed_trial") == failed[0].number]
    assert len(retried) == 1 and retried[0].state == optuna.trial.TrialState.COMPLETE
    assert retried[0].user_attrs["worker"]["pid"] == b.pid
    _no_leftovers(tag)


def test_a_worker_on_another_kind_of_machine_is_refused(tmp_path):
    url = f"journal:///{tmp_path}/journal.log"
    storage = open_storage(url)
    ledger = optuna.create_study(study_name="other", storage=storage)
    ledger.set_user_attr("run", {"target": "x.py", "device": "cpu", "protocol": {}, "timeout_s": 60, "seed": 0,
                                 "machine": {"device": "cpu", "cpu": "Some Other CPU", "cores": 64, "gpu": None,
                                             "gpus": 0, "torch": "2.13.0", "cuda": None},
                                 "machine_id": "0000000000"})
    r = subprocess.run([sys.executable, "-m", "autotune", "worker", "--study", "other", "--idle-timeout", "10s"],
                       env={**os.environ, "AUTOTUNE_STORAGE": url}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Some Other CPU" in r.stderr and "differs from the coordinator" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_coordinator_killed_mid_trial_resumes_and_leaves_no_worker(example, tmp_path):
    """SIGKILL of `autotune tune --workers 2` while a worker measures: its workers and their
    trial processes die with it (PR_SET_PDEATHSIG); the same command then completes, the cut
    trial failed once by the heartbeat and measured again."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    tag, out, marker = uuid.uuid4().hex, tmp_path / "run", tmp_path / "paused"
    cmd = [sys.executable, "-m", "autotune", "tune", example("input_bound"), "--out", str(out), "--workers", "2", *FAST]
    first = subprocess.Popen(cmd, env=_env(tag, AUTOTUNE_PAUSE_AT="trial", AUTOTUNE_PAUSE_FILE=str(marker)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_paused(first, marker, timeout=300)
    first.kill()
    first.wait()
    _no_leftovers(tag)
    code, _, stderr = _finish(subprocess.Popen(cmd, env=_env(tag), stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    assert code == 0, stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is True
    storage = open_storage(f"sqlite:///{out / 'study.db'}")
    name = report["study"]["name"]
    rounds = sorted(s.study_name for s in optuna.study.get_all_study_summaries(storage)
                    if s.study_name.startswith(name + "/"))
    trials = optuna.load_study(study_name=rounds[0], storage=storage).get_trials(deepcopy=False)
    assert sum(t.state == optuna.trial.TrialState.FAIL for t in trials) >= 1, "the cut trials were failed"
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and "reused_from" not in t.user_attrs]
    configs = [json.dumps(t.user_attrs["config"], sort_keys=True) for t in done]
    # the recipe's two worker counts (the run's config is not measured again: its readings are pooled)
    assert len(configs) == len(set(configs)) == 2, "every planned trial measured exactly once"
    _no_leftovers(tag)
