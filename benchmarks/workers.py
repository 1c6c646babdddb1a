"""The same recipe search with 1 and with 2 workers, each worker pinned to one core.

    python -m benchmarks.workers [--example FILE[:FUNC]] [--recipe NAME] [--trials N]
                                 [--json FILE] [--md FILE] [--quick]

Both arms run the real CLI, `autotune tune TARGET --workers N --only RECIPE --trials N
--resume new`, one after the other (never at the same time), on fresh output folders and
SQLite storages. The one-worker arm runs under a one-core affinity (`os.sched_setaffinity`
before the run starts), so its single worker, like each of the two-worker arm's, has one
core, and both arms' measurements carry the same machine fingerprint. Reported: the whole
run's wall time, the search's wall time (from the first trial's start to the last one's
end, read back from the study), their ratios (1 worker over 2), the configs each arm chose
and whether they are the same. On a machine with two cores the ceiling is 2x for the
search; baseline, A/A noise and the interleaved comparisons are the coordinator's own and
run one at a time in both arms, so the whole run gains less.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

from autotune.machine import core_set, cpu_name

from benchmarks.table import emit

PROG = "python -m benchmarks.workers"
ROOT = Path(__file__).resolve().parents[1]


def _search_span(url: str, study: str) -> tuple[float, int]:
    """Seconds from the first trial's start to the last trial's end over the run's rounds, and trials."""
    from autotune.storage import open_storage

    storage = open_storage(url)
    starts, ends, n = [], [], 0
    for s in optuna.study.get_all_study_summaries(storage):
        if not s.study_name.startswith(study + "/"):
            continue
        for t in optuna.load_study(study_name=s.study_name, storage=storage).get_trials(deepcopy=False):
            if t.datetime_start and t.datetime_complete:
                starts.append(t.datetime_start.timestamp())
                ends.append(t.datetime_complete.timestamp())
                n += 1
    return (max(ends) - min(starts) if starts else 0.0), n


def run_arm(workers: int, target: str, recipe: str, trials: int, protocol: list[str], out: Path) -> dict[str, Any]:
    cores = core_set()[:1] if workers == 1 else core_set()
    cmd = [sys.executable, "-m", "autotune", "tune", target, "--out", str(out), "--workers", str(workers),
           "--only", recipe, "--trials", str(trials), "--resume", "new", *protocol]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                          preexec_fn=lambda: os.sched_setaffinity(0, cores))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    report = json.loads((out / "report.json").read_text())
    span, n = _search_span(f"sqlite:///{(out / 'study.db').resolve()}", report["study"]["name"])
    measured_by = sorted({(t["worker"]["pid"], tuple(t["worker"]["cores"])) for st in report["steps"]
                          for t in st["trials"] if t.get("worker")})
    return {"workers": workers, "cores": cores, "wall_s": wall, "search_s": span, "trials": n,
            "final_config": report["final_config"], "speedup": report["speedup"],
            "changes": {k: v for k, v in (report["recommendations"][0]["changes"] if report["recommendations"] else {}).items()},
            "measured_by": [{"pid": p, "cores": list(c)} for p, c in measured_by]}


def to_markdown(res: dict[str, Any]) -> str:
    one, two = res["arms"]
    lines = [f"# Workers: 1 against 2 ({res['machine']})", "",
             f"`{res['command']}`: `{res['target']}`, recipe `{res['recipe']}`, {res['trials_limit']} trials, "
             f"load average before {res['load_before']}", "",
             "| workers | cores per worker | trials | search wall s | whole run wall s | chosen changes | speedup |",
             "|---:|---:|---:|---:|---:|---|---:|"]
    for a in (one, two):
        sp = a["speedup"] or {}
        ch = ", ".join(f"{k}={v[1]}" for k, v in a["changes"].items()) or "none"
        lines.append(f"| {a['workers']} | 1 | {a['trials']} | {a['search_s']:.1f} | {a['wall_s']:.1f} | {ch} | "
                     f"{sp.get('ratio') or 0:.2f}x |")
    lines += ["", f"- search wall time, 1 worker over 2: **{res['search_ratio']:.2f}x** (ceiling 2x with two cores)",
              f"- whole run, 1 worker over 2: {res['wall_ratio']:.2f}x (baseline, A/A and comparisons stay serial)",
              f"- same chosen config: {'yes' if res['same_config'] else 'no'}" + _differences(one, two), ""]
    return "\n".join(lines)


def _differences(one: dict[str, Any], two: dict[str, Any]) -> str:
    a, b = one["final_config"], two["final_config"]
    keys = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return (" (they differ in " + ", ".join(f"`{k}`: {a.get(k)!r} with 1 worker, {b.get(k)!r} with 2" for k in keys)
            + ")") if keys else ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--example", default="examples/input_bound.py", help="target (default examples/input_bound.py)")
    p.add_argument("--recipe", default="dataloader", help="the one recipe searched (default dataloader)")
    p.add_argument("--trials", type=int, default=12, help="trials in the search (default 12)")
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny protocol and 3 trials")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--md", metavar="FILE")
    p.add_argument("--render", metavar="JSON", help="write the Markdown of an earlier run's JSON and exit")
    args = p.parse_args(argv)
    if args.render:
        emit(to_markdown(json.loads(Path(args.render).read_text())), lambda: "", None, args.md)
        return 0
    if len(core_set()) < 2:
        print(f"{PROG}: needs two cores; this process may use {len(core_set())}", file=sys.stderr)
        return 2
    protocol = ["--windows", "2", "--steps", "4", "--warmup", "1"] if args.quick else []
    trials = 3 if args.quick else args.trials
    load = [round(x, 2) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="autotune-workers-") as tmp:
        arms = [run_arm(n, args.example, args.recipe, trials, protocol, Path(tmp) / f"w{n}") for n in (1, 2)]
    one, two = arms
    res = {"command": " ".join([PROG, *(argv if argv is not None else sys.argv[1:])]), "target": args.example,
           "recipe": args.recipe, "trials_limit": trials, "machine": f"{cpu_name()}, {len(core_set())} cores",
           "load_before": load, "arms": arms,
           "search_ratio": one["search_s"] / two["search_s"] if two["search_s"] else None,
           "wall_ratio": one["wall_s"] / two["wall_s"],
           "same_config": one["final_config"] == two["final_config"]}
    emit(to_markdown(res), lambda: json.dumps(res, indent=2) + "\n", args.json, args.md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
