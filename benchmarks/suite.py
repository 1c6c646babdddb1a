"""The benchmark suite: autotune against ground truth on the planted-bottleneck examples.

    python -m benchmarks [--quick] [--json FILE] [--md FILE] [--examples a,b]

For each example (`cases.CASES`), on the machine it runs on, in one process, one after
the other (never two measurements at once), under one `Protocol`:

1. The grid: every config of the case's stated grid, measured; the best is the oracle.
2. The default config (its grid measurement); the rule of thumb (`cases.RULE`); blind
   Optuna (TPE over the grid's knobs, no diagnosis, as many trials as autotune used);
   autotune's `Agent`, with its diagnosis, restricted to the recipes whose knobs the grid
   covers so that every method tunes the same knobs (its ranges may reach past the grid's).
3. The configs they chose, re-measured in turns (`methods.judge`): every throughput and
   ratio in the tables comes from this fresh, interleaved measurement, with a paired 95%
   interval; the oracle's own figure is re-measured too, so it carries no winner's curse.
4. The planted class against the class autotune diagnosed.

Then false acceptances (`placebo`) and the overhead benchmark (`overhead`). Measurements
run in this process (`Runner(isolate=False)`): a process per trial costs 2-3 s of start-up
(importing torch) and the suite measures about 150 configs; the examples cannot crash or
hang, and each measurement builds a fresh model, optimizer and loader from the seed. The
exception is a case with a memory limit (`Case.isolate`): in one process the profiler's
peak-memory figure creeps up with every measurement, so each runs in its own process.
Targets are reported with the measured figure, never asserted.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from autotune.agent import MIN_GAIN, Settings
from autotune.config import TrainConfig
from autotune.machine import cores, cpu_name
from autotune.measure import Protocol
from autotune.recipes import Recipe, load_recipes
from autotune.record import Summary
from autotune.runner import Runner
from autotune.search import Constraints
from autotune.workload import facts

from benchmarks.cases import CASES, QUICK_CASES, QUICK_RULE, RULE, Case, RuleOfThumb
from benchmarks.methods import judge, ratio, run_agent, run_blind, run_grid, run_single
from benchmarks.placebo import false_acceptances

PROTOCOL = Protocol()  # autotune's standard protocol, for every measurement of the full suite
QUICK_PROTOCOL = Protocol(warmup_steps=1, steps=3, windows=2, profile_steps=1)
AGENT_TRIALS = 40  # `autotune tune`'s default; the agent stops earlier when its recipes run out
QUICK_AGENT_TRIALS = 4
PLACEBO_CASE, PLACEBO_RUNS, QUICK_PLACEBO_RUNS = "compute_bound", 4, 1
TARGET_ORACLE = 0.95
TARGET_SHARE = 0.25  # of the grid's trials and of its wall time
TIME_LIMIT_S = 30 * 60
METHODS = ("oracle", "default", "rule_of_thumb", "blind_optuna", "autotune")

Log = Callable[[str], None]

METHOD = {
    "oracle": "every config of the case's grid measured under the protocol; the fastest feasible one",
    "default": "TrainConfig(): its measurement in the grid",
    "rule_of_thumb": "cases.RuleOfThumb on this device, measured once",
    "blind_optuna": "Optuna TPESampler(seed, n_startup_trials=4) over the grid's knobs, the default enqueued first, "
                    "in-memory storage, as many trials as autotune used (at least 1); repeats reuse their measurement",
    "autotune": "autotune.agent.Agent with Settings(trials=40, memory_limit, seed, only=recipes tuning a grid knob), "
                "in-memory Optuna storage; trials = its recipe trials; wall time includes baseline, A/A noise and "
                "interleaved acceptance comparisons",
    "judge": "the chosen configs re-measured together: one window of each per round, order reversed every round, "
             "as many rounds as the protocol has windows; throughput = samples / time over its windows; ratios are "
             "paired geometric means with 95% Student-t intervals (autotune.stats.paired_ratio). A config with "
             "persistent workers keeps prefetching for a moment after its window, into the next config's window",
    "infeasible": "over the memory limit, out of memory, crashed, or loss off the default's by more than 25%: "
                  "throughput 0, and not re-measured",
    "targets": "reported with the measured figure, never asserted; 'not below' = the 95% interval reaches 1, "
               "'better' = the interval is above 1",
}


def _load() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


class CountingRunner(Runner):
    """A `Runner` that counts full measurements and interleaved pairs (reset per method)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reset()

    def reset(self) -> None:
        self.measurements, self.pairs = 0, 0

    def measure(self, config: TrainConfig, trace: str | None = None, on_window=None) -> Summary:
        self.measurements += 1
        return super().measure(config, trace, on_window)

    def interleave(self, a: TrainConfig, b: TrainConfig, pairs: int, on_pair=None):
        self.pairs += pairs
        return super().interleave(a, b, pairs, on_pair)

    def count(self) -> dict[str, int]:
        return {"measurements": self.measurements, "interleaved_pairs": self.pairs}


def grid_recipes(case: Case, recipes: list[Recipe], device: torch.device, batch: int) -> tuple[str, ...]:
    """The recipes that tune at least one of the grid's knobs on this device."""
    return tuple(r.name for r in recipes if set(r.space(device.type, cores(), batch)) & set(case.grid))


def run_case(case: Case, rule: RuleOfThumb, protocol: Protocol, device: torch.device, seed: int,
             log: Log) -> dict[str, Any]:
    t0 = time.perf_counter()
    load_before = _load()
    wl = case.workload()
    runner = CountingRunner(wl, case.spec if case.isolate else None, device, protocol, isolate=case.isolate)
    configs = case.configs()
    log(f"{case.name}: grid of {len(configs)} configs")
    grid = run_grid(runner, configs, case.memory_limit, log)
    grid["count"] = runner.count()
    constraints = Constraints(case.memory_limit, grid["reference_losses"])
    default_row = grid["rows"][0]

    runner.reset()
    rule_cfg, rule_notes = rule.config(device)
    log(f"{case.name}: rule of thumb {rule_cfg.short()}")
    rule_res = run_single(runner, rule_cfg, constraints)
    rule_res["notes"] = rule_notes

    runner.reset()
    recipes = load_recipes()
    only = grid_recipes(case, recipes, device, wl.batch_size)
    log(f"{case.name}: autotune (recipes {', '.join(only)})")
    settings = Settings(trials=QUICK_AGENT_TRIALS if case.quick else AGENT_TRIALS, memory_limit=case.memory_limit,
                        seed=seed, only=only)
    rep, agent_wall_s = run_agent(runner, recipes, facts(wl), settings, log, study=case.name)
    agent_count = runner.count()
    used = rep.budget.trials_used if rep.budget else 0

    runner.reset()
    log(f"{case.name}: blind Optuna, {used} trials")
    blind = run_blind(runner, case.grid, used, seed, constraints, log)
    blind["count"] = runner.count()

    final_cfg = TrainConfig().with_changes(rep.final_config or {})
    final_peak = (rep.final.peak_memory_bytes if rep.final else None) or 0
    chosen = {
        "oracle": TrainConfig().with_changes(grid["best_config"]),
        "default": TrainConfig(),
        "rule_of_thumb": rule_cfg,
        "blind_optuna": TrainConfig().with_changes(blind["best_config"]),
        "autotune": final_cfg,
    }
    infeasible = {label for label, ok in (
        ("oracle", grid["rows"][grid["best_index"]]["feasible"]), ("default", default_row["feasible"]),
        ("rule_of_thumb", rule_res["feasible"]), ("blind_optuna", blind["samples_per_s"] > 0),
        ("autotune", not (case.memory_limit and final_peak > case.memory_limit))) if not ok}
    log(f"{case.name}: judging {len({tuple(c.flat().items()) for c in chosen.values()})} distinct configs in turns")
    judged = judge(runner, chosen, infeasible, log)
    diagnosed = rep.initial_diagnosis  # the agent always diagnoses its baseline before it returns

    search = {"oracle": grid["best_samples_per_s"], "default": default_row["samples_per_s"],
              "rule_of_thumb": rule_res["samples_per_s"], "blind_optuna": blind["samples_per_s"],
              "autotune": rep.final.samples_per_s if rep.final else None}
    trials = {"oracle": grid["trials"], "default": 1, "rule_of_thumb": 1, "blind_optuna": blind["trials"], "autotune": used}
    walls = {"oracle": grid["wall_s"], "default": default_row["wall_s"], "rule_of_thumb": rule_res["wall_s"],
             "blind_optuna": blind["wall_s"], "autotune": agent_wall_s}
    methods = {}
    for m in METHODS:
        j = judged["labels"][m]
        methods[m] = {"samples_per_s": j["samples_per_s"], "ratio_to_oracle": ratio(judged, "oracle", m),
                      "search_samples_per_s": search[m], "trials": trials[m], "wall_s": walls[m],
                      "changes": TrainConfig().diff(chosen[m]), "feasible": m not in infeasible,
                      "judge_windows": j["windows"], "note": j.get("reason")}
    res = {
        **case.describe(), "workload": wl.name, "batch_size": wl.batch_size,
        "methods": methods,
        "diagnosis": {"planted": case.planted, "diagnosed": diagnosed.bottleneck.value,
                      "correct": diagnosed.bottleneck.value == case.planted, "reason": diagnosed.reason},
        "comparisons": {
            "autotune_vs_blind": ratio(judged, "blind_optuna", "autotune"),
            "autotune_vs_default": ratio(judged, "default", "autotune"),
            "autotune_vs_rule": ratio(judged, "rule_of_thumb", "autotune"),
            "rule_vs_oracle": ratio(judged, "oracle", "rule_of_thumb"),
        },
        "grid_results": {"rows": [{k: r[k] for k in ("changes", "samples_per_s", "measured_samples_per_s", "feasible", "reason",
                                             "wall_s", "peak_memory_bytes")} for r in grid["rows"]],
                 "count": grid["count"]},
        "rule_of_thumb": rule_res,
        "blind_optuna": {k: blind[k] for k in ("trials", "measured", "rows", "count")},
        "autotune": {"recipes": list(only), "count": agent_count, "stop_reason": rep.stop_reason,
                     "noise": _dump(rep.noise), "speedup": _dump(rep.speedup),
                     "steps": [st.model_dump(mode="json", include={"recipe", "bottleneck", "accepted", "changes", "speedup",
                                                                   "reason"}) | {"trials": len(st.trials)} for st in rep.steps],
                     "final_diagnosis": rep.diagnosis.bottleneck.value if rep.diagnosis else None},
        "judge_wall_s": judged["wall_s"], "wall_s": time.perf_counter() - t0,
        "runner": "a process per measurement (isolated)" if case.isolate else "in-process",
        "load_avg": {"before": load_before, "after": _load()},
    }
    res["targets"] = case_targets(res)
    log(f"{case.name}: done in {res['wall_s']:.0f} s")
    return res


def _dump(model: Any) -> dict[str, Any] | None:
    return None if model is None else model.model_dump(mode="json")


def _fmt(x: float | None, d: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{d}f}"


def case_targets(res: dict[str, Any]) -> dict[str, Any]:
    m, cmp = res["methods"], res["comparisons"]
    at, orc = m["autotune"], m["oracle"]
    r = at["ratio_to_oracle"]
    out: dict[str, Any] = {}
    out["oracle"] = {"target": f">= {TARGET_ORACLE} of the oracle", "measured": r["ratio"],
                     "met": r["ratio"] is not None and r["ratio"] >= TARGET_ORACLE}
    limit = TARGET_SHARE * orc["trials"]
    out["trials"] = {"target": f"<= {TARGET_SHARE:.0%} of the grid's {orc['trials']} trials ({limit:g})",
                     "measured": at["trials"], "met": at["trials"] <= limit}
    share = at["wall_s"] / orc["wall_s"] if orc["wall_s"] else None
    out["wall"] = {"target": f"<= {TARGET_SHARE:.0%} of the grid's wall time ({orc['wall_s']:.0f} s)",
                   "measured": share, "met": share is not None and share <= TARGET_SHARE}
    b = cmp["autotune_vs_blind"]
    out["not_below_blind"] = {"target": "autotune >= blind Optuna (95% interval of the ratio reaches 1 or above)",
                              "measured": b, "met": not_below(b)}
    out["better_than_blind"] = {"target": "autotune > blind Optuna (interval above 1)", "measured": b, "met": above(b)}
    d = cmp["autotune_vs_default"]
    out["not_below_default"] = {"target": "autotune never below the default (interval reaches 1 or above)",
                                "measured": d, "met": not_below(d)}
    rv, ar = cmp["rule_vs_oracle"], cmp["autotune_vs_rule"]
    wrong = not not_below(rv)
    out["beats_rule_where_wrong"] = {
        "target": "where the rule of thumb is wrong for this machine (significantly below the oracle, or over the "
                  "memory limit), autotune beats it", "rule_wrong": wrong, "rule_vs_oracle": rv, "measured": ar,
        "met": above(ar) if wrong else None}
    return out


def above(r: dict[str, Any]) -> bool:
    """B is better than A: the paired interval is above 1, or only B is feasible."""
    return bool(r.get("only_b_feasible")) or (r["low"] is not None and r["low"] > 1.0)


def not_below(r: dict[str, Any]) -> bool:
    """B is not significantly worse than A: the interval reaches 1, or only B is feasible."""
    return bool(r.get("only_b_feasible")) or (r["high"] is not None and r["high"] >= 1.0)


def suite_targets(cases: list[dict[str, Any]], placebo: dict[str, Any] | None, total_s: float, quick: bool) -> dict[str, Any]:
    def all_met(key: str) -> dict[str, Any]:
        rows = {c["name"]: c["targets"][key] for c in cases if c["targets"][key]["met"] is not None}
        missed = [f"{n} ({_brief(t['measured'])})" for n, t in rows.items() if not t["met"]]
        return {"met": not missed, "examples": len(rows), "missed": missed}

    better = [c["name"] for c in cases if c["targets"]["better_than_blind"]["met"]]
    out = {
        "oracle_every_example": all_met("oracle"),
        "trials_quarter_every_example": all_met("trials"),
        "wall_quarter_every_example": all_met("wall"),
        "not_below_blind_every_example": all_met("not_below_blind"),
        "better_than_blind_on_half": {"met": 2 * len(better) >= len(cases), "better_on": better, "examples": len(cases)},
        "not_below_default_every_example": all_met("not_below_default"),
        "beats_rule_where_wrong": all_met("beats_rule_where_wrong"),
        "diagnosis": {"correct": sum(c["diagnosis"]["correct"] for c in cases), "examples": len(cases),
                      "wrong": [f"{c['name']} (planted {c['diagnosis']['planted']}, diagnosed {c['diagnosis']['diagnosed']})"
                                for c in cases if not c["diagnosis"]["correct"]]},
    }
    if placebo is not None:
        out["no_false_acceptances"] = {"met": placebo["met"], "accepted": placebo["accepted"],
                                       "not_reproduced": placebo["not_reproduced"], "runs": len(placebo["runs"])}
    if not quick:
        out["under_30_minutes"] = {"met": total_s < TIME_LIMIT_S, "measured_s": total_s}
    return out


def _brief(x: Any) -> str:
    if isinstance(x, dict) and x.get("only_b_feasible"):
        return "only autotune's config fits"
    if isinstance(x, dict):
        return f"{_fmt(x.get('ratio'))} [{_fmt(x.get('low'))}, {_fmt(x.get('high'))}]"
    return _fmt(x) if isinstance(x, float) else str(x)


def overheads(quick: bool, log: Log) -> dict[str, Any]:
    """The overhead benchmark (benchmarks/overhead.py), run through its own command line."""
    import json

    from benchmarks import overhead

    log("overheads: python -m benchmarks.overhead" + (" --quick" if quick else ""))
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        j, md = Path(tmp) / "o.json", Path(tmp) / "o.md"
        argv = ["--quiet", "--json", str(j), "--md", str(md)] + (["--quick"] if quick else [])
        try:
            code = overhead.main(argv)
        except Exception as exc:  # noqa: BLE001 - a failing sibling benchmark must not lose the suite's results
            return {"error": f"{type(exc).__name__}: {exc}", "wall_s": time.perf_counter() - t0}
        if code != 0 or not j.exists():
            return {"error": f"benchmarks.overhead exited with code {code}", "wall_s": time.perf_counter() - t0}
        report, table = json.loads(j.read_text()), md.read_text()
    rows = []
    for w in report.get("workloads", []):
        ao, fr = w.get("autotune_overhead") or {}, w.get("stage_timer_vs_profiler") or {}
        po = w.get("profiler_overhead") or {}
        rows.append({"workload": w.get("workload"), "step_time_s": w.get("step_time_s"),
                     "instrumented_vs_bare": None if ao.get("overhead") is None else 1 + ao["overhead"],
                     "instrumented_ci": [None if x is None else 1 + x for x in ao.get("ci", [None, None])],
                     "profiler_vs_bare": None if po.get("overhead") is None else 1 + po["overhead"],
                     "stage_timers_vs_profiler_cost": fr.get("fraction"), "targets": w.get("targets")})
    return {"summary": rows, "markdown": table, "report": report, "wall_s": time.perf_counter() - t0}


def run(cases: list[Case], quick: bool = False, seed: int = 0, device: str = "cpu", extras: bool = True,
        log: Log = lambda s: None) -> dict[str, Any]:
    t0 = time.perf_counter()
    dev = torch.device(device)
    protocol = QUICK_PROTOCOL if quick else PROTOCOL
    rule = QUICK_RULE if quick else RULE
    threads = torch.get_num_threads()
    results = []
    try:
        for case in cases:
            results.append(run_case(case, rule, protocol, dev, seed, log))
        placebo = None
        if extras:
            pcase = next(c for c in (QUICK_CASES if quick else CASES) if c.name == PLACEBO_CASE)
            placebo = false_acceptances(pcase, QUICK_PLACEBO_RUNS if quick else PLACEBO_RUNS, dev, protocol, log, seed)
    finally:
        torch.set_num_threads(threads)
    over = overheads(quick, log) if extras else None
    torch.set_num_threads(threads)
    total = time.perf_counter() - t0
    applied, notes = rule.config(dev)
    isolated = [c.name for c in cases if c.isolate]
    return {
        "benchmark": "suite", "quick": quick, "seed": seed,
        "environment": {"device": dev.type, "cpu": cpu_name(), "cores": cores(), "torch": torch.__version__,
                        "python": platform.python_version(), "default_threads": threads, "load_avg_end": _load()},
        "protocol": protocol.describe().model_dump(mode="json"),
        "runner": "in-process (Runner(isolate=False)), one measurement at a time"
                  + (f"; {', '.join(isolated)}: a process per measurement (memory is judged there)" if isolated else ""),
        "rule_of_thumb": {**rule.describe(), "applied": applied.short(), "notes": notes},
        "method": METHOD,
        "min_gain": MIN_GAIN, "agent_trials_limit": QUICK_AGENT_TRIALS if quick else AGENT_TRIALS,
        "cases": results, "false_acceptances": placebo, "overheads": over,
        "targets": suite_targets(results, placebo, total, quick),
        "command": None,
        "total_s": total,
    }
