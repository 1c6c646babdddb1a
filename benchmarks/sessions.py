"""A grid's sessions: each reads every config of a case once, in a process of its own.

A config's throughput varies between processes (placement) more than between the windows
of one, so a stored grid reads each config in several sessions (`grids.SESSIONS`). A
session is one fresh process, `python -m benchmarks.sessions SPEC OUT`, that measures the
configs it is given one after the other in itself (`Runner(isolate=False)`, as the suite's
judge measures) and appends one JSON line per reading to OUT. A config that kills its
session (a crash, the OOM killer) or hangs past `TIMEOUT_S` is read as failed with that
reason, and a fresh process goes on with the configs after it. A case whose memory is
judged (`Case.isolate`) reads every config in a process of its own instead: in one process
the profiler's peak-memory figure creeps up with every measurement.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import torch

from autotune.config import TrainConfig
from autotune.errors import TrialFailed
from autotune.measure import Protocol
from autotune.runner import Runner
from autotune.search import Constraints

from benchmarks.cases import Case, of_set

Log = Callable[[str], None]
TIMEOUT_S = 300.0  # one reading may take this long (the Runner's trial timeout) before its session is killed
ROOT = Path(__file__).resolve().parents[1]


def load_avg() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def measure_row(runner: Runner, config: TrainConfig, constraints: Constraints) -> dict[str, Any]:
    """One reading of one config under the protocol, with everything a stored session keeps."""
    started, load, t0 = datetime.now(timezone.utc).isoformat(timespec="seconds"), load_avg(), time.perf_counter()
    row: dict[str, Any] = {"config": config.flat(), "changes": TrainConfig().diff(config), "started": started,
                           "load_avg": load}
    try:
        s = runner.measure(config)
    except TrialFailed as exc:
        return failed(row, f"{exc.kind.value}: {exc.reason}", time.perf_counter() - t0)
    problem = constraints.check(s)
    return {**row, "samples_per_s": 0.0 if problem else s.samples_per_s, "measured_samples_per_s": s.samples_per_s,
            "windows_samples_per_s": s.windows_samples_per_s, "window_cv": s.window_cv, "feasible": problem is None,
            "reason": problem, "wall_s": time.perf_counter() - t0, "peak_memory_bytes": s.peak_memory_bytes,
            "first_losses": s.first_losses}


def failed(row: dict[str, Any], reason: str, wall_s: float) -> dict[str, Any]:
    return {**row, "samples_per_s": 0.0, "measured_samples_per_s": None, "windows_samples_per_s": [],
            "window_cv": None, "feasible": False, "reason": reason, "wall_s": wall_s, "peak_memory_bytes": None,
            "first_losses": []}


def in_processes(case: Case, runner: Runner, configs: list[TrainConfig], constraints: Constraints,
                 log: Log) -> list[dict[str, Any]]:
    """One session in `runner`'s processes (one per reading when it isolates)."""
    return [_logged(measure_row(runner, c, constraints), log) for c in configs]


def in_one_process(case: Case, protocol: Protocol, device: torch.device, configs: list[TrainConfig],
                   constraints: Constraints, log: Log, command: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """One session in a fresh process of its own (`command`, by default `python -m
    benchmarks.sessions`, given SPEC and OUT), and another after a config that killed or
    hung it, for the configs after that one."""
    command = command or (sys.executable, "-m", "benchmarks.sessions")
    out: list[dict[str, Any]] = []
    while len(out) < len(configs):
        left = configs[len(out):]
        with tempfile.TemporaryDirectory() as tmp:
            spec, lines = Path(tmp) / "spec.json", Path(tmp) / "readings.jsonl"
            spec.write_text(json.dumps({"case": case.name, "set": case.set, "quick": case.quick,
                                        "protocol": asdict(protocol), "device": device.type,
                                        "memory_limit": constraints.memory_limit,
                                        "reference_losses": constraints.reference_losses,
                                        "configs": [c.flat() for c in left]}))
            lines.touch()
            with open(Path(tmp) / "stderr", "wb") as err:
                proc = subprocess.Popen([*command, str(spec), str(lines)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                        stderr=err, start_new_session=True)
            got, last, why = 0, time.monotonic(), None
            try:
                while True:
                    done = proc.poll() is not None  # before reading: a finished process has written every line
                    rows = [json.loads(x) for x in lines.read_text().splitlines() if x.strip()]
                    out += [_logged(r, log) for r in rows[got:]]
                    if len(rows) > got:
                        got, last = len(rows), time.monotonic()
                    if done:
                        if got < len(left):
                            tail = (Path(tmp) / "stderr").read_text(errors="replace").strip().splitlines()
                            why = (f"crash: the session process exited with code {proc.returncode}"
                                   + (f" ({tail[-1][:300]})" if tail else ""))
                        break
                    if time.monotonic() - last > TIMEOUT_S:
                        why = f"timeout: no reading within {TIMEOUT_S:.0f} s; the session process was killed"
                        break
                    time.sleep(0.2)
            finally:
                if proc.poll() is None:  # its loader workers too: they share its process group
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            if why is not None and len(out) < len(configs):
                c = configs[len(out)]
                row = {"config": c.flat(), "changes": TrainConfig().diff(c),
                       "started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "load_avg": load_avg()}
                out.append(_logged(failed(row, why, time.monotonic() - last), log))
    return out


def _logged(row: dict[str, Any], log: Log) -> dict[str, Any]:
    load = row["load_avg"][0] if row.get("load_avg") else "n/a"
    log(f"    {TrainConfig().with_changes(row['config']).short()}: {row['samples_per_s']:.0f} samples/s "
        f"({row['wall_s']:.1f} s, load {load})" + ("" if row["feasible"] else f" (infeasible: {row['reason']})"))
    return row


def main(argv: list[str]) -> int:
    """`python -m benchmarks.sessions SPEC OUT`: read SPEC's configs here, a JSON line each to OUT."""
    spec = json.loads(Path(argv[0]).read_text())
    case = next(c for c in of_set("all", spec["quick"]) if c.name == spec["case"] and c.set == spec["set"])
    runner = Runner(case.workload(), None, torch.device(spec["device"]), Protocol(**spec["protocol"]), isolate=False)
    constraints = Constraints(spec["memory_limit"], spec["reference_losses"])
    default = TrainConfig()
    with open(argv[1], "a") as out:
        for flat in spec["configs"]:
            config = default.with_changes(flat)
            row = measure_row(runner, config, constraints)
            if not constraints.reference_losses and config == default:
                constraints = Constraints(spec["memory_limit"], row["first_losses"])
            out.write(json.dumps(row, default=str) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
