"""`python -m benchmarks`: the benchmark suite (see `benchmarks.suite`)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from autotune.errors import EXIT_OK, UserCodeError, UserError, exit_code, explain

from benchmarks import anytime, grids, suite
from benchmarks.cases import CASES, HELDOUT, SETS, for_machine, of_set, select
from benchmarks.table import emit, to_markdown

PROG = "python -m benchmarks"
RESULTS = "bench-results"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG, description=suite.__doc__.split("\n\n")[0],
        epilog=f"examples:\n  {PROG}                      # writes bench-results/bench.{{json,md}}\n"
               f"  {PROG} --quick --examples input_bound,compute_bound\n"
               f"  {PROG} --set heldout --measure-grid --grids-only   # measure the held-out grids",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny workloads and grids, 2 windows per config")
    p.add_argument("--out", metavar="DIR", default=RESULTS,
                   help=f"folder for the JSON, Markdown and SVG results (default {RESULTS}/, ignored by git)")
    p.add_argument("--json", metavar="FILE", help="write the full results as JSON here (default DIR/bench.json)")
    p.add_argument("--md", metavar="FILE", help="write the Markdown tables here (default DIR/bench.md)")
    p.add_argument("--set", choices=SETS, default="bundled",
                   help="which workloads: the bundled examples (default), the held-out ones in benchmarks/heldout/ "
                        f"({', '.join(c.name for c in HELDOUT)}: scored apart, no rule is tuned on them), or all")
    p.add_argument("--examples", metavar="A,B", help=f"only these examples of the set (default all: bundled "
                   f"{', '.join(c.name for c in CASES)})")
    p.add_argument("--seed", type=int, default=0, help="sampler seed for blind Optuna and autotune (default 0)")
    p.add_argument("--no-extras", action="store_true", help="skip the false-acceptance runs and the overhead benchmark")
    p.add_argument("--no-overhead", action="store_true", help="skip the overhead benchmark only "
                   "(python -m benchmarks.overhead runs it on its own)")
    p.add_argument("--measure-grid", action="store_true",
                   help="measure every config of each example's grid again and rewrite "
                        "benchmarks/grids/<machine>/<example>.json (otherwise this machine's stored grid is read, and refused when measured on another machine)")
    p.add_argument("--grids-only", action="store_true", help="with --measure-grid: measure and store the grids, then stop")
    p.add_argument("--grid-dir", metavar="DIR",
                   help="read and write stored grids here (default benchmarks/grids/<machine>/, a folder per CPU model, vector units and core count)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    started, load_start = datetime.now(timezone.utc).isoformat(timespec="seconds"), grids.load_avg()
    if not args.json and not args.md:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        args.json, args.md = str(Path(args.out) / "bench.json"), str(Path(args.out) / "bench.md")
    t0 = time.perf_counter()
    log = (lambda s: None) if args.quiet else (lambda s: print(f"[{time.perf_counter() - t0:7.1f}s] {s}", file=sys.stderr, flush=True))
    try:
        cases = for_machine(select(of_set(args.set, args.quick), args.examples), torch.device("cpu"))
        for flag in ("json", "md"):
            path = getattr(args, flag)
            if path and not Path(path).resolve().parent.is_dir():
                raise UserError(f"--{flag} {path!r}: its folder does not exist; give a path in an existing folder.")
        folder = Path(args.grid_dir) if args.grid_dir else None
        if args.grids_only:
            if not args.measure_grid:
                raise UserError("--grids-only measures the grids and stops; add --measure-grid.")
            protocol = suite.QUICK_PROTOCOL if args.quick else suite.PROTOCOL
            for where in grids.measure_all(cases, protocol, torch.device("cpu"), log, folder):
                log(f"stored {where}")
            return EXIT_OK
        report = suite.run(cases, quick=args.quick, seed=args.seed, extras=not args.no_extras, log=log,
                           measure_grid=args.measure_grid, grid_dir=folder, overhead=not args.no_overhead)
    except (UserError, UserCodeError, KeyboardInterrupt) as exc:
        print(explain(exc, whose="an example's own code"), file=sys.stderr)
        return exit_code(exc)
    report["command"] = " ".join([PROG, *(argv if argv is not None else sys.argv[1:])])
    report["provenance"] = grids.provenance(started, load_start, 0)  # the autotune commit, host, dates, load
    if args.md:  # the anytime curves drawn next to the Markdown, which links them
        svg = Path(args.md).with_name(Path(args.md).stem + "-anytime.svg")
        svg.write_text(anytime.svg(report["cases"]))
        report["svg"] = svg.name
    md = to_markdown(report)
    emit(md, lambda: json.dumps(report, indent=2, default=str) + "\n", args.json, args.md)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
