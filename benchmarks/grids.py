"""Stored grids: every config of a case's grid measured in several sessions, kept as data under `benchmarks/grids/`.

A grid takes tens of minutes to measure on two cores, so the suite reads it from
`benchmarks/grids/<machine>/<example>.json` (`machine_folder`: one folder per CPU model, vector units
and core count, so that grids measured on an AMD EPYC and on a Xeon with AMX both stay; a
`--grid-dir` is used as given) instead of measuring it on every run; `python -m benchmarks
--measure-grid` measures it again and rewrites the file. A stored grid holds every config's
readings from `SESSIONS` sessions, each a fresh process, the configs in turn and the order
reversed each session (samples/s, each window's throughput, peak memory, feasibility, wall
time, the 1-minute load average when it started), and its provenance: the autotune commit
(and whether autotune/ had uncommitted changes), the host, the date and the load average
at its start and end; and the machine (CPU model, vector units, cores, torch version), the
protocol and the grid's definition it was measured under. One measured elsewhere, under
another protocol, or for another grid definition is refused with a message that says what
differs and how to re-measure: a grid is ground truth only on the machine it was measured
on. Grids of format 1 (one in-process reading per config, no provenance) still read.

The stored figures rank the grid and feed blind TPE's and random search's lookups; the
suite's final figures come from re-measuring the grid's best few (`shortlist`: every config
whose interval reaches the best's) side by side with every method's choice
(`methods.judge`), never from this file alone.
"""

from __future__ import annotations

import hashlib
import json
import math
import platform
import re
import statistics
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

from autotune.config import TrainConfig
from autotune.errors import UserError
from autotune.machine import cores, cpu_isa, cpu_name
from autotune.measure import Protocol
from autotune.runner import Runner
from autotune.search import Constraints
from autotune.stats import t95

from benchmarks import sessions
from benchmarks.cases import Case

GRID_DIR = Path(__file__).resolve().parent / "grids"
REPO = Path(__file__).resolve().parents[1]
FORMAT = 2  # rows carry their sessions, the grid its provenance
FORMATS = (1, 2)  # format 1: one reading per config, no provenance (the grids measured before sessions)
# Readings per config, each in another session (process): a config's figure varies between
# processes (placement; 0.16 CV between identical processes here) more than between windows of
# one, so one session cannot say how far apart two configs must be to differ. Two is the fewest
# that shows that spread; pooled over a grid's configs it has as many degrees of freedom as the
# grid has configs.
SESSIONS = 2
Log = Callable[[str], None]


class GridRefused(UserError):
    """A stored grid that cannot stand for this run (another machine, protocol or grid)."""


load_avg = sessions.load_avg
measure_row = sessions.measure_row


def machine(device: torch.device) -> dict[str, Any]:
    """What a stored grid must have been measured on to count here."""
    return {"device": device.type, "cpu": cpu_name(), "isa": cpu_isa(), "cores": cores(), "torch": torch.__version__}


def definition(case: Case) -> dict[str, Any]:
    """What was measured: the example, its arguments, the grid and the memory limit."""
    return {"example": case.name, "target": case.target, "grid": case.grid, "memory_limit_bytes": case.memory_limit}


def key(config: TrainConfig | dict[str, Any]) -> str:
    """A config's identity in a stored grid: its flat form, sorted, as JSON. A stored config
    written before a knob existed stands for that knob at its default (it was measured so), and
    one written before the CUDA flags were tri-state holds false for unset (CPU grids never set them)."""
    flat = (config if isinstance(config, TrainConfig) else TrainConfig().with_changes(config)).flat()
    for flag in UNSET_WAS_FALSE:
        flat[flag] = flat[flag] or None
    return json.dumps(sorted(flat.items()), default=str)


UNSET_WAS_FALSE = ("precision.tf32", "backend.cudnn_benchmark")


def machine_folder(device: torch.device) -> Path:
    """This machine's folder of stored grids, e.g. `benchmarks/grids/amd-epyc-avx2-2c`: the CPU's
    model name and its widest units (one name covers CPUs as far apart as AVX2 and AVX512-BF16)."""
    name = (f"{cpu_name()} {cpu_isa()}" if device.type == "cpu" else
            f"{device.type}-{torch.cuda.get_device_name(device)}")
    slug = re.sub(r"[^a-z0-9]+", "-", re.sub(r"\((r|tm)\)", "", name.lower())).strip("-")
    return GRID_DIR / f"{slug or 'unknown'}-{cores()}c"


def path_for(case: Case, folder: Path | None = None, device: torch.device | None = None) -> Path:
    return (folder or machine_folder(device or torch.device("cpu"))) / f"{'quick_' if case.quick else ''}{case.name}.json"


def elsewhere(case: Case) -> list[str]:
    """The machines (folders) a grid of `case` is stored for."""
    name = path_for(case, GRID_DIR / "x").name
    return sorted(p.parent.name for p in GRID_DIR.glob(f"*/{name}"))


SESSION_KEYS = ("started", "load_avg", "samples_per_s", "measured_samples_per_s", "windows_samples_per_s",
                "window_cv", "feasible", "reason", "wall_s", "peak_memory_bytes")


def _gmean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def combine(readings: list[dict[str, Any]]) -> dict[str, Any]:
    """A config's stored row from its sessions' readings (`measure_row`): its figure is their
    geometric mean (0 when any session was infeasible); its wall time, windows and window CV
    are one reading's (the mean wall time, the first session's windows: what a search that
    measures it once pays), its load average the first session's; `sessions` keeps each
    reading."""
    first = readings[0]
    feasible = all(r["feasible"] for r in readings)
    measured = [r["measured_samples_per_s"] for r in readings]
    figure = _gmean(measured) if all(m for m in measured) else None
    peaks = [r["peak_memory_bytes"] for r in readings if r["peak_memory_bytes"] is not None]
    return {"config": first["config"], "changes": first["changes"], "started": first["started"],
            "load_avg": first["load_avg"], "samples_per_s": figure if feasible and figure else 0.0,
            "measured_samples_per_s": figure, "windows_samples_per_s": first["windows_samples_per_s"],
            "window_cv": first["window_cv"], "feasible": feasible,
            "reason": next((r["reason"] for r in readings if r["reason"]), None),
            "wall_s": statistics.fmean(r["wall_s"] for r in readings), "peak_memory_bytes": max(peaks, default=None),
            "first_losses": first["first_losses"],
            "sessions": [{"session": k, **{f: r[f] for f in SESSION_KEYS}} for k, r in enumerate(readings)]}


def provenance(started: str, load_start: list[float] | None, n_sessions: int, isolate: bool = False) -> dict[str, Any]:
    """Where and from what code a grid was measured: the autotune commit, whether autotune/
    had uncommitted changes (and a hash of them, to tell two such trees apart), the host,
    the dates and the load averages around it."""
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    dirty = git("status", "--porcelain", "--", "autotune")
    changes = hashlib.sha1(f"{dirty}\n{git('diff', 'HEAD', '--', 'autotune')}".encode()).hexdigest() if dirty else None
    return {"commit": git("rev-parse", "HEAD"), "autotune_dirty": None if dirty is None else bool(dirty),
            "autotune_changes_sha1": changes, "host": platform.node(), "started": started,
            "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "load_avg_start": load_start, "load_avg_end": load_avg(), "sessions": n_sessions,
            "session": ("a fresh process per reading (memory is judged)" if isolate else
                        "a fresh process reading every config in turn (benchmarks.sessions)")
                       + "; the order reversed every session"}


Session = Callable[[Case, Runner, Protocol, torch.device, list[TrainConfig], Constraints, Log], list[dict[str, Any]]]


def one_session(case: Case, runner: Runner, protocol: Protocol, device: torch.device, configs: list[TrainConfig],
                constraints: Constraints, log: Log) -> list[dict[str, Any]]:
    """Read `configs` in one session: a fresh process of its own (`sessions.in_one_process`),
    or a process per reading where memory is judged (`Case.isolate`, `runner` isolates)."""
    if case.isolate:
        return sessions.in_processes(case, runner, configs, constraints, log)
    return sessions.in_one_process(case, protocol, device, configs, constraints, log)


def measure(case: Case, runner: Runner, protocol: Protocol, device: torch.device, log: Log,
            n_sessions: int = SESSIONS, session: Session = one_session) -> dict[str, Any]:
    """Every config of the case's grid in `n_sessions` sessions, the configs one after the
    other, the default first in the first session (its losses are the divergence reference)
    and the order reversed each session, so drift of the machine spreads over every config's
    readings instead of tilting the grid."""
    t0 = time.perf_counter()
    started, load_start = datetime.now(timezone.utc).isoformat(timespec="seconds"), load_avg()
    configs = case.configs()
    readings: list[list[dict[str, Any]]] = [[] for _ in configs]
    constraints = Constraints(case.memory_limit, [])
    for k in range(n_sessions):
        order = list(range(len(configs)))[::-1 if k % 2 else 1]
        log(f"  grid {case.name}: session {k + 1}/{n_sessions}, {len(configs)} configs")
        got = session(case, runner, protocol, device, [configs[i] for i in order], constraints, log)
        for i, reading in zip(order, got):
            readings[i].append(reading)
        if k == 0:
            constraints = Constraints(case.memory_limit, readings[0][0]["first_losses"])
    return {"format": FORMAT, **definition(case), "machine": machine(device),
            "protocol": protocol.describe().model_dump(mode="json"),
            "date": started,
            "runner": f"{n_sessions} sessions per config, each a fresh process"
                      + (" per reading" if case.isolate else " reading the configs in turn"),
            "wall_s": time.perf_counter() - t0, "load_avg_end": load_avg(),
            "provenance": provenance(started, load_start, n_sessions, case.isolate),
            "rows": [combine(r) for r in readings]}


def _fix(case: Case, stored: dict[str, Any] | None = None) -> str:
    which = "" if case.set == "bundled" else f" --set {case.set}"
    when = f" (about {stored.get('wall_s', 0) / 60:.0f} min when it was measured)" if stored else ""
    return f"`python -m benchmarks{which} --measure-grid --examples {case.name}`{when}"


def check(stored: dict[str, Any], case: Case, protocol: Protocol, device: torch.device, where: Path) -> None:
    """Raise `GridRefused` naming every difference between the stored grid and this run."""
    fix = f"re-measure it on this machine with {_fix(case, stored)}"
    if stored.get("format") not in FORMATS:
        raise GridRefused(f"stored grid {str(where)!r} has format {stored.get('format')!r}, not one of "
                          f"{', '.join(map(str, FORMATS))}; {fix}.")
    diffs = []
    here = machine(device)
    for k, v in here.items():
        if stored["machine"].get(k) != v:
            diffs.append(f"{k}: stored {stored['machine'].get(k)!r}, here {v!r}")
    want = protocol.describe().model_dump(mode="json")
    for k, v in want.items():
        if stored["protocol"].get(k) != v:
            diffs.append(f"protocol {k}: stored {stored['protocol'].get(k)!r}, here {v!r}")
    for k, v in json.loads(json.dumps(definition(case), default=str)).items():
        if stored.get(k) != v:
            diffs.append(f"{k}: stored {stored.get(k)!r}, here {v!r}")
    if diffs:
        raise GridRefused(f"stored grid {str(where)!r} was not measured for this run ({'; '.join(diffs)}): its "
                          f"throughputs are not ground truth here; {fix}.")
    expected = {key(c) for c in case.configs()}
    have = {key(r["config"]) for r in stored["rows"]}
    if expected != have:
        raise GridRefused(f"stored grid {str(where)!r} holds {len(have)} configs, the grid defines {len(expected)} "
                          f"({len(expected - have)} missing); {fix}.")


def load(case: Case, protocol: Protocol, device: torch.device, folder: Path | None = None) -> dict[str, Any]:
    """The stored grid of `case`, checked against this machine, protocol and definition."""
    where = path_for(case, folder, device)
    if not where.is_file():
        others = elsewhere(case) if folder is None else []
        raise GridRefused(f"no stored grid for {case.name} at {str(where)!r}"
                          + (f" (grids of it are stored for other machines: {', '.join(others)})" if others else "")
                          + f"; measure it on this machine with {_fix(case)}.")
    try:
        stored = json.loads(where.read_text())
    except (OSError, ValueError) as exc:
        raise GridRefused(f"stored grid {str(where)!r} cannot be read ({exc}); measure it again with "
                          f"{_fix(case)}.") from None
    check(stored, case, protocol, device, where)
    return stored


def save(grid: dict[str, Any], case: Case, folder: Path | None = None, device: torch.device | None = None) -> Path:
    where = path_for(case, folder, device)
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = where.with_suffix(".tmp")
    tmp.write_text(json.dumps(grid, indent=1, default=str) + "\n")
    tmp.replace(where)
    return where


def summarize(grid: dict[str, Any], top: int) -> dict[str, Any]:
    """The grid's figures the suite uses: its size, wall time, best index, the `top`
    fastest feasible distinct configs, the `shortlist`'s rows, and the default's losses
    (the divergence reference)."""
    rows = grid["rows"]
    order = sorted(range(len(rows)), key=lambda i: -rows[i]["samples_per_s"])
    best = [i for i in order if rows[i]["feasible"]][:top]
    return {"trials": len(rows), "wall_s": sum(r["wall_s"] for r in rows), "best": best,
            "shortlist": shortlist(grid, top).rows, "reference_losses": rows[0]["first_losses"], "default": rows[0]}


@dataclass(frozen=True)
class Shortlist:
    """The configs that may be the grid's best, by their sessions' spread.

    Attributes:
        rows: Row indices, fastest first: every feasible config whose interval reaches the
            best's (its upper end at or above the best's lower end).
        intervals: Row index -> (low, high) samples/s, 95%, for every feasible row (empty
            for a grid without sessions).
        sd: The pooled standard deviation of log throughput between sessions of a config.
        dof: Its degrees of freedom (readings minus configs).
        basis: How the list was drawn, in words.
    """

    rows: list[int]
    intervals: dict[int, tuple[float, float]]
    sd: float | None
    dof: int
    basis: str


def readings(row: dict[str, Any]) -> list[float]:
    """A feasible row's throughput per session (format 1: its one reading); [] if infeasible."""
    if not row["feasible"]:
        return []
    xs = [s["measured_samples_per_s"] for s in row.get("sessions", [])] or [row["samples_per_s"]]
    return [x for x in xs if x and x > 0]


def shortlist(grid: dict[str, Any], fallback: int = 3) -> Shortlist:
    """Every config that the grid's sessions cannot tell from its best.

    Each feasible config's figure is the mean of its sessions' log throughputs; their spread
    about it, pooled over the grid's configs (one session spread for the machine, as the
    noise model has it), gives each config a 95% Student-t interval, mean +- t * sd / sqrt(n).
    The best is the highest mean; a config is kept when its interval reaches the best's. Two
    95% intervals of one width overlap unless the means differ by more than 2.77 standard
    errors of their difference: a config as fast as the best is dropped with a chance of
    about 0.6% (normal tails), one slower by less than that margin is kept. A grid without
    sessions (format 1: one reading a config) has no spread: its `fallback` fastest."""
    rows = grid["rows"]
    logs = {i: [math.log(x) for x in readings(r)] for i, r in enumerate(rows)}
    logs = {i: xs for i, xs in logs.items() if xs}
    if not logs:
        return Shortlist([], {}, None, 0, "no feasible config")
    means = {i: statistics.fmean(xs) for i, xs in logs.items()}
    order = sorted(means, key=lambda i: -means[i])
    dof = sum(len(xs) - 1 for xs in logs.values())
    if dof == 0:
        return Shortlist(order[:fallback], {}, None, 0,
                         f"the {fallback} fastest by the stored figure (one reading a config: no sessions' spread)")
    sd = math.sqrt(sum((x - means[i]) ** 2 for i, xs in logs.items() for x in xs) / dof)
    t = t95(dof)
    half = {i: t * sd / math.sqrt(len(xs)) for i, xs in logs.items()}
    intervals = {i: (math.exp(means[i] - half[i]), math.exp(means[i] + half[i])) for i in logs}
    best = order[0]
    keep = [i for i in order if intervals[i][1] >= intervals[best][0]]
    return Shortlist(keep, intervals, sd, dof,
                     f"every config whose 95% interval reaches the best's (session sd {sd:.3f} in log throughput, "
                     f"{dof} degrees of freedom)")


def obtain(case: Case, runner: Runner, protocol: Protocol, device: torch.device, remeasure: bool, log: Log,
           folder: Path | None = None) -> tuple[dict[str, Any], str]:
    """The case's grid: measured and written when `remeasure`, else the stored one."""
    if not remeasure:
        grid = load(case, protocol, device, folder)
        log(f"{case.name}: stored grid of {len(grid['rows'])} configs ({grid['date']}, {grid['wall_s'] / 60:.1f} min)")
        return grid, "stored"
    log(f"{case.name}: measuring the grid of {len(case.configs())} configs in {SESSIONS} sessions each")
    grid = measure(case, runner, protocol, device, log)
    where = save(grid, case, folder, device)
    log(f"{case.name}: grid written to {where} ({grid['wall_s'] / 60:.1f} min)")
    return grid, "measured"


def runner_for(case: Case, protocol: Protocol, device: torch.device) -> Runner:
    """The runner a case is measured with: in-process, or a process per measurement where
    memory is judged (`Case.isolate`)."""
    return Runner(case.workload(), case.spec if case.isolate else None, device, protocol, isolate=case.isolate)


def measure_all(cases: list[Case], protocol: Protocol, device: torch.device, log: Log,
                folder: Path | None = None) -> list[Path]:
    """`--measure-grid --grids-only`: measure and store the grids, nothing else."""
    threads = torch.get_num_threads()
    out = []
    try:
        for case in cases:
            obtain(case, runner_for(case, protocol, device), protocol, device, True, log, folder)
            out.append(path_for(case, folder, device))
            torch.set_num_threads(threads)
    finally:
        torch.set_num_threads(threads)
    return out
