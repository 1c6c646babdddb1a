"""The overhead benchmark's measurements: the three arms of a workload, and the near-empty step.

`bench_workload` runs a bare loop, autotune's instrumented window and the bare loop under
torch.profiler in one process, on the same model, optimizer and dataset, interleaved in
rounds whose order cycles; `added_cost_per_step` alternates a bare and an instrumented
step on a near-empty step. `benchmarks.overhead` runs them, judges the targets and writes
the report (its docstring states the method in full).
"""

from __future__ import annotations

import gc
import math
import os
import statistics
import time
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile

from autotune.clock import clock_for
from autotune.config import TrainConfig
from autotune.errors import UserError
from autotune.measure import Protocol, Session
from autotune.signals import quiet_stderr
from autotune.stats import paired_ratio
from autotune.workload import Workload, load_workload

ARMS = ("bare", "autotune", "profiler")
# Round orders, cycled: each arm takes each position equally often, and each order is followed
# by its reverse, so drift and any carry-over from the arm before hit every arm alike.
ORDERS = (("bare", "autotune", "profiler"), ("profiler", "autotune", "bare"),
          ("autotune", "profiler", "bare"), ("bare", "profiler", "autotune"),
          ("profiler", "bare", "autotune"), ("autotune", "bare", "profiler"))


class BareLoop:
    """The hand-written loop, and the same loop under torch.profiler."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable,
                 dataset: Any, workload: Workload, seed: int, threads: int, warmup: int, steps: int) -> None:
        self.model, self.opt, self.loss_fn = model, optimizer, loss_fn
        self.threads, self.warmup, self.steps = threads, warmup, steps
        self.loader = torch.utils.data.DataLoader(
            dataset, batch_size=workload.batch_size, shuffle=True, drop_last=True,
            generator=torch.Generator().manual_seed(seed), collate_fn=workload.collate_fn,
        )
        if warmup + steps > len(self.loader):
            raise UserError(
                f"workload {workload.name!r}: {warmup} warm-up + {steps} measured steps exceed one epoch "
                f"({len(self.loader)} batches); give fewer steps."
            )

    def _warm(self):
        torch.set_num_threads(self.threads)
        it = iter(self.loader)
        model, opt, loss_fn = self.model, self.opt, self.loss_fn
        for _ in range(self.warmup):
            x, y = next(it)
            loss = loss_fn(model, (x, y))
            loss.backward()
            opt.step()
            opt.zero_grad()
        return it

    def _timed(self, it) -> float:
        model, opt, loss_fn, steps = self.model, self.opt, self.loss_fn, self.steps
        n = 0
        t0 = time.perf_counter()
        for batch in it:
            x, y = batch
            loss = loss_fn(model, (x, y))
            loss.backward()
            opt.step()
            opt.zero_grad()
            n += 1
            if n == steps:
                break
        t1 = time.perf_counter()
        return (t1 - t0) / n

    def window(self) -> float:
        """Seconds per measured step of one window."""
        return self._timed(self._warm())

    def profiled_window(self) -> tuple[float, float]:
        """(seconds per measured step inside the profiler, seconds of the profiler's start plus stop)."""
        it = self._warm()
        with quiet_stderr():  # Kineto prints log lines at every start and stop
            t_enter = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU], profile_memory=False):
                t_in = time.perf_counter()
                per_step = self._timed(it)
                t_out = time.perf_counter()
            t_exit = time.perf_counter()
        return per_step, (t_in - t_enter) + (t_exit - t_out)


def _finite(x: float) -> float | None:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def _overhead(bare: list[float], other: list[float]) -> dict[str, Any]:
    """Paired overhead t_other / t_bare - 1, with its 95% interval."""
    r = paired_ratio(bare, other)
    return {"overhead": _finite(r["ratio"] - 1), "ci": [_finite(r["low"] - 1), _finite(r["high"] - 1)], "pairs": r["pairs"]}


def _fraction(timer: dict[str, Any], prof: dict[str, Any]) -> dict[str, Any]:
    """Stage timers' cost as a fraction of the profiler's, with bounds from both intervals.

    The bounds combine the two 95% intervals (lowest timer cost over highest profiler
    cost, and the reverse): wider than a 95% interval of the fraction itself.
    """
    ot, op = timer["overhead"], prof["overhead"]
    (tl, th), (pl, ph) = timer["ci"], prof["ci"]
    point = ot / op if ot is not None and op and op > 0 else None
    low = tl / ph if None not in (tl, ph) and ph > 0 else None
    high = th / pl if None not in (th, pl) and pl > 0 else None
    return {"fraction": point, "bounds": [low, high]}


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


class _Tiny(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.x = list(torch.randn(n, 4, generator=torch.Generator().manual_seed(0)).unbind(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], i % 2


def _median_ci(diffs: list[float]) -> tuple[float, float, float]:
    """Median of paired differences and its distribution-free 95% interval (sign-test order statistics)."""
    d = sorted(diffs)
    n = len(d)
    half = 1.96 * math.sqrt(n) / 2
    lo, hi = max(0, int(math.floor(n / 2 - half))), min(n - 1, int(math.ceil(n / 2 + half)))
    return statistics.median(d), d[lo], d[hi]


def added_cost_per_step(pairs: int, threads: int, seed: int = 0) -> dict[str, Any]:
    """autotune's added host time per step, on a near-empty step where nothing else varies.

    A `Linear(4, 2)` at batch 2: the step's own work is a few hundred microseconds, so the
    bookkeeping that autotune adds per step (stage clock marks, moving and splitting the
    batch, the trainer's checks and context managers) stands out from the noise. The two
    loops alternate step by step (bare, autotune, autotune, bare, ...) on the same model;
    the autotune step is the body of `Session.window()`'s measured loop: `clock.start_step()`,
    the next batch from `Trainer.batches()`, `clock.mark("data")`, `Trainer.step(batch, clock)`.
    That cost does not grow with the model: it is paid once per step, per stage.
    """
    torch.set_num_threads(threads)
    wl = Workload(
        name="near-empty step", model=lambda: torch.nn.Linear(4, 2), dataset=_Tiny(512),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.01),
        loss=lambda model, batch: torch.nn.functional.cross_entropy(model(batch[0]), batch[1]), batch_size=2,
    )
    config = TrainConfig.model_validate({"backend": {"num_threads": threads}})
    tr = Session(wl, config, torch.device("cpu"), Protocol(seed=seed)).trainer
    model, opt, loss_fn = tr.model, tr.optimizer, wl.loss
    loader = torch.utils.data.DataLoader(tr.dataset, batch_size=2, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(seed))

    def endless():
        while True:
            yield from loader

    plain, stream = endless(), tr.batches()
    state: dict[str, Any] = {}

    def bare_step() -> None:
        x, y = next(plain)
        loss = loss_fn(model, (x, y))
        loss.backward()
        opt.step()
        opt.zero_grad()

    def autotune_step() -> None:
        clock = state["clock"]
        clock.start_step()
        b = next(stream)
        clock.mark("data")
        state["losses"].append(tr.step(b, clock))

    wall, cpu = {"bare": [], "autotune": []}, {"bare": [], "autotune": []}
    pc, tt = time.perf_counter, time.thread_time
    gc.collect()
    for i in range(pairs + 50):  # the first 50 pairs warm up and are dropped
        if i % 40 == 0:  # a fresh clock per 40 steps, as per window
            state["clock"], state["losses"] = clock_for(torch.device("cpu")), []
        order = (("bare", bare_step), ("autotune", autotune_step))
        for name, fn in order if i % 2 == 0 else order[::-1]:
            c0, t0 = tt(), pc()
            fn()
            t1, c1 = pc(), tt()
            if i >= 50:
                wall[name].append(t1 - t0)
                cpu[name].append(c1 - c0)
    out: dict[str, Any] = {"pairs": pairs, "model": "Linear(4, 2), batch 2, SGD"}
    for kind, data in (("wall", wall), ("thread_cpu", cpu)):
        med, lo, hi = _median_ci([b - a for a, b in zip(data["bare"], data["autotune"])])
        out[kind] = {"bare_step_s": statistics.median(data["bare"]), "autotune_step_s": statistics.median(data["autotune"]),
                     "added_s": med, "ci": [lo, hi]}
    return out


def bench_workload(target: str, rounds: int, warmup: int, steps: int, threads: int, seed: int = 0,
                   log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """All three arms of one workload, interleaved over `rounds` counted rounds."""
    torch.set_num_threads(threads)
    wl = load_workload(target)
    config = TrainConfig.model_validate({"backend": {"num_threads": threads}})
    protocol = Protocol(warmup_steps=warmup, steps=steps, windows=rounds + 1, seed=seed)
    t_setup = time.perf_counter()
    session = Session(wl, config, torch.device("cpu"), protocol)
    tr = session.trainer
    # The same model and optimizer objects for every arm: only the loop around them differs.
    bare = BareLoop(tr.model, tr.optimizer, wl.loss, tr.dataset, wl, seed, threads, warmup, steps)
    setup_s = time.perf_counter() - t_setup

    def run_autotune() -> float:
        w = session.window()
        return w.wall_s / len(w.steps)

    def one(arm: str) -> tuple[float, float, float]:
        """(wall s per measured step, process CPU s of the whole window call, profiler start+stop s)."""
        gc.collect()  # every arm starts from the same collector state, outside any timing
        c0 = time.process_time()
        extra = 0.0
        if arm == "bare":
            wall = bare.window()
        elif arm == "autotune":
            wall = run_autotune()
        else:
            wall, extra = bare.profiled_window()
        return wall, time.process_time() - c0, extra

    times: dict[str, list[float]] = {a: [] for a in ARMS}
    cpu: dict[str, list[float]] = {a: [] for a in ARMS}
    start_stop: list[float] = []
    load_before = _load()
    t_run = time.perf_counter()
    for r in range(rounds + 1):  # round 0 warms up every arm and is dropped
        order = ORDERS[(r - 1) % len(ORDERS)] if r else ORDERS[0]
        got = {arm: one(arm) for arm in order}
        if r == 0:
            continue
        for arm in ARMS:
            times[arm].append(got[arm][0])
            cpu[arm].append(got[arm][1])
        start_stop.append(got["profiler"][2])
        log(f"{wl.name}: round {r}/{rounds} ({'/'.join(order)})  "
            + "  ".join(f"{a} {got[a][0] * 1e3:.3f} ms" for a in ARMS))
    run_s = time.perf_counter() - t_run
    load_after = _load()

    auto = _overhead(times["bare"], times["autotune"])
    prof = _overhead(times["bare"], times["profiler"])
    ss_per_step = [s / steps for s in start_stop]
    prof_total = _overhead(times["bare"], [p + s for p, s in zip(times["profiler"], ss_per_step)])
    # Contention-robust view: CPU time of the whole window call (fresh iterator, warm-up, measured
    # steps, and for autotune its per-window bookkeeping), which time spent descheduled by
    # other processes does not inflate. The profiler's includes its start and stop.
    auto_cpu = _overhead(cpu["bare"], cpu["autotune"])
    counted = session.result.windows[1:]
    stage_steps = [s for w in counted for s in w.steps]
    stages = {k: statistics.fmean(s[k] for s in stage_steps) for k in stage_steps[0] if k != "step"} if stage_steps else {}
    return {
        "workload": wl.name,
        "target": target,
        "batch_size": wl.batch_size,
        "warmup_steps": warmup,
        "steps_per_window": steps,
        "rounds": rounds,
        "setup_s": setup_s,
        "run_s": run_s,
        "step_time_s": {a: statistics.median(times[a]) for a in ARMS},
        "step_time_s_per_round": times,
        "profiler_start_stop_s": statistics.median(start_stop),
        "window_cpu_s": {a: statistics.median(cpu[a]) for a in ARMS},
        "window_cpu_s_per_round": cpu,
        "load_average_1min": {"before": load_before, "after": load_after},
        "autotune_overhead": auto,
        "autotune_overhead_median_round": _finite(statistics.median(b / a for a, b in zip(times["bare"], times["autotune"])) - 1),
        "autotune_cpu_overhead": auto_cpu,
        "profiler_overhead": prof,
        "profiler_overhead_with_start_stop": prof_total,
        "stage_timer_vs_profiler": _fraction(auto, prof),
        "autotune_stages_s": stages,
    }
