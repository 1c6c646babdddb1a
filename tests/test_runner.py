"""Trial isolation: a workload that raises, exits, segfaults, hangs or is killed fails only
its trial, with the right `FailureKind` and reason, and leaves no process behind; a good
one measures through a worker process exactly as in-process. Plus `FakeRunner`'s model of
drift, which is what makes interleaving worth it.

Every workload here is a small nn.Linear on a tiny random dataset, so each worker test
costs about one Python + torch start-up. Timeouts are bounds on a hang, never assertions
on speed.
"""

from __future__ import annotations

import math
import os
import signal
import textwrap
from pathlib import Path

import pytest
import torch

import autotune
from autotune.config import TrainConfig
from autotune.errors import TrialFailed
from autotune.record import FailureKind, Summary
from autotune.runner import Runner
from autotune.stats import paired_ratio
from autotune.testing import FakeRunner
from autotune.workload import load_workload

CPU = torch.device("cpu")
PROTOCOL = autotune.Protocol(windows=2, steps=2, warmup_steps=1, profile_steps=1)
# A generous bound on a worker that should answer (start-up on a loaded 2-core machine is slow).
BOUND_S = 120.0

WORKLOAD = '''
import os
import signal
import time

import torch
from torch import nn

import autotune

PIDFILE = {pidfile!r}


class Data(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(32, 4, generator=g)
        self.y = torch.randn(32, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def loss(model, batch):
    with open(PIDFILE, "w") as f:
        f.write(str(os.getpid()))
    x, y = batch
{body}
    return nn.functional.mse_loss(model(x), y)


def workload():
    return autotune.Workload(name="tiny", model=lambda: nn.Linear(4, 1), dataset=Data(),
                             optimizer=lambda p: torch.optim.SGD(p, lr=0.1), loss=loss, batch_size=8)
'''


@pytest.fixture
def make(tmp_path):
    """`make(body)`: a workload file whose loss runs `body` first; returns (target, pidfile)."""
    count = iter(range(100))

    def _make(body: str = "") -> tuple[str, Path]:
        i = next(count)
        pidfile = tmp_path / f"pid{i}"
        path = tmp_path / f"tiny_{i}.py"
        path.write_text(WORKLOAD.format(pidfile=str(pidfile), body=textwrap.indent(body or "pass", "    ")))
        return str(path), pidfile

    return _make


def runner(target: str, timeout_s: float = BOUND_S, isolate: bool = True) -> Runner:
    return Runner(load_workload(target), target, CPU, PROTOCOL, isolate=isolate, timeout_s=timeout_s)


def failure(target: str, timeout_s: float = BOUND_S) -> TrialFailed:
    with pytest.raises(TrialFailed) as info:
        runner(target, timeout_s).measure(TrainConfig())
    return info.value


def assert_gone(pidfile: Path) -> None:
    """The worker that wrote `pidfile` no longer exists (killed and reaped)."""
    pid = int(pidfile.read_text())
    assert pid != os.getpid()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# --- failures, each in its own worker --------------------------------------------------------


def test_exception_in_the_loss_is_user_code_with_its_message(make):
    target, pidfile = make("raise ValueError('the loss is broken: 42')")
    exc = failure(target)
    assert exc.kind is FailureKind.USER_CODE
    assert exc.reason == "ValueError: the loss is broken: 42"
    assert "the loss is broken: 42" in str(exc)
    assert "tiny_0.py" in exc.detail  # the user's own frame, for their traceback
    assert "Traceback (your code" in exc.detail
    assert_gone(pidfile)


def test_exit_is_a_crash_naming_the_exit_code(make):
    target, pidfile = make("os._exit(3)")
    exc = failure(target)
    assert exc.kind is FailureKind.CRASH
    assert "exited with code 3" in exc.reason
    assert_gone(pidfile)


def test_segfault_is_a_crash_naming_sigsegv(make):
    target, pidfile = make("import ctypes\nctypes.string_at(0)")
    exc = failure(target)
    assert exc.kind is FailureKind.CRASH
    assert "SIGSEGV" in exc.reason
    assert_gone(pidfile)


def test_hang_is_a_timeout_and_the_process_is_killed(make):
    target, pidfile = make("time.sleep(60)")
    # 3 s bounds the hang; start-up (the `open`) gets timeout_s + 60, so a slow import is not a hang
    exc = failure(target, timeout_s=20.0)  # the whole trial, start-up included, must end within it
    assert exc.kind is FailureKind.TIMEOUT
    assert "did not finish within 20 s" in exc.reason and "killed" in exc.reason
    assert_gone(pidfile)


def test_sigkill_without_oom_evidence_is_reported_as_killed(make):
    """A SIGKILL is taken for the OOM killer only when the cgroup counted an oom_kill."""
    target, pidfile = make("os.kill(os.getpid(), signal.SIGKILL)")
    exc = failure(target)
    assert exc.kind is FailureKind.KILLED
    assert "SIGKILL" in exc.reason and "OOM killer" in exc.reason
    assert_gone(pidfile)


def test_a_workload_that_prints_to_stdout_does_not_break_the_reply_pipe(tmp_path):
    """Noise on stdout at import and inside the step (Python prints and raw fd 1 writes)."""
    from workloads import write_target

    path = write_target(tmp_path, "noisy.py", """
import os
print("hello from import", flush=True)
os.write(1, b'{"ok": false}\\n garbage\\n')

def loud_loss(model, batch):
    print("step", flush=True)
    os.write(1, b"\\x00\\xff not json\\n")
    return ce_loss(model, batch)

def workload():
    return make(loss=loud_loss)
""")
    s = runner(str(path)).measure(TrainConfig())
    assert s.measured_steps == PROTOCOL.windows * PROTOCOL.steps


def test_a_worker_that_exits_during_start_up_is_a_crash(make, tmp_path):
    good, _ = make()
    path = tmp_path / "exits.py"
    path.write_text("import os\nos._exit(7)\n")  # imported only by the worker
    with pytest.raises(TrialFailed) as info:
        Runner(load_workload(good), str(path), CPU, PROTOCOL, isolate=True, timeout_s=BOUND_S).measure(TrainConfig())
    assert info.value.kind is FailureKind.CRASH and "exited with code 7" in info.value.reason


def test_failure_when_opening_is_reported_and_leaves_no_worker(make, tmp_path):
    good, _ = make()
    pidfile = tmp_path / "pid_open"
    bad = tmp_path / "bad_model.py"
    bad.write_text(Path(good).read_text().replace(
        "model=lambda: nn.Linear(4, 1)",
        f"model=lambda: open({str(pidfile)!r}, 'w').write(str(os.getpid())) and 1 / 0"))
    r = Runner(load_workload(good), str(bad), CPU, PROTOCOL, isolate=True, timeout_s=BOUND_S)
    with pytest.raises(TrialFailed) as info:
        r.measure(TrainConfig())
    assert info.value.kind is FailureKind.USER_CODE
    assert "ZeroDivisionError" in info.value.reason
    pid = int(pidfile.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return  # the worker is gone, as it should be
    os.kill(pid, signal.SIGKILL)
    pytest.fail("a worker whose `open` failed was left running")


def test_isolation_needs_a_target():
    wl = FakeRunner(lambda c: 1.0).workload
    with pytest.raises(ValueError, match="target"):
        Runner(wl, None, CPU, PROTOCOL, isolate=True)


# --- a good workload ---------------------------------------------------------------------------


def test_isolated_measure_returns_a_valid_summary(make):
    target, pidfile = make()
    config = TrainConfig().with_changes({"backend.num_threads": 1})
    s = runner(target).measure(config)
    assert isinstance(s, Summary)
    assert s.config == config.flat()
    warmup, steps = PROTOCOL.plan(0)
    assert (warmup, steps) == (1, 2)
    assert s.measured_steps == PROTOCOL.windows * steps == 4
    assert len(s.windows_samples_per_s) == PROTOCOL.windows
    assert all(w > 0 for w in s.windows_samples_per_s)
    assert s.samples_per_s > 0
    assert s.wall_s is not None and s.wall_s > 0
    assert s.signals.profiled_steps == PROTOCOL.profile_steps
    assert s.peak_memory_bytes and s.peak_memory_bytes > 0
    assert sum(st.share for st in s.stages.values()) == pytest.approx(1.0, abs=1e-6)
    assert s.first_losses and all(math.isfinite(x) for x in s.first_losses)
    assert Summary.model_validate_json(s.model_dump_json()) == s
    assert_gone(pidfile)  # the worker exited after the summary

    # the same protocol in this process: same config, same steps, same seeded losses
    local = runner(target, isolate=False).measure(config)
    assert local.config == s.config
    assert local.measured_steps == s.measured_steps
    assert local.first_losses == pytest.approx(s.first_losses, rel=1e-5)


def test_interleave_returns_pairs_windows_per_side(make):
    target, _ = make()
    a = TrainConfig()
    b = TrainConfig().with_changes({"backend.num_threads": 1})
    calls = []
    xs, ys = runner(target).interleave(a, b, pairs=3, on_pair=lambda i, x, y: calls.append((i, x, y)))
    assert len(xs) == len(ys) == 3
    assert all(v > 0 for v in xs + ys)
    assert [c[0] for c in calls] == [0, 1, 2]
    assert [(c[1], c[2]) for c in calls] == list(zip(xs, ys))


# --- FakeRunner -----------------------------------------------------------------------------


def test_drift_fools_sequential_measurement_but_not_interleaving():
    a = TrainConfig()
    b = TrainConfig().with_changes({"backend.num_threads": 1})
    r = FakeRunner(lambda c: 100.0, noise=0.0, drift=0.02, protocol=autotune.Protocol(windows=4))
    sa, sb = r.measure(a), r.measure(b)
    seq = paired_ratio(sa.windows_samples_per_s, sb.windows_samples_per_s)
    # B's windows all came 4 windows later: 1.02 ** 4 faster, though the configs are equal
    assert seq["ratio"] == pytest.approx(1.02**4, rel=1e-9)
    assert sb.samples_per_s / sa.samples_per_s == pytest.approx(1.02**4, rel=1e-9)
    assert seq["low"] > 1.05  # a sequential comparison would "find" an 8% speedup

    xs, ys = r.interleave(a, b, pairs=4)
    inter = paired_ratio(xs, ys)
    assert inter["pairs"] == 4
    assert inter["ratio"] == pytest.approx(1.0, abs=1e-9)  # A B B A A B B A: drift cancels
    assert inter["low"] <= 1.0 <= inter["high"]

    xs, ys = r.interleave(a, b, pairs=5)  # odd: one unmatched turn, still near 1
    assert abs(math.log(paired_ratio(xs, ys)["ratio"])) < math.log(1.02) / 5 + 1e-9


def test_fake_runner_counts_its_calls():
    a = TrainConfig()
    b = TrainConfig().with_changes({"data.num_workers": 2})
    r = FakeRunner(lambda c: 100.0, noise=0.0)
    assert r.measured == [] and r.interleaved == []
    r.measure(a)
    r.interleave(a, b, pairs=2)
    r.interleave(b, a, pairs=3)
    assert r.measured == [a.flat()]
    assert r.interleaved == [(a.flat(), b.flat()), (b.flat(), a.flat())]
    assert r.windows_taken == r.protocol.windows + 2 * 2 + 2 * 3


def test_fake_runner_without_noise_or_drift_measures_the_true_speed():
    r = FakeRunner(lambda c: 250.0 if c.data.num_workers else 100.0, noise=0.0, batch_size=10)
    s = r.measure(TrainConfig().with_changes({"data.num_workers": 2}))
    assert s.windows_samples_per_s == [250.0] * r.protocol.windows
    assert s.samples_per_s == 250.0
    assert s.step_time_s.mean == pytest.approx(10 / 250.0)


def test_fake_runner_failures_propagate_as_trial_failed():
    def speed(c):
        raise TrialFailed(FailureKind.CRASH, "boom")

    with pytest.raises(TrialFailed) as info:
        FakeRunner(speed).measure(TrainConfig())
    assert info.value.kind is FailureKind.CRASH and info.value.reason == "boom"


def test_in_process_compiled_trial_compiles_past_dynamo_recompile_cap(monkeypatch):
    """Compiled modules share one frame whose cache dynamo caps at 8 entries per process;
    past it every new compiled model silently runs eager. Eight distinct models fill it
    here; the ninth, an in-process compiled trial, must still compile its step."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from workloads import make

    torch._dynamo.reset()
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)
    monkeypatch.setattr(torch._dynamo.config, "accumulated_recompile_limit", 256)
    x = torch.randn(4, 8)
    for depth in range(1, 9):
        torch.compile(torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(depth)]), backend="eager")(x)
    before = counters["stats"]["unique_graphs"]
    config = TrainConfig.model_validate({"compile": {"mode": "default"}})
    summary = Runner(make(), None, CPU, PROTOCOL, isolate=False).measure(config)
    assert summary.samples_per_s > 0
    assert counters["stats"]["unique_graphs"] > before, "the ninth compiled model ran eager"
    torch._dynamo.reset()
