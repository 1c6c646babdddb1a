"""The ranks of a DDP job on one machine: their process group, and the processes of ranks 1..N-1.

The process that measures (or trains) is rank 0; it starts the other ranks as
`python -m autotune.worker` processes (`Peers`) that load the same target and obey the same
commands, so every rank runs the same steps and collectives in the same order. The ranks
meet over TCP on 127.0.0.1 at a free port; the backend is gloo on CPU and NCCL on CUDA.

No orphans: the peers stay in rank 0's process group (a killed trial's group kill ends
them), they die with their parent (`PR_SET_PDEATHSIG`), and a peer whose command failed
replies and exits at once, so rank 0's pending collective fails instead of waiting.
"""

from __future__ import annotations

import datetime
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch

from .errors import TrialFailed
from .record import FailureKind

ADDR = "127.0.0.1"
# Rendezvous: every rank must have joined within this; collectives: one may wait this long.
RENDEZVOUS_S, COLLECTIVE_S = 60.0, 300.0


@dataclass(frozen=True)
class RankSpec:
    """Where one process sits in the job."""

    rank: int
    world_size: int
    port: int
    addr: str = ADDR

    @classmethod
    def from_env(cls) -> RankSpec | None:
        """The spec a peer was started with (None in rank 0)."""
        if "AUTOTUNE_RANK" not in os.environ:
            return None
        return cls(int(os.environ["AUTOTUNE_RANK"]), int(os.environ["AUTOTUNE_WORLD_SIZE"]),
                   int(os.environ["AUTOTUNE_MASTER_PORT"]), os.environ.get("AUTOTUNE_MASTER_ADDR", ADDR))


def free_port() -> int:
    with socket.socket() as s:
        s.bind((ADDR, 0))
        return s.getsockname()[1]


def device_of(device: torch.device, spec: RankSpec) -> torch.device:
    """Each rank's own GPU on CUDA (rank modulo the visible devices); the CPU otherwise."""
    if device.type != "cuda":
        return device
    index = spec.rank % max(1, torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def init_group(spec: RankSpec, device: torch.device) -> None:
    """Join the job's default process group (gloo on CPU, NCCL on CUDA)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("a process group is already open in this process: one DDP session at a time "
                           "(isolated trials, the default, give each its own process)")
    store = dist.TCPStore(spec.addr, spec.port, spec.world_size, is_master=spec.rank == 0,
                          timeout=datetime.timedelta(seconds=RENDEZVOUS_S))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=spec.rank,
                            world_size=spec.world_size, timeout=datetime.timedelta(seconds=COLLECTIVE_S))


def close_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


class Peers:
    """Ranks 1..N-1 of a job whose rank 0 is this process, driven by worker commands."""

    def __init__(self, target: str | None, spec: RankSpec) -> None:
        if not target:
            raise TrialFailed(FailureKind.USER, "a workload with world_size > 1 must be loaded from a target "
                              "(file.py, file.py:func or package.module:func) so every rank can load it")
        self.procs: list[subprocess.Popen] = []
        self.replies: list[Any] = []
        self.logs: list[Any] = []
        try:
            for rank in range(1, spec.world_size):
                self._start(rank, spec)
        except BaseException:
            self.kill()
            raise

    def _start(self, rank: int, spec: RankSpec) -> None:
        log = tempfile.TemporaryFile()
        read_fd, write_fd = os.pipe()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "AUTOTUNE_REPLY_FD": str(write_fd),
               "AUTOTUNE_PARENT_PID": str(os.getpid()), "AUTOTUNE_RANK": str(rank),
               "AUTOTUNE_WORLD_SIZE": str(spec.world_size), "AUTOTUNE_MASTER_PORT": str(spec.port),
               "AUTOTUNE_MASTER_ADDR": spec.addr}
        try:
            proc = subprocess.Popen([sys.executable, "-m", "autotune.worker"], stdin=subprocess.PIPE, stdout=log,
                                    stderr=log, env=env, pass_fds=(write_fd,))
        finally:
            os.close(write_fd)
        self.procs.append(proc)
        self.replies.append(os.fdopen(read_fd, "rb"))
        self.logs.append(log)

    def send(self, cmd: dict) -> None:
        """The same command to every peer (a dead one shows at `gather`)."""
        line = (json.dumps(cmd) + "\n").encode()
        for proc in self.procs:
            try:
                proc.stdin.write(line)
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass

    def gather(self, timeout_s: float = COLLECTIVE_S) -> list[dict]:
        """Every peer's reply to the last command, in rank order; the first failure as `TrialFailed`."""
        deadline = time.monotonic() + timeout_s
        out = []
        for i, pipe in enumerate(self.replies):
            reply = self._read(i, pipe, deadline)
            if reply is None:
                raise TrialFailed(FailureKind.TIMEOUT, f"rank {i + 1} did not answer within {timeout_s:.0f} s")
            out.append(reply)
        return out

    def failure(self, wait_s: float = 10.0) -> TrialFailed | None:
        """A peer's failure, when one failed or died within `wait_s` (rank 0 failed at a collective:
        the cause is usually another rank's)."""
        deadline = time.monotonic() + wait_s
        for i, pipe in enumerate(self.replies):
            try:
                self._read(i, pipe, deadline)
            except TrialFailed as exc:
                return exc
        return None

    def _read(self, i: int, pipe: Any, deadline: float) -> dict | None:
        ready, _, _ = select.select([pipe], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        line = pipe.readline()
        if not line:
            raise self._died(i)
        reply = json.loads(line)
        if not reply.get("ok"):
            raise TrialFailed(FailureKind(reply["kind"]), f"rank {i + 1}: {reply['error']}", reply.get("traceback", ""))
        return reply

    def _died(self, i: int) -> TrialFailed:
        code = self.procs[i].wait()
        what = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
        self.logs[i].seek(0)
        tail = self.logs[i].read().decode(errors="replace")[-1500:]
        return TrialFailed(FailureKind.CRASH, f"rank {i + 1}'s process {what}", tail)

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait()
        self._close_files()

    def close(self) -> None:
        """End the peers: their stdin closes and they exit; any still running after 10 s is killed."""
        for proc in self.procs:
            try:
                proc.stdin.close()
            except OSError:
                pass
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._close_files()

    def _close_files(self) -> None:
        for f in self.replies + self.logs:
            f.close()
        self.replies, self.logs = [], []
