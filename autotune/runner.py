"""Run measurements in a fresh process per config (default) or in this process.

Both give a `Handle` (the declared interface below) with the same four calls, so the agent never knows which it has.
In a worker process a crash, a hang past the timeout, or an out-of-memory error fails
that trial with its reason; the parent goes on.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable
from typing import Protocol as TypingProtocol

import torch

from . import handoff, probe
from .config import TrainConfig
from .errors import TrialCut, TrialFailed, UserCodeError, UserError
from .measure import Protocol, Session
from .record import FailureKind, Summary
from .workload import Workload

__all__ = ["Handle", "InProcessHandle", "Runner", "TrialFailed", "TrialRunner", "WorkerHandle", "classify"]


class Handle(TypingProtocol):
    """One config's measurement session, open until closed: windows on demand, then a summary."""

    def window(self) -> float:
        """One protocol window; its throughput (samples/s)."""
        ...

    def profile(self, trace: str | None = None) -> None:
        """The profiled steps after the windows (signals, peak memory)."""
        ...

    def summary(self) -> Summary:
        ...

    def close(self, kill: bool = False) -> None:
        ...


class TrialRunner(TypingProtocol):
    """What the search and the agent measure with: `Runner` and `autotune.testing.FakeRunner`."""

    workload: Workload
    target: str | None
    device: torch.device
    protocol: Protocol

    def measure(self, config: TrainConfig, trace: str | None = None,
                on_window: Callable[[int, float], None] | None = None, floor: float | None = None,
                until: float | None = None) -> Summary:
        ...

    def interleave(self, a: TrainConfig, b: TrainConfig, pairs: int,
                   on_pair: Callable[[int, float, float], None] | None = None) -> tuple[list[float], list[float]]:
        ...

    def lowp_matmul(self) -> dict[str, float]:
        ...

    def batch_handoff(self) -> float | None:
        ...


def classify(exc: BaseException) -> TrialFailed:
    """The `TrialFailed` an exception raised while measuring stands for."""
    if isinstance(exc, TrialFailed):  # already classified (another DDP rank's failure)
        return exc
    inner = exc.exc if isinstance(exc, UserCodeError) else exc
    if isinstance(inner, torch.OutOfMemoryError) or "out of memory" in str(inner).lower():
        kind = FailureKind.OOM
    elif isinstance(exc, UserError):
        kind = FailureKind.USER
    elif isinstance(exc, UserCodeError):
        kind = FailureKind.USER_CODE
    else:
        kind = FailureKind.CRASH
    detail = exc.user_traceback() if isinstance(exc, UserCodeError) else traceback.format_exc(limit=-3)
    return TrialFailed(kind, f"{type(inner).__name__}: {inner}", detail)


# Compiled models share one frame (torch's wrapper around a module's forward), whose cache
# dynamo caps at `recompile_limit` (8) entries per process: past it, every further compiled
# model silently runs eager. In-process trials compile many models in one process, so they
# raise the cap; a fresh process per trial never nears it.
RECOMPILE_ROOM = 1024


def compile_room() -> None:
    """Lift dynamo's per-process recompile caps so that every in-process compiled trial compiles."""
    import torch._dynamo

    cfg = torch._dynamo.config
    for name in ("recompile_limit", "accumulated_recompile_limit"):
        if getattr(cfg, name, RECOMPILE_ROOM) < RECOMPILE_ROOM:
            setattr(cfg, name, RECOMPILE_ROOM)


class InProcessHandle:
    def __init__(self, workload: Workload, config: TrainConfig, device: torch.device, protocol: Protocol) -> None:
        if config.compile.mode != "none":
            compile_room()
        self.session = self._call(Session, workload, config, device, protocol)

    @staticmethod
    def _call(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - a trial's failure is data
            raise classify(exc) from exc

    def window(self) -> float:
        return self._call(self.session.window).samples_per_s

    def profile(self, trace: str | None = None) -> None:
        self._call(self.session.profile, trace)

    def summary(self) -> Summary:
        return self.session.result.summary()

    def close(self, kill: bool = False) -> None:
        if self.session is not None:
            self.session.close(kill)
        self.session = None


class WorkerHandle:
    """A `python -m autotune.worker` process holding one session.

    Replies come on a pipe of their own; the worker's stdout and stderr go to a temporary
    file whose tail explains a crash. Everything the handle does, start-up included, must
    finish within `timeout_s` of its creation, or the worker is killed as hung.
    """

    def __init__(self, target: str, config: TrainConfig, device: torch.device, protocol: Protocol, timeout_s: float) -> None:
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.err = tempfile.TemporaryFile()
        read_fd, write_fd = os.pipe()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "AUTOTUNE_REPLY_FD": str(write_fd),
               "AUTOTUNE_PARENT_PID": str(os.getpid())}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "autotune.worker"], stdin=subprocess.PIPE, stdout=self.err, stderr=self.err,
                env=env, start_new_session=True, pass_fds=(write_fd,),
            )
        finally:
            os.close(write_fd)
        self.replies = os.fdopen(read_fd, "rb")
        self.oom_kills = oom_kills()
        try:
            self._ask({"cmd": "open", "target": target, "config": config.flat(), "device": device.type,
                       "protocol": dataclasses.asdict(protocol)})
        except BaseException:  # a worker that could not open must not outlive this handle
            self.close(kill=True)
            raise

    def _stderr_tail(self, n: int = 1500) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")[-n:]

    def _kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def _died(self) -> TrialFailed:
        code = self.proc.wait()
        try:
            sig = signal.Signals(-code).name if code < 0 else ""
        except ValueError:  # a real-time signal has no name
            sig = f"signal {-code}"
        what = f"killed by signal {-code} ({sig})" if code < 0 else f"exited with code {code}"
        if code == -signal.SIGKILL:
            oom = oom_kills() > self.oom_kills
            kind = FailureKind.OOM if oom else FailureKind.KILLED
            what += " by the kernel's OOM killer (its cgroup counted an oom_kill)" if oom else \
                " (no sign of the kernel's OOM killer: killed from outside?)"
        else:
            kind = FailureKind.CRASH
        return TrialFailed(kind, f"the trial process {what}", self._stderr_tail())

    def _ask(self, cmd: dict) -> dict:
        try:
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        left = self.deadline - time.monotonic()
        ready, _, _ = select.select([self.replies], [], [], max(0.0, left))
        if not ready:
            self._kill()
            raise TrialFailed(FailureKind.TIMEOUT, f"the trial did not finish within {self.timeout_s:.0f} s "
                              f"(--trial-timeout; it was at {cmd['cmd']!r}); the process was killed")
        line = self.replies.readline()
        if not line:
            raise self._died()
        try:
            reply = json.loads(line)
        except ValueError:
            self._kill()
            raise TrialFailed(FailureKind.CRASH, f"the trial process sent an unreadable reply: {line[:200]!r}",
                              self._stderr_tail()) from None
        if not reply.get("ok"):
            raise TrialFailed(reply["kind"], reply["error"], reply.get("traceback", ""))
        return reply

    def window(self) -> float:
        return self._ask({"cmd": "window"})["samples_per_s"]

    def profile(self, trace: str | None = None) -> None:
        self._ask({"cmd": "profile", "trace": trace})

    def summary(self) -> Summary:
        return Summary.model_validate(self._ask({"cmd": "summary"})["summary"])

    def close(self, kill: bool = False) -> None:
        if kill:
            self._kill()
        elif self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, BrokenPipeError):
                self._kill()
        self.replies.close()
        self.err.close()


def oom_kills() -> int:
    """How many processes the kernel's OOM killer ended in this cgroup (0 where unknown)."""
    for path in ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control"):
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return 0


class Runner:
    """Opens handles for configs of one workload, isolated in processes or not."""

    def __init__(self, workload: Workload, target: str | None, device: torch.device, protocol: Protocol,
                 isolate: bool = True, timeout_s: float = 300.0) -> None:
        if isolate and not target:
            raise ValueError("isolated trials need a target string to load in the worker")
        self.workload, self.target, self.device, self.protocol = workload, target, device, protocol
        self.isolate, self.timeout_s = isolate, timeout_s

    def open(self, config: TrainConfig, trials: float = 1.0) -> Handle:
        """A handle for `config` that may live as long as `trials` trials (timeout each)."""
        # A DDP trial's rank 0 always runs in a worker process when it can: a rank that fails
        # leaves rank 0 a broken process group whose threads only the end of their process
        # ends safely (torn down in a long-lived process, it can deadlock that process later,
        # when the collector frees it), and one process holds one group at a time.
        if self.isolate or (config.distributed.world_size > 1 and self.target):
            return WorkerHandle(self.target, config, self.device, self.protocol, self.timeout_s * trials)
        return InProcessHandle(self.workload, config, self.device, self.protocol)

    def measure(self, config: TrainConfig, trace: str | None = None,
                on_window: Callable[[int, float], None] | None = None, floor: float | None = None,
                until: float | None = None) -> Summary:
        """Every window of one config, then the profiled run; the summary. With a `floor` (samples/s),
        a config whose every window so far read below it is stopped there (`TrialCut`); past `until`
        (a `time.time()`), it is stopped after the window it is in."""
        t0 = time.perf_counter()
        h = self.open(config)
        try:
            seen: list[float] = []
            for i in range(self.protocol.windows):
                thr = h.window()
                seen.append(thr)
                if on_window:
                    on_window(i, thr)
                if i + 1 < self.protocol.windows:
                    if floor is not None and max(seen) < floor:
                        raise TrialCut(seen, floor, self.protocol.windows)
                    if until is not None and time.time() > until:
                        raise TrialCut(seen, None, self.protocol.windows)
            h.profile(trace)
            out = h.summary()
        except TrialCut:
            h.close()
            raise
        except BaseException:  # Ctrl-C or a failure: the worker must not outlive it
            h.close(kill=True)
            raise
        h.close()
        return out.model_copy(update={"wall_s": time.perf_counter() - t0})

    def interleave(self, a: TrainConfig, b: TrainConfig, pairs: int,
                   on_pair: Callable[[int, float, float], None] | None = None) -> tuple[list[float], list[float]]:
        """Windows of A and B in turns (A B B A A B ...), so drift hits both alike."""
        handles = []
        try:
            # Each handle runs `pairs` windows and waits while the other runs its own: two trials' time.
            span = 2 * max(1.0, pairs / self.protocol.windows)
            handles.append(self.open(a, span))
            handles.append(self.open(b, span))
            ha, hb = handles
            xs, ys = [], []
            for i in range(pairs):
                if i % 2 == 0:
                    xs.append(ha.window()), ys.append(hb.window())
                else:
                    ys.append(hb.window()), xs.append(ha.window())
                if on_pair:
                    on_pair(i, xs[-1], ys[-1])
        except BaseException:
            for h in handles:
                h.close(kill=True)
            raise
        for h in handles:
            h.close()
        return xs, ys

    def lowp_matmul(self) -> dict[str, float]:
        """Lower precisions' matmul speed over fp32's on this device (`autotune.probe`)."""
        return probe.lowp_matmul(self.device)

    def batch_handoff(self) -> float | None:
        """What receiving one batch from a loader worker costs here (`autotune.handoff`)."""
        return handoff.batch_handoff_s(self.workload, self.protocol.seed)
