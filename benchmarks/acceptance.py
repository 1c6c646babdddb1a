"""The acceptance rule's error rates where the truth is known: `python -m benchmarks.acceptance`.

The agent runs for real on `FakeRunner`, whose noise has the structure measured here: each
window off by `noise`, and each session (a measurement, one side of a comparison) off by
its own `session` offset that pairing inside one comparison cannot cancel (the 110 A/As of
the stored AMD EPYC runs: a look's mean log ratio varied 0.0045, 0.0023 of it from its own
windows). Three recipes are searched (the optimizer implementation, threads, compile); only
the fused optimizer changes the true speed, by `gain`. Every other change kept is a false
acceptance, and a `gain` of 1 makes every candidate a placebo.

Each scenario reports the false acceptances over the comparisons decided and, where there
is a gain, in how many runs it was kept: the rule's honesty and its power, side by side, so
a change to `autotune.decide` is measured rather than argued. A run takes ~2 s (2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import optuna

from autotune import machine
from autotune.agent import Agent, Settings
from autotune.recipes import load_recipes
from autotune.testing import FakeRunner

PROG = "python -m benchmarks.acceptance"
RECIPES = ("optimizer-impl", "threads", "compile")
STAGES = {"data": 0.0, "forward": 0.4, "backward": 0.4, "optimizer": 0.2}


@dataclass(frozen=True)
class Scenario:
    name: str
    gain: float  # the fused optimizer's true speedup; 1.0: every candidate is a placebo
    noise: float  # each window's relative error
    session: float  # each session's relative offset

    def runner(self, seed: int) -> FakeRunner:
        gain = self.gain
        return FakeRunner(lambda c: 100.0 * (gain if c.optimizer.impl == "fused" else 1.0), noise=self.noise,
                          seed=seed, drift=0.002, session=self.session, stages=lambda c: STAGES)


SCENARIOS = (
    Scenario("placebo, windows dominate", 1.0, 0.08, 0.04),
    Scenario("placebo, sessions dominate", 1.0, 0.05, 0.06),
    Scenario("a 1.08x gain", 1.08, 0.08, 0.04),
    Scenario("a 1.15x gain", 1.15, 0.08, 0.04),
)


def run_one(scenario: Scenario, seed: int) -> dict[str, Any]:
    """One agent run: the comparisons it decided, the gain kept or not, the false changes kept."""
    cores = machine.cores
    machine.cores = lambda: 2  # the search spaces of this project's 2-core machines, wherever it runs
    try:
        with tempfile.TemporaryDirectory() as tmp:
            storage = optuna.storages.RDBStorage(f"sqlite:///{tmp}/study.db")
            rep = Agent(scenario.runner(seed), load_recipes(), storage, "acceptance", Settings(seed=seed, only=RECIPES),
                        {"conv": False, "checkpoint_blocks": False}).run()
    finally:
        machine.cores = cores
    out = {"decided": 0, "kept": False, "false": []}
    for s in rep.steps:
        out["decided"] += s.speedup is not None
        if s.accepted:
            if scenario.gain != 1.0 and s.changes.get("optimizer.impl", [None, None])[1] == "fused":
                out["kept"] = True
            else:
                out["false"].append({"changes": s.changes, "reason": s.reason})
    return out


def run(runs: int, scenarios: tuple[Scenario, ...] = SCENARIOS, log=lambda s: None) -> dict[str, Any]:
    t0 = time.perf_counter()
    rows = []
    for sc in scenarios:
        got = [run_one(sc, seed) for seed in range(runs)]
        row = {"scenario": sc.name, "gain": sc.gain, "noise": sc.noise, "session": sc.session, "runs": runs,
               "decided": sum(g["decided"] for g in got), "false": sum(len(g["false"]) for g in got),
               "kept": sum(g["kept"] for g in got) if sc.gain != 1.0 else None,
               "false_changes": [f for g in got for f in g["false"]]}
        log(f"{sc.name}: false {row['false']} of {row['decided']} decided"
            + (f"; gain kept in {row['kept']} of {runs} runs" if row["kept"] is not None else ""))
        rows.append(row)
    return {"runs": runs, "recipes": list(RECIPES), "scenarios": rows, "wall_s": time.perf_counter() - t0}


def to_markdown(report: dict[str, Any]) -> str:
    lines = ["| scenario | windows | sessions | false acceptances | gain kept |", "|---|---|---|---|---|"]
    for r in report["scenarios"]:
        kept = f"{r['kept']} of {r['runs']} runs" if r["kept"] is not None else "-"
        lines.append(f"| {r['scenario']} | {r['noise']:.0%} | {r['session']:.0%} | {r['false']} of {r['decided']} "
                     f"comparisons | {kept} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=60, help="agent runs per scenario (default 60, ~2 s each)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    args = p.parse_args(argv)
    if args.runs < 1:
        print(f"{PROG}: --runs {args.runs}: give at least 1.", file=sys.stderr)
        return 2
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    report = run(args.runs, log=lambda s: print(s, file=sys.stderr, flush=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
    print(to_markdown(report), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
