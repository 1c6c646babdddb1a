"""Fault injection through the real CLI: a run stopped at a known point (the
`AUTOTUNE_PAUSE_AT` hook, never a race) by SIGKILL, SIGTERM or SIGHUP loses nothing it
finished, leaves no worker behind, and the same command then completes; two runs never
share an output folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# A recipe every verdict makes worth a search: the pause points are reached however the
# machine's load shifts the diagnosis (a loaded machine can turn input-bound into compute).
RECIPES = Path(__file__).resolve().parent / "data" / "recipes"
FAST = ["--windows", "2", "--steps", "4", "--warmup", "1", "--trials", "3", "--recipes", str(RECIPES), "--only", "always"]


def start(example, out: Path, pause_at: str | None, *extra: str) -> tuple[subprocess.Popen, Path, str]:
    tag = uuid.uuid4().hex
    marker = out.parent / f"paused-{tag}"
    env = {**os.environ, "AUTOTUNE_TEST_TAG": tag}
    if pause_at:
        env.update(AUTOTUNE_PAUSE_AT=pause_at, AUTOTUNE_PAUSE_FILE=str(marker))
    # SIGINT back to its default in the child: a shell that started the tests in the background
    # leaves it ignored, and Python then never turns it into KeyboardInterrupt.
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "tune", example("input_bound"), "--out", str(out),
                             *FAST, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    return proc, marker, tag


def wait_paused(proc: subprocess.Popen, marker: Path, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            try:
                err = proc.communicate(timeout=30)[1].decode(errors="replace")
            except subprocess.TimeoutExpired:  # a descendant still holds the pipe
                err = "(its output could not be read)"
            pytest.fail("the run ended before its pause point: " + err[-2000:])
        assert time.time() < deadline, "the run never reached its pause point"
        time.sleep(0.2)


def tagged_processes(tag: str) -> list[int]:
    """Live processes started with this test's tag in their environment (workers inherit it)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if f"AUTOTUNE_TEST_TAG={tag}".encode() in (d / "environ").read_bytes():
                state = (d / "stat").read_text().split()[2]
                if state != "Z":
                    pids.append(int(d.name))
        except OSError:
            continue
    return pids


def assert_no_process_left(tag: str) -> None:
    deadline = time.time() + 15
    while tagged_processes(tag) and time.time() < deadline:
        time.sleep(0.2)
    assert tagged_processes(tag) == [], "a worker outlived its run"


def finish(example, out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "autotune", "tune", example("input_bound"), "--out", str(out), *FAST,
                           "--in-process"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "report.json").read_text())


# Windows: 2 for the baseline, 4 for the A/A (2 pairs), then the first search trial's.
IN_A_TRIAL_WORKER = "window@8"


@pytest.mark.parametrize("point", ["baseline", "compare", IN_A_TRIAL_WORKER, "trial", "report"])
def test_sigkill_at_a_point_then_rerun_loses_nothing(example, tmp_path, point):
    out = tmp_path / "run"
    isolated = point == IN_A_TRIAL_WORKER  # paused inside a worker: it must die with the run
    proc, marker, tag = start(example, out, point, *([] if isolated else ["--in-process"]))
    wait_paused(proc, marker)
    before = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    proc.kill()
    proc.wait()
    assert_no_process_left(tag)
    report = finish(example, out)
    assert report["complete"] and report["stop_reason"]
    if point != "baseline":  # the baseline was measured and stored before the kill: reused as it was
        import optuna

        stored = optuna.load_study(study_name=report["study"]["name"], storage=f"sqlite:///{out / 'study.db'}")
        assert report["baseline"]["samples_per_s"] == stored.user_attrs["baseline"]["samples_per_s"]
    if before is not None:
        assert report["baseline"] == before["baseline"]


@pytest.mark.parametrize("signum,code,words", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                               (signal.SIGTERM, 143, "SIGTERM"), (signal.SIGHUP, 129, "SIGHUP")])
def test_ctrl_c_sigterm_and_sighup_write_a_partial_report_and_leave_no_worker(example, tmp_path, signum, code, words):
    """Paused inside a search trial's worker, so the signal always lands mid-search."""
    out = tmp_path / "run"
    proc, marker, tag = start(example, out, IN_A_TRIAL_WORKER)
    wait_paused(proc, marker)
    assert int(marker.read_text()) != proc.pid, "paused inside a worker"
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err.decode()[-2000:]
    assert b"Traceback" not in err
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is False and words in report["stop_reason"]
    assert (out / "tuned.yaml").is_file()
    assert report["baseline"]["samples_per_s"] > 0
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    assert not list(out.glob(".*.tmp")), "no temporary file left behind"
    assert_no_process_left(tag)


def test_a_second_run_on_the_same_folder_is_refused(example, tmp_path):
    out = tmp_path / "run"
    first, marker, tag = start(example, out, "baseline", "--in-process")
    try:
        wait_paused(first, marker)
        second = subprocess.run([sys.executable, "-m", "autotune", "tune", example("input_bound"), "--out", str(out),
                                 *FAST], capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr
        assert f"pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
    finally:
        first.kill()
        first.wait()
    assert finish(example, out)["complete"]  # the lock died with its holder


def test_a_locked_database_is_a_clear_error(example, tmp_path):
    import sqlite3

    import optuna

    db = tmp_path / "study.db"
    url = f"sqlite:///{db}"
    optuna.storages.RDBStorage(url)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another program holds the database
    try:
        proc = subprocess.run([sys.executable, "-m", "autotune", "tune", example("compute_bound"), "--out",
                               str(tmp_path / "run"), "--storage", url, "--in-process", *FAST],
                              capture_output=True, text=True, timeout=300)
    finally:
        holder.close()
    assert proc.returncode == 2 and "database is locked" in proc.stderr and "Traceback" not in proc.stderr


def test_a_read_only_database_is_a_clear_error(example, tmp_path):
    import optuna

    db = tmp_path / "study.db"
    optuna.storages.RDBStorage(f"sqlite:///{db}")
    url = f"sqlite:///file:{db}?mode=ro&uri=true"  # opened read-only (as root, file modes would not stop writes)
    proc = subprocess.run([sys.executable, "-m", "autotune", "tune", example("compute_bound"), "--out",
                           str(tmp_path / "run"), "--storage", url, "--in-process", *FAST],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "readonly database" in proc.stderr and "Traceback" not in proc.stderr
