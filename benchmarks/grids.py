"""Stored grids: every config of a case's grid measured once, kept as data under `benchmarks/grids/`.

A grid takes tens of minutes to measure on two cores, so the suite reads it from
`benchmarks/grids/<machine>/<example>.json` (`machine_folder`: one folder per CPU model, vector units
and core count, so that grids measured on an AMD EPYC and on a Xeon with AMX both stay; a
`--grid-dir` is used as given) instead of measuring it on every run; `python -m benchmarks
--measure-grid` measures it again and rewrites the file. A stored grid holds every config's measurement (samples/s, each
window's throughput, peak memory, feasibility, wall time, the 1-minute load average when
it started), and the machine (CPU model, vector units, cores, torch version), the protocol and the grid's
definition it was measured under. One measured elsewhere, under another protocol, or for
another grid definition is refused with a message that says what differs and how to
re-measure: a grid is ground truth only on the machine it was measured on.

The stored figures rank the grid and feed blind TPE's and random search's lookups; the
suite's final figures come from re-measuring the grid's best few side by side with every
method's choice (`methods.judge`), never from this file alone.
"""

from __future__ import annotations

import json
import os
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

from autotune.config import TrainConfig
from autotune.errors import TrialFailed, UserError
from autotune.machine import cores, cpu_isa, cpu_name
from autotune.measure import Protocol
from autotune.runner import Runner
from autotune.search import Constraints

from benchmarks.cases import Case

GRID_DIR = Path(__file__).resolve().parent / "grids"
FORMAT = 1
Log = Callable[[str], None]


class GridRefused(UserError):
    """A stored grid that cannot stand for this run (another machine, protocol or grid)."""


def load_avg() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def machine(device: torch.device) -> dict[str, Any]:
    """What a stored grid must have been measured on to count here."""
    return {"device": device.type, "cpu": cpu_name(), "isa": cpu_isa(), "cores": cores(), "torch": torch.__version__}


def definition(case: Case) -> dict[str, Any]:
    """What was measured: the example, its arguments, the grid and the memory limit."""
    return {"example": case.name, "target": case.target, "grid": case.grid, "memory_limit_bytes": case.memory_limit}


def key(config: TrainConfig | dict[str, Any]) -> str:
    """A config's identity in a stored grid: its flat form, sorted, as JSON. A stored config
    written before a knob existed stands for that knob at its default (it was measured so)."""
    flat = (config if isinstance(config, TrainConfig) else TrainConfig().with_changes(config)).flat()
    return json.dumps(sorted(flat.items()), default=str)


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


def measure_row(runner: Runner, config: TrainConfig, constraints: Constraints) -> dict[str, Any]:
    """One config under the protocol, with everything a stored row keeps."""
    started, load, t0 = datetime.now(timezone.utc).isoformat(timespec="seconds"), load_avg(), time.perf_counter()
    row: dict[str, Any] = {"config": config.flat(), "changes": TrainConfig().diff(config), "started": started,
                           "load_avg": load}
    try:
        s = runner.measure(config)
    except TrialFailed as exc:
        return {**row, "samples_per_s": 0.0, "measured_samples_per_s": None, "windows_samples_per_s": [],
                "window_cv": None, "feasible": False, "reason": f"{exc.kind.value}: {exc.reason}",
                "wall_s": time.perf_counter() - t0, "peak_memory_bytes": None, "first_losses": []}
    problem = constraints.check(s)
    return {**row, "samples_per_s": 0.0 if problem else s.samples_per_s, "measured_samples_per_s": s.samples_per_s,
            "windows_samples_per_s": s.windows_samples_per_s, "window_cv": s.window_cv, "feasible": problem is None,
            "reason": problem, "wall_s": time.perf_counter() - t0, "peak_memory_bytes": s.peak_memory_bytes,
            "first_losses": s.first_losses}


def measure(case: Case, runner: Runner, protocol: Protocol, device: torch.device, log: Log) -> dict[str, Any]:
    """Every config of the case's grid, one after the other, the default first (its losses
    are the divergence reference)."""
    t0 = time.perf_counter()
    configs = case.configs()
    rows: list[dict[str, Any]] = []
    constraints = Constraints(case.memory_limit, [])
    for i, cfg in enumerate(configs):
        row = measure_row(runner, cfg, constraints)
        if i == 0:
            constraints = Constraints(case.memory_limit, row["first_losses"])
        rows.append(row)
        log(f"  grid {case.name} {i + 1}/{len(configs)} {cfg.short()}: {row['samples_per_s']:.0f} samples/s "
            f"({row['wall_s']:.1f} s, load {row['load_avg'][0] if row['load_avg'] else 'n/a'})"
            + ("" if row["feasible"] else f" (infeasible: {row['reason']})"))
    return {"format": FORMAT, **definition(case), "machine": machine(device),
            "protocol": protocol.describe().model_dump(mode="json"),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "runner": "a process per measurement" if case.isolate else "in-process, one measurement at a time",
            "wall_s": time.perf_counter() - t0, "load_avg_end": load_avg(), "rows": rows}


def check(stored: dict[str, Any], case: Case, protocol: Protocol, device: torch.device, where: Path) -> None:
    """Raise `GridRefused` naming every difference between the stored grid and this run."""
    fix = (f"re-measure it on this machine with `python -m benchmarks --measure-grid --examples {case.name}` "
           f"(about {stored.get('wall_s', 0) / 60:.0f} min when it was measured)")
    if stored.get("format") != FORMAT:
        raise GridRefused(f"stored grid {str(where)!r} has format {stored.get('format')!r}, not {FORMAT}; {fix}.")
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
                          + f"; measure it on this machine with `python -m benchmarks --measure-grid --examples "
                            f"{case.name}`.")
    try:
        stored = json.loads(where.read_text())
    except (OSError, ValueError) as exc:
        raise GridRefused(f"stored grid {str(where)!r} cannot be read ({exc}); measure it again with "
                          f"`python -m benchmarks --measure-grid --examples {case.name}`.") from None
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
    fastest feasible distinct configs, and the default's losses (the divergence reference)."""
    rows = grid["rows"]
    order = sorted(range(len(rows)), key=lambda i: -rows[i]["samples_per_s"])
    best = [i for i in order if rows[i]["feasible"]][:top]
    return {"trials": len(rows), "wall_s": sum(r["wall_s"] for r in rows), "best": best,
            "reference_losses": rows[0]["first_losses"], "default": rows[0]}


def obtain(case: Case, runner: Runner, protocol: Protocol, device: torch.device, remeasure: bool, log: Log,
           folder: Path | None = None) -> tuple[dict[str, Any], str]:
    """The case's grid: measured and written when `remeasure`, else the stored one."""
    if not remeasure:
        grid = load(case, protocol, device, folder)
        log(f"{case.name}: stored grid of {len(grid['rows'])} configs ({grid['date']}, {grid['wall_s'] / 60:.1f} min)")
        return grid, "stored"
    log(f"{case.name}: measuring the grid of {len(case.configs())} configs")
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
