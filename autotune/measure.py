"""One measurement protocol, applied identically to every config in a run.

A window is: a fresh data-loader iterator, warm-up steps, then measured steps, so two
configs measured in turns (A B A B ...) never inherit each other's prefetched batches.
Throughput is samples over a window's wall time (per-step times come in bursts with a
prefetching loader). A loader that holds `k` batches ready gets `k` more warm-up steps
and a window of at least `4k` steps: a short window would crown the deepest buffer.
"""

from __future__ import annotations

import math
import resource
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from . import apply, comm, ranks, signals
from .clock import STAGES, clock_for
from .config import TrainConfig
from .errors import TrialFailed, UserError, call_user
from .faults import checkpoint
from .loop import Trainer, check_applicable
from .record import ProtocolRecord, Signals, StageTime, StepTime, Summary
from .workload import Workload


# A window of half a second or more: a window of a dozen 2-ms steps lasts 24 ms, and a
# scheduler tick or one slow batch then moves its throughput by several percent.
WINDOW_S = 0.5
MAX_STEPS = 2000  # a window of sub-millisecond steps stays under a few seconds


@dataclass(frozen=True)
class Protocol:
    """The same for every measurement in a run.

    Attributes:
        warmup_steps: Unmeasured steps at the start of every window.
        steps: Measured steps per window (at least; see `plan`).
        windows: Measured windows per config.
        seed: Model init and data order.
        profile_steps: Steps under `torch.profiler` for signals and peak memory.
        window_s: The least seconds a window's measured steps should last: `sized` raises
            `steps` to it from the baseline's step time; None keeps `steps` as given.
    """

    warmup_steps: int = 3
    steps: int = 12
    windows: int = 5
    seed: int = 0
    profile_steps: int = 3
    window_s: float | None = None

    def sized(self, step_s: float | None) -> Protocol:
        """This protocol with enough measured steps per window to last `window_s` at `step_s`
        per step (never fewer than `steps`, at most `MAX_STEPS`)."""
        if self.window_s is None or not step_s or step_s <= 0:
            return self
        return replace(self, steps=max(self.steps, min(MAX_STEPS, math.ceil(self.window_s / step_s))))

    def plan(self, in_flight: int) -> tuple[int, int]:
        """(warm-up, measured) steps of one window for a loader holding `in_flight` batches."""
        return self.warmup_steps + in_flight, max(self.steps, 4 * in_flight)

    def describe(self) -> ProtocolRecord:
        return ProtocolRecord(
            **asdict(self),
            window_rule="each window: fresh loader iterator, warmup_steps + in_flight warm-up steps, "
            "then max(steps, 4 * in_flight) measured steps; in_flight = num_workers * prefetch_factor",
            throughput="samples / wall time of each window; the run's figure is total samples / total time",
        )

    @classmethod
    def from_flags(cls, seed: int = 0, windows: int | None = None, steps: int | None = None,
                   warmup: int | None = None) -> Protocol:
        """The protocol the command-line flags ask for; `None` keeps the default."""
        kw: dict[str, Any] = {}
        for flag, field_name, least in (("windows", "windows", 2), ("steps", "steps", 1), ("warmup", "warmup_steps", 0)):
            value = {"windows": windows, "steps": steps, "warmup": warmup}[flag]
            if value is None:
                continue
            if value < least:
                why = ", so the spread between windows can be measured" if flag == "windows" else ""
                raise UserError(f"--{flag} {value} is too small; give at least {least}{why}.")
            kw[field_name] = value
        return cls(seed=seed, window_s=None if steps is not None else WINDOW_S, **kw)


@dataclass
class Window:
    """One measured window. `epoch_cost_s` is this window's share of the cost of starting
    an epoch (a fresh iterator's first batch beyond a normal step, amortised over the
    epoch's steps): what non-persistent workers pay again at every epoch boundary."""

    samples: int
    wall_s: float
    steps: list[dict[str, float]]
    losses: list[float]
    epoch_cost_s: float = 0.0

    @property
    def samples_per_s(self) -> float:
        total = self.wall_s + self.epoch_cost_s
        return self.samples / total if total > 0 else 0.0


@dataclass
class Measurement:
    """Everything measured of one config under the protocol."""

    config: dict[str, Any]
    windows: list[Window] = field(default_factory=list)
    one_time: dict[str, float] = field(default_factory=dict)
    signals: dict[str, Any] = field(default_factory=dict)
    peak_memory_bytes: int | None = None
    peak_rss_bytes: int | None = None
    first_losses: list[float] = field(default_factory=list)
    # DDP: `windows` are global (samples of every rank, the slowest rank's wall time) with
    # rank 0's steps; `peer_windows[r - 1]` are rank r's own; `comm[r]` is rank r's
    # communication reference (see `autotune.comm`).
    world_size: int = 1
    peer_windows: list[list[Window]] = field(default_factory=list)
    comm: list[dict[str, Any]] = field(default_factory=list)

    def _rank_windows(self) -> list[list[list[dict[str, float]]]]:
        """Each rank's steps, window by window, communication split out of backward."""
        out = []
        for r, windows in enumerate([self.windows] + self.peer_windows):
            fraction = self.comm[r]["fraction"] if r < len(self.comm) else 0.0
            out.append([comm.split(w.steps, fraction) if self.world_size > 1 else w.steps for w in windows])
        return out

    def summary(self) -> Summary:
        per_rank = self._rank_windows()
        keys = STAGES + (("communication",) if self.world_size > 1 else ())
        by_window = [[s for rank in per_rank for s in (rank[i] if i < len(rank) else [])] for i in range(len(self.windows))]
        steps = [s for w in by_window for s in w]  # every rank's steps
        times = sorted(s["step"] for s in steps)
        n = max(1, len(steps))
        thr = [w.samples_per_s for w in self.windows]
        total_s = sum(w.wall_s + w.epoch_cost_s for w in self.windows)
        stage_s = {k: sum(s[k] for s in steps) / n for k in keys}
        step_mean = sum(stage_s.values())
        return Summary(
            config=self.config,
            step_time_s=StepTime(
                median=statistics.median(times) if times else None,
                p90=times[min(len(times) - 1, int(0.9 * len(times)))] if times else None,
                mean=step_mean,
            ),
            samples_per_s=sum(w.samples for w in self.windows) / total_s if total_s else 0.0,
            windows_samples_per_s=thr,
            window_cv=statistics.pstdev(thr) / statistics.mean(thr) if len(thr) > 1 and statistics.mean(thr) else 0.0,
            stages=_stage_times(stage_s),
            window_stage_shares=[_shares(w, keys) for w in by_window if w],
            peak_memory_bytes=self.peak_memory_bytes,
            peak_rss_bytes=self.peak_rss_bytes,
            one_time=self.one_time,
            signals=Signals(**self.signals),
            measured_steps=sum(len(w.steps) for w in self.windows),
            first_losses=self.first_losses,
            world_size=self.world_size,
            rank_stages=[_stage_times({k: sum(s[k] for w in rank for s in w) / max(1, sum(len(w) for w in rank))
                                       for k in keys}) for rank in per_rank] if self.world_size > 1 else [],
        )


def _stage_times(stage_s: dict[str, float]) -> dict[str, StageTime]:
    whole = sum(stage_s.values())
    return {k: StageTime(s=v, share=v / whole if whole else 0.0) for k, v in stage_s.items()}


def _merge(own: Window, peers: list[Window]) -> Window:
    """One global window: the samples of every rank over the slowest rank's wall time."""
    every = [own] + peers
    return Window(samples=sum(w.samples for w in every), wall_s=max(w.wall_s for w in every), steps=own.steps,
                  losses=own.losses, epoch_cost_s=max(w.epoch_cost_s for w in every))


def _shares(steps: list[dict[str, float]], keys: tuple[str, ...] = STAGES) -> dict[str, float]:
    """One window's stage shares of its summed step time."""
    total = {k: sum(s[k] for s in steps) for k in keys}
    whole = sum(total.values())
    return {k: (v / whole if whole else 0.0) for k, v in total.items()}


class Session:
    """A built trainer that runs protocol windows on demand (so two can take turns)."""

    def __init__(self, workload: Workload, config: TrainConfig, device: torch.device, protocol: Protocol) -> None:
        self.protocol, self.device = protocol, device
        t0 = time.perf_counter()
        world = config.distributed.world_size
        spec, self.peers = ranks.RankSpec.from_env() if world > 1 else None, None
        if world > 1 and spec is None:  # rank 0: start the other ranks, which open the same session
            check_applicable(workload, config, device)  # a config that cannot run starts no rank
            spec = ranks.RankSpec(0, world, ranks.free_port())
            self.peers = ranks.Peers(workload.source, spec)
            self.peers.send({"cmd": "open", "target": workload.source, "config": config.flat(),
                             "device": device.type, "protocol": asdict(protocol)})
        self.trainer = self._together(None, lambda: Trainer(workload, config, device, seed=protocol.seed, rank=spec))
        self.device = self.trainer.device
        self.result = Measurement(config=config.flat(), world_size=world, peer_windows=[[] for _ in range(world - 1)])
        self.result.one_time["setup_s"] = time.perf_counter() - t0
        self._first = True
        self._stream = None

    def _together(self, cmd: dict | None, fn):
        """`fn()` here while the other ranks obey `cmd`; their replies. A rank's failure fails
        all: rank 0 reports the other rank's reason (its own error is then the broken
        collective) and no rank outlives it."""
        if self.peers is None:
            return fn()
        if cmd is not None:
            self.peers.send(cmd)
        try:
            out = fn()
            replies = self.peers.gather()
        except BaseException as exc:
            cause = None if isinstance(exc, (KeyboardInterrupt, TrialFailed)) else self.peers.failure(wait_s=3.0)
            self.peers.kill()
            ranks.close_group()  # the group is broken: the next session in this process opens its own
            if cause is not None:
                raise cause from exc
            raise
        return out if cmd is None else (out, replies)

    def close(self, kill: bool = False) -> None:
        """End the other ranks and leave the process group (a no-op for one process)."""
        if self.peers is not None:
            self.peers.kill() if kill else self.peers.close()
        self.trainer.close()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def _next(self):
        return call_user("the workload's dataset or collate_fn", next, self._stream)

    def _open_stream(self) -> float:
        """A fresh iterator (a new epoch) and its first batch; returns how long that took."""
        t0 = time.perf_counter()
        self._stream = self.trainer.batches()
        self._pending = self._next()
        took = time.perf_counter() - t0
        self.result.one_time.setdefault("loader_first_batch_s", took)
        return took

    def _close_stream(self) -> None:
        self._stream.close()
        self._stream = None
        self.trainer.settle()  # persistent workers finish what they were asked; others end

    def _batch(self):
        b, self._pending = self._pending, None
        return b if b is not None else self._next()

    def window(self) -> Window:
        """One protocol window: fresh iterator, warm-up, measured steps (on every rank)."""
        if self.peers is None:
            w = self._window()
        else:
            own, replies = self._together({"cmd": "window"}, self._window)
            theirs = [Window(**r["window"]) for r in replies]
            for r, pw in enumerate(theirs):
                self.result.peer_windows[r].append(pw)
            w = _merge(own, theirs)
        self.result.windows.append(w)
        return w

    def _window(self) -> Window:
        checkpoint("window")
        warmup, steps = self.protocol.plan(self.trainer.in_flight)
        # Another session may share this process: its threads and flags are this config's again.
        apply.apply_backend(self.trainer.config, self.trainer.device)
        epoch_start = self._open_stream()
        losses = []
        if self._first:
            t0 = time.perf_counter()
            losses.append(self.trainer.step(self._batch()))
            self._sync()
            self.result.one_time["first_step_s"] = time.perf_counter() - t0
            warmup -= 1
            self._first = False
        for _ in range(max(0, warmup)):
            losses.append(self.trainer.step(self._batch()))
        self._sync()
        clock = clock_for(self.device)
        t_start = time.perf_counter()
        for _ in range(steps):
            clock.start_step()
            b = self._batch()
            clock.mark("data")
            losses.append(self.trainer.step(b, clock))
        t_end = clock.end_window()
        self._close_stream()
        values = [float(x) for x in losses]
        if not self.result.first_losses:
            self.result.first_losses = values
        wall = t_end - t_start
        return Window(samples=steps * self.trainer.rank_batch, wall_s=wall, steps=clock.resolve(),
                      losses=values[-steps:], epoch_cost_s=self._epoch_cost(epoch_start, wall / steps, steps))

    def _epoch_cost(self, epoch_start: float, step_s: float, steps: int) -> float:
        """`steps` steps' share of an epoch boundary: the first batch's wait beyond a step. Persistent
        workers start once per run: their first epoch's start is a one-time cost
        (`one_time["worker_start_s"]`), not charged to the window."""
        per_epoch = self.trainer.steps_per_epoch
        if not per_epoch:
            return 0.0
        d = self.trainer.config.data
        if d.num_workers and d.persistent_workers and "worker_start_s" not in self.result.one_time:
            self.result.one_time["worker_start_s"] = epoch_start
            return 0.0
        self.result.one_time["epoch_start_s"] = epoch_start
        return max(0.0, epoch_start - step_s) * steps / per_epoch

    def profile(self, trace_path: str | None = None) -> dict[str, Any]:
        """A short profiled run after the windows: diagnosis signals and peak memory; under DDP
        also each rank's communication reference."""
        if self.peers is None:
            return self._profile(trace_path)
        sig, replies = self._together({"cmd": "profile", "trace": None}, lambda: self._profile(trace_path))
        self.result.comm += [r["comm"][0] for r in replies]
        return sig

    def _profile(self, trace_path: str | None) -> dict[str, Any]:
        self._open_stream()
        for _ in range(self.protocol.warmup_steps):
            self.trainer.step(self._batch())

        fetch = {"cpu": 0.0, "wall": 0.0}  # the loading thread's CPU time and its wait for batches

        def run(n: int) -> float:
            self._sync()
            t0 = time.perf_counter()
            for _ in range(n):
                c0, w0 = time.thread_time(), time.perf_counter()
                with torch.profiler.record_function("autotune::data"):
                    b = self._batch()
                fetch["cpu"] += time.thread_time() - c0
                fetch["wall"] += time.perf_counter() - w0
                self.trainer.step(b)
            self._sync()
            return time.perf_counter() - t0

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        self.trainer.annotate = True
        try:
            sig = signals.collect(run, self.protocol.profile_steps, self.device, trace_path)
            self.trainer.annotate = False
            if not self.trainer.in_flight and fetch["wall"] > 0:  # batches loaded in this thread: its CPU shows
                sig["data_cpu_share"] = min(1.0, fetch["cpu"] / fetch["wall"])
            if self.result.world_size > 1:
                ref = comm.reference(lambda sync: self.trainer.backward_s(self._batch(), sync),
                                     max(3, self.protocol.profile_steps))
                self.result.comm = [ref]
                sig.update(world_size=self.result.world_size, allreduce_bytes_per_step=self.trainer.gradient_bytes(),
                           backward_synced_s=ref["synced_backward_s"], backward_local_s=ref["local_backward_s"])
        finally:
            self.trainer.annotate = False
            self._close_stream()
        if self.device.type == "cuda":
            self.result.peak_memory_bytes = int(torch.cuda.max_memory_allocated())
        else:
            self.result.peak_memory_bytes = sig["peak_profiled_alloc_bytes"] + signals.persistent_bytes(
                self.trainer.model, self.trainer.optimizer
            )
        self.result.peak_rss_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        self.result.signals = sig
        return sig


def measure(workload: Workload, config: TrainConfig, device: torch.device, protocol: Protocol,
            trace_path: str | None = None, on_window=None) -> Measurement:
    """All windows of one config in this process, then the profiled run."""
    session = Session(workload, config, device, protocol)
    try:
        for i in range(protocol.windows):
            w = session.window()
            if on_window:
                on_window(i, w)
        session.profile(trace_path)
    finally:
        session.close()
    return session.result
