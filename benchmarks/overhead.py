"""What autotune's instrumented loop costs, against a bare loop and against torch.profiler.

    python -m benchmarks.overhead [--json FILE] [--md FILE] [--rounds N] [--quick]

For each workload, three arms run in one process on the same model and optimizer objects
and the same dataset, interleaved in rounds of one window each whose order cycles through
all six (A B C, C B A, B C A, A C B, ...), so that drift of the machine, and whatever one
arm leaves behind for the next, hit all of them alike; a first round warms everything up
and is not counted:

- ``bare``: a hand-written loop, ``for batch in loader: x, y = batch; loss = loss_fn(model,
  (x, y)); loss.backward(); opt.step(); opt.zero_grad()``, over its own DataLoader with the
  settings autotune's trainer uses (batch_size, shuffle with a seeded generator, drop_last,
  no workers); timed with ``perf_counter`` at the window's edges only.
- ``autotune``: ``autotune.measure.Session(...).window()``, the measured path with a stage
  clock mark at every stage boundary of every step; its ``Window.wall_s / steps``.
- ``profiler``: the bare loop's same steps inside ``torch.profiler.profile`` (CPU activity,
  ``profile_memory=False``), timed inside the profiler's context; its start and stop (which
  collects the events) are timed apart.

Every window of every arm is a fresh loader iterator, the same warm-up steps, then the same
number of measured steps, all within one epoch. The per-step time of a window is its wall
time over its steps; a workload's step time is the median over rounds. Overheads are paired
ratios of adjacent windows (`autotune.stats.paired_ratio`): geometric mean of
``t_arm / t_bare`` over rounds, minus one, with a 95% Student-t interval.

Window figures carry whatever else the machine is doing. So autotune's added cost is also
measured where little else varies: on a near-empty step (`Linear(4, 2)`, batch 2), the bare
step and the instrumented step alternate step by step, and the median paired difference of
thread CPU time is the host time autotune adds per step; divided by each workload's bare
step time, it is that workload's share. Every arm uses the same intra-op thread count
(`--threads`, default 1: the least noise on few cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from autotune.machine import cpu_name
from autotune.errors import EXIT_OK, UserCodeError, UserError, exit_code, explain

from benchmarks.overhead_arms import added_cost_per_step, bench_workload
from benchmarks.table import emit

PROG = "python -m benchmarks.overhead"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
# (target in examples/, warm-up steps, measured steps per window)
DEFAULT_RUNS = (("overhead_bound.py", 3, 20), ("compute_bound.py:small", 3, 12))
QUICK_RUNS = (("overhead_bound.py:small", 1, 3), ("compute_bound.py:small", 1, 2))
DEFAULT_ROUNDS = 30
QUICK_ROUNDS = 2
DEFAULT_PAIRS = 2000  # step-by-step pairs on the near-empty step
QUICK_PAIRS = 100
TARGET_OVERHEAD = 0.02  # instrumented loop: at most 2% of step time
TARGET_FRACTION = 0.2  # stage timers: at most a fifth of what torch.profiler costs



def _target(spec: str) -> str:
    path, _, fn = spec.partition(":")
    if "/" in path or os.sep in path or Path(path).exists():
        return spec
    if not EXAMPLES.is_dir():
        raise UserError(f"the examples folder {str(EXAMPLES)!r} is missing; run the benchmark from a source checkout.")
    return str(EXAMPLES / path) + (":" + fn if fn else "")


def _pct(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x * 100:+.{digits}f}%"


def _ci(o: dict[str, Any], digits: int = 2) -> str:
    lo, hi = o["ci"]
    return f"{_pct(o['overhead'], digits)} [{_pct(lo, digits)}, {_pct(hi, digits)}]"


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms"


def _share(x: float | None) -> str:
    if x is None:
        return "n/a"
    return "< 0 (within noise)" if x < 0 else f"{x * 100:.1f}%"


def to_markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    added = report["added_cost_per_step"]
    ac = added["thread_cpu"]
    lines = [
        "| workload | bare loop | autotune | torch.profiler | autotune overhead, windows [95% CI] "
        "| autotune added per step | profiler overhead, in window [95% CI] | profiler incl. start+stop "
        "| stage timers / profiler cost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in report["workloads"]:
        st = w["step_time_s"]
        lines.append(
            f"| {w['workload']}, batch {w['batch_size']} | {_ms(st['bare'])} | {_ms(st['autotune'])} | "
            f"{_ms(st['profiler'])} | {_ci(w['autotune_overhead'])} | "
            f"{ac['added_s'] * 1e6:.0f} µs = {_share(w['added_share'])} | "
            f"{_ci(w['profiler_overhead'], 1)} | {_pct(w['profiler_overhead_with_start_stop']['overhead'], 1)} | "
            f"per step: {_share(w['added_vs_profiler'])} ({_share(w['added_vs_profiler_with_start_stop'])} "
            f"incl. start+stop); windows: {_share(w['stage_timer_vs_profiler']['fraction'])} |"
        )
    loads = [x for w in report["workloads"] for x in w["load_average_1min"].values() if x is not None]
    lines += [
        "",
        f"`{PROG}`: {env['threads']} intra-op thread(s) for every arm, no loader "
        f"workers; torch {env['torch']}, {env['cpu']}, {env['cpu_count']} cores. Step times are medians over "
        f"{report['rounds']} rounds; each round runs one window per arm (fresh loader iterator, warm-up steps, then "
        f"{' and '.join(str(w['steps_per_window']) for w in report['workloads'])} measured steps), in one process "
        "on the same model, optimizer and dataset, the arms' order cycling through all six so each takes each "
        "place equally often. Window overheads: geometric mean of the paired per-round ratios to the bare loop, "
        "minus one, with a 95% t interval. The profiler (CPU activity, profile_memory=False) is timed inside its "
        "context; its start and stop, timed apart, add "
        + " and ".join(f"{w['profiler_start_stop_s'] * 1e3:.0f} ms per {w['steps_per_window']}-step window"
                       for w in report["workloads"]) + ".",
        "",
        f"Autotune added per step: the host CPU time that the instrumented step (stage clock marks, batch "
        f"move and split, the trainer's checks) adds to the bare step, as the median of {added['pairs']} "
        f"step-by-step alternated pairs on a near-empty step ({added['model']}): {ac['added_s'] * 1e6:.1f} µs "
        f"[95% CI {ac['ci'][0] * 1e6:.1f}, {ac['ci'][1] * 1e6:.1f}] (wall: {added['wall']['added_s'] * 1e6:.1f} µs), "
        "a cost per step and stage that does not grow with the model; its share is of each workload's bare step. "
        "Stage timers / profiler cost divides that share (or the window overhead) by the profiler's overhead.",
    ]
    if loads and max(loads) > 0.5 * (env["cpu_count"] or 1):
        lines += ["", f"The machine was busy with other work (1-minute load average up to {max(loads):.1f} on "
                      f"{env['cpu_count']} cores): window figures carry that noise; the per-step figure resists it best."]
    return "\n".join(lines) + "\n"


def run(targets: list[tuple[str, int, int]], rounds: int, threads: int, seed: int = 0, pairs: int = 2000,
        log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    threads_before = torch.get_num_threads()
    t0 = time.perf_counter()
    try:
        added = added_cost_per_step(pairs, threads, seed)
        log(f"near-empty step: autotune adds {added['thread_cpu']['added_s'] * 1e6:.1f} µs CPU per step")
        results = [bench_workload(_target(t), rounds, w, s, threads, seed, log) for t, w, s in targets]
    finally:
        torch.set_num_threads(threads_before)
    for w in results:
        share = added["thread_cpu"]["added_s"] / w["step_time_s"]["bare"]
        prof, prof_all = w["profiler_overhead"]["overhead"], w["profiler_overhead_with_start_stop"]["overhead"]
        w["added_share"] = share
        w["added_vs_profiler"] = share / prof if prof and prof > 0 else None
        w["added_vs_profiler_with_start_stop"] = share / prof_all if prof_all and prof_all > 0 else None
        win, frac = w["autotune_overhead"], w["stage_timer_vs_profiler"]["fraction"]
        w["targets"] = {
            "overhead_at_most": TARGET_OVERHEAD,
            "fraction_at_most": TARGET_FRACTION,
            "per_step_overhead_met": share <= TARGET_OVERHEAD,
            "per_step_fraction_met": w["added_vs_profiler"] is not None and w["added_vs_profiler"] <= TARGET_FRACTION,
            "window_overhead_met": win["overhead"] is not None and win["overhead"] <= TARGET_OVERHEAD,
            "window_overhead_ci_within": win["ci"][1] is not None and win["ci"][1] <= TARGET_OVERHEAD,
            "window_fraction_met": frac is not None and frac <= TARGET_FRACTION,
        }
    return {
        "benchmark": "overhead",
        "rounds": rounds,
        "environment": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "cpu": cpu_name(),
            "cpu_count": os.cpu_count(),
            "threads": threads,
            "device": "cpu",
        },
        "method": {
            "arms": {
                "bare": "hand-written loop (for batch in loader: loss_fn, backward, step, zero_grad), perf_counter at window edges",
                "autotune": "autotune.measure.Session.window(): stage clock marks every step; Window.wall_s / steps",
                "profiler": "the bare loop under torch.profiler.profile(activities=[CPU], profile_memory=False), "
                            "timed inside the profiler context; start+stop timed apart",
            },
            "shared": "model, optimizer and dataset objects are shared by all arms; bare and profiler use their own "
                      "DataLoader with autotune's settings (batch_size, shuffle with a seeded generator, drop_last, no workers)",
            "window": "fresh loader iterator, warm-up steps, then measured steps, within one epoch",
            "order": "one window per arm per round; round orders cycle through all six (each followed by its "
                     "reverse), so every arm takes every position equally often; round 0 is a dropped warm-up round",
            "step_time": "median over rounds of window wall time / steps",
            "overhead": "paired_ratio(bare, arm) - 1: geometric mean of per-round t_arm / t_bare, 95% Student-t interval",
            "fraction_bounds": "from the two overheads' 95% intervals (conservative)",
            "window_cpu": "process CPU time of each whole window call (warm-up included; profiler: start+stop included)",
            "added_cost_per_step": "median paired difference of thread CPU time, autotune step minus bare step, "
                                   "alternated step by step on a near-empty step; share = added / workload's bare step",
        },
        "added_cost_per_step": added,
        "workloads": results,
        "total_s": time.perf_counter() - t0,
    }


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="FILE", help="write the full results as JSON")
    p.add_argument("--md", metavar="FILE", help="write the Markdown table (default: print it to stdout)")
    p.add_argument("--rounds", type=int, help=f"counted rounds per workload (default {DEFAULT_ROUNDS}; --quick {QUICK_ROUNDS})")
    p.add_argument("--quick", action="store_true", help="a tiny smoke run: small workloads, few steps, 2 rounds")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads for every arm (default 1: least noise)")
    p.add_argument("--workload", action="append", metavar="TARGET[@WARMUP,STEPS]",
                   help="a workload target instead of the defaults (repeatable), e.g. examples/overhead_bound.py:small@3,40")
    p.add_argument("--quiet", action="store_true", help="no per-round progress on stderr")
    return p.parse_args(argv)


def _targets(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    if not args.workload:
        return list(QUICK_RUNS if args.quick else DEFAULT_RUNS)
    out = []
    for spec in args.workload:
        target, _, plan = spec.partition("@")
        warmup, steps = (QUICK_RUNS if args.quick else DEFAULT_RUNS)[0][1:]
        if plan:
            try:
                warmup, steps = (int(x) for x in plan.split(","))
            except ValueError:
                raise UserError(f"--workload {spec!r}: write TARGET@WARMUP,STEPS with two integers, e.g. x.py@3,40.") from None
        if warmup < 0 or steps < 1:
            raise UserError(f"--workload {spec!r}: warm-up must be >= 0 and steps >= 1.")
        out.append((target, warmup, steps))
    return out


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parse(argv)
        rounds = args.rounds if args.rounds is not None else (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
        if rounds < 2:
            raise UserError(f"--rounds {rounds}: give at least 2, so the paired rounds give an interval.")
        if args.threads < 1:
            raise UserError(f"--threads {args.threads}: give at least 1.")
        for flag in ("json", "md"):
            path = getattr(args, flag)
            if path and not Path(path).resolve().parent.is_dir():
                raise UserError(f"--{flag} {path!r}: its folder does not exist; give a path in an existing folder.")
        log = (lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr, flush=True))
        report = run(_targets(args), rounds, args.threads, pairs=QUICK_PAIRS if args.quick else DEFAULT_PAIRS, log=log)
    except (UserError, UserCodeError, KeyboardInterrupt) as exc:
        print(explain(exc, whose="a workload's own code"), file=sys.stderr)
        return exit_code(exc)
    md = to_markdown(report)
    emit(md, lambda: json.dumps(report, indent=2, allow_nan=False) + "\n", args.json, args.md)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
