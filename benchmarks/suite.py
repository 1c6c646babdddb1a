"""The benchmark suite: autotune against ground truth on the planted and realistic examples.

    python -m benchmarks [--quick] [--json FILE] [--md FILE] [--examples a,b] [--measure-grid]

For each example (`cases.CASES`), on the machine it runs on, in one process, one after
the other (never two measurements at once), under one `Protocol`:

1. The grid: every config of the case's grid (every applicable recipe's knobs at a few
   values each, tens to a hundred-odd configs), read from its stored measurement
   (`grids`, `benchmarks/grids/<machine>/<example>.json`; `--measure-grid` measures it again).
2. The rule of thumb (`cases.RULE`), measured once; autotune's `Agent`, for real, with its
   diagnosis, restricted to the recipes whose knobs the grid covers so that every method
   tunes the same knobs (its ranges may reach past the grid's); blind TPE and random
   search over the grid's knobs with autotune's trial count, each trial looked up in the
   stored grid (`methods.search_stored`).
3. The grid's best few (`TOP`), the default and every method's choice, re-measured alike
   in blocks of fresh sessions (`methods.judge`): every throughput and ratio in the tables
   comes from this fresh, interleaved measurement, with a 95% interval over its sessions.
   The "grid's best" is the fastest of the re-measured top few on blocks of their own, and
   its figure comes from the other blocks, so neither the grid's search nor the pick among
   the few inflates it.
4. Anytime curves (`anytime`): best found against trials and wall time for autotune, blind
   TPE and random search; the planted class against the class autotune diagnosed.

Then false acceptances (`placebo`) and the overhead benchmark (`overhead`). Measurements
run in this process (`Runner(isolate=False)`), except a case with a memory limit
(`Case.isolate`): in one process the profiler's peak-memory figure creeps up with every
measurement, so each runs in its own process. Targets (`targets`) are reported with the
measured figure, never asserted.
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
from autotune.runner import Runner
from autotune.search import Constraints
from autotune.workload import facts

from benchmarks import anytime, grids
from benchmarks.cases import QUICK_RULE, RULE, Case, RuleOfThumb
from benchmarks.methods import LogEvents, Metered, fastest, judge, ratio, run_agent, run_single, search_stored
from benchmarks.placebo import QUICK_WORKLOADS, WORKLOADS, false_acceptances
from benchmarks.targets import TARGET_ORACLE, case_targets, suite_targets

PROTOCOL = Protocol()  # autotune's standard protocol, for every measurement of the full suite
QUICK_PROTOCOL = Protocol(warmup_steps=1, steps=3, windows=2, profile_steps=1)
AGENT_TRIALS = 40  # `autotune tune`'s default; the agent stops earlier when its recipes run out
QUICK_AGENT_TRIALS = 4
PLACEBO_RUNS, QUICK_PLACEBO_RUNS = 21, 3  # in turn over the input-, compute- and memory-shaped placebo workloads
PLACEBO_MODEL_RUNS, QUICK_PLACEBO_MODEL_RUNS = 150, 6  # FakeRunner runs per gain for the power
TOP = 3  # a grid without sessions: its fastest configs re-measured side by side
SHORTLIST_CAP, QUICK_SHORTLIST_CAP = 5, 2  # most of the grid's configs the judge re-measures (fastest first)
QUICK_JUDGE_LOOKS = (2, 2)  # --quick: a smoke test of the judge, not figures (the full suite: methods.JUDGE_LOOKS)
SEARCHES = ("blind_tpe", "random")
METHODS = ("oracle", "default", "rule_of_thumb", "blind_tpe", "random", "autotune")

Log = Callable[[str], None]

METHOD = {
    "grid": "every config of the case's grid measured once under the protocol (stored under benchmarks/grids/ with "
            "the machine, protocol, date and each row's load average); ranks the grid and serves the lookups",
    "oracle": "the fastest, re-measured side by side, of the grid's shortlist (every feasible config whose 95% "
              f"interval over its sessions reaches the best's, at most {SHORTLIST_CAP}, fastest first; a grid without "
              f"sessions: its {TOP} fastest): the 'grid's best', picked on the judge's selection rounds and measured "
              "on its held-out rounds; the other shortlisted configs are shown as grid_2, grid_3, ...",
    "default": "TrainConfig()",
    "rule_of_thumb": "cases.RuleOfThumb on this device, measured once (its feasibility), then judged",
    "blind_tpe": "Optuna TPESampler(seed, n_startup_trials=4) over the grid's knobs, the default enqueued first, "
                 "as many trials as autotune used (at least 1); each trial looked up in the stored grid, so its wall "
                 "time is the stored measurements' wall time; repeats reuse their figure and cost no time",
    "random": "Optuna RandomSampler(seed) over the grid's knobs, otherwise as blind_tpe",
    "autotune": "autotune.agent.Agent with Settings(trials=40, memory_limit, seed, only=recipes tuning a grid knob), "
                "in-memory Optuna storage, run for real; trials = its recipe trials; windows = every window it "
                "measured (baseline, A/As, trials, comparisons, duels; counted on its runner); wall time = the whole run",
    "cost": "per method: trials, windows and seconds. The grid: its configs, their stored windows and wall time; "
            "blind TPE and random search: the stored windows and wall time of the configs they looked up; the rule "
            "of thumb: its one measurement; autotune: everything it measured; the judge's own windows are nobody's",
    "judge": "every chosen config re-measured alike, in blocks: a figure block opens a fresh session of each and takes "
             "2 windows of each in turns (order reversed each round, rotated each block), one look of every ratio; "
             "after each, a pick block of the grid's best few alone, on which the grid's best is picked (never on "
             "the figures' windows or sessions: the winner's curse stays out of them). Blocks go on until every "
             "config's interval against every one of the grid's best few is within +-5%, between 6 and 16 figure "
             "blocks: a rule on widths alone, the same whichever config leads. Throughput = samples / time over the "
             "figure windows; ratios are the geometric mean over looks with a 95% Student-t interval over the spread "
             "between looks (autotune.stats.looks_ratio). A config with persistent workers keeps prefetching for a "
             "moment after its window, into the next config's window",
    "anytime": "best found so far against trials and wall time, every trial at the stored grid's figure of its "
               "config (autotune's trials outside the grid at their own measurement)",
    "infeasible": "over the memory limit, out of memory, crashed, or loss off the default's by more than 25%: "
                  "throughput 0, and not re-measured",
    "targets": "reported with the measured figure, never asserted; 'not below' = the 95% interval reaches 1, "
               "'better' = the interval is above 1; '>= 0.95 of the grid's best' is counted on the point estimate "
               "and on the interval's lower bound; the budget is <= 1/4 of the grid's windows and of its seconds",
}


def _load() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


class CountingRunner(Metered, Runner):
    """A `Runner` that counts windows, sessions, measurements and interleaved pairs (reset per method)."""


def grid_recipes(case: Case, recipes: list[Recipe], device: torch.device, batch: int) -> tuple[str, ...]:
    """The recipes that tune at least one of the grid's knobs on this device."""
    return tuple(r.name for r in recipes if set(r.space(device.type, cores(), batch)) & set(case.grid))


def _row_brief(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r.get(k) for k in ("changes", "samples_per_s", "feasible", "reason", "wall_s", "peak_memory_bytes",
                                  "load_avg")}


def run_case(case: Case, rule: RuleOfThumb, protocol: Protocol, device: torch.device, seed: int, log: Log,
             measure_grid: bool = False, grid_dir: Path | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    load_before = _load()
    wl = case.workload()
    runner = CountingRunner(wl, case.spec if case.isolate else None, device, protocol, isolate=case.isolate)
    stored, source = grids.obtain(case, runner, protocol, device, measure_grid, log, grid_dir)
    gs = grids.summarize(stored, TOP)
    constraints = Constraints(case.memory_limit, gs["reference_losses"])
    rows = stored["rows"]

    runner.reset()
    rule_cfg, rule_notes = rule.config(device)
    log(f"{case.name}: rule of thumb {rule_cfg.short()}")
    rule_res = run_single(runner, rule_cfg, constraints)
    rule_res["notes"] = rule_notes
    rule_res["windows"] = runner.count()["windows"]

    runner.reset()
    recipes = load_recipes()
    only = grid_recipes(case, recipes, device, wl.batch_size)
    log(f"{case.name}: autotune (recipes {', '.join(only)})")
    settings = Settings(trials=QUICK_AGENT_TRIALS if case.quick else AGENT_TRIALS, memory_limit=case.memory_limit,
                        seed=seed, only=only)
    events = LogEvents(log)
    rep, agent_wall_s = run_agent(runner, recipes, facts(wl), settings, log, study=case.name, events=events)
    agent_count = runner.count()
    used = rep.budget.trials_used if rep.budget else 0
    searches = {m: search_stored(stored, m, used, seed, log) for m in SEARCHES}

    final_cfg = TrainConfig().with_changes(rep.final_config or {})
    final_peak = (rep.final.peak_memory_bytes if rep.final else None) or 0
    cap = QUICK_SHORTLIST_CAP if case.quick else SHORTLIST_CAP
    short = [i for i in gs["shortlist"] if rows[i]["feasible"]][:cap] or gs["best"]
    top = [f"grid_{i + 1}" for i in range(len(short))]
    chosen = {label: TrainConfig().with_changes(rows[i]["config"]) for label, i in zip(top, short)}
    chosen |= {"default": TrainConfig(), "rule_of_thumb": rule_cfg,
               **{m: TrainConfig().with_changes(searches[m]["best_config"]) for m in SEARCHES}, "autotune": final_cfg}
    infeasible = {label for label, ok in (
        ("default", gs["default"]["feasible"]), ("rule_of_thumb", rule_res["feasible"]),
        *((m, searches[m]["samples_per_s"] > 0) for m in SEARCHES),
        ("autotune", not (case.memory_limit and final_peak > case.memory_limit))) if not ok}
    log(f"{case.name}: judging {len({tuple(c.flat().items()) for c in chosen.values()})} distinct configs in turns")
    judged = judge(runner, chosen, infeasible, log, top=top, looks=QUICK_JUDGE_LOOKS if case.quick else None)
    best = fastest(judged, top) if top else "default"
    judged["labels"]["oracle"] = judged["labels"][best]
    chosen["oracle"] = chosen[best]
    diagnosed = rep.initial_diagnosis  # the agent always diagnoses its baseline before it returns

    search = {"oracle": rows[gs["best"][0]]["samples_per_s"] if gs["best"] else 0.0,
              "default": gs["default"]["samples_per_s"], "rule_of_thumb": rule_res["samples_per_s"],
              **{m: searches[m]["samples_per_s"] for m in SEARCHES},
              "autotune": rep.final.samples_per_s if rep.final else None}
    trials = {"oracle": gs["trials"], "default": 1, "rule_of_thumb": 1, **{m: searches[m]["trials"] for m in SEARCHES},
              "autotune": used}
    walls = {"oracle": gs["wall_s"], "default": gs["default"]["wall_s"], "rule_of_thumb": rule_res["wall_s"],
             **{m: searches[m]["wall_s"] for m in SEARCHES}, "autotune": agent_wall_s}
    grid_windows = sum(len(r.get("windows_samples_per_s") or []) for r in rows)
    windows = {"oracle": grid_windows, "default": len(gs["default"].get("windows_samples_per_s") or []),
               "rule_of_thumb": rule_res["windows"], **{m: searches[m]["windows"] for m in SEARCHES},
               "autotune": agent_count["windows"]}
    methods = {}
    for m in (*METHODS, *top):
        j = judged["labels"][m]
        methods[m] = {"samples_per_s": j["samples_per_s"], "ratio_to_oracle": ratio(judged, "oracle", m),
                      "search_samples_per_s": search.get(m), "trials": trials.get(m), "windows": windows.get(m),
                      "wall_s": walls.get(m),
                      "changes": TrainConfig().diff(chosen[m]), "feasible": m not in infeasible,
                      "judge_windows": j["windows"], "note": j.get("reason")}
    methods["autotune"]["peak_memory_bytes"] = final_peak or None
    methods["oracle"]["label"] = best
    traces = {"autotune": events.timeline, **{m: searches[m]["trace"] for m in SEARCHES}}
    res = {
        **case.describe(), "workload": wl.name, "batch_size": wl.batch_size, "rule_floor": case.rule_floor,
        "methods": methods,
        "diagnosis": {"planted": case.planted or None, "diagnosed": diagnosed.bottleneck.value,
                      "wastes": [w.cls.value for w in diagnosed.wastes],
                      # found: named the bottleneck, or listed as a waste where it holds less of the
                      # step than the model's own work (a sync on CPU costs almost nothing)
                      "correct": case.planted in [w.cls.value for w in diagnosed.wastes] if case.planted else None,
                      "reason": diagnosed.reason},
        "comparisons": {
            "autotune_vs_blind": ratio(judged, "blind_tpe", "autotune"),
            "autotune_vs_random": ratio(judged, "random", "autotune"),
            "autotune_vs_default": ratio(judged, "default", "autotune"),
            "autotune_vs_rule": ratio(judged, "rule_of_thumb", "autotune"),
            "rule_vs_oracle": ratio(judged, "oracle", "rule_of_thumb"),
        },
        "grid_summary": {"source": source, "trials": gs["trials"], "windows": grid_windows, "wall_s": gs["wall_s"],
                         "date": stored["date"],
                         "machine": stored["machine"], "runner": stored["runner"],
                         "load_avg": [r["load_avg"][0] for r in rows if r.get("load_avg")],
                         "top": [{"label": t, **_row_brief(rows[i])} for t, i in zip(top, short)]},
        "grid_results": {"rows": [_row_brief(r) for r in rows]},
        "rule_of_thumb": rule_res,
        "searches": {m: {k: searches[m][k] for k in ("trials", "measured", "windows", "wall_s")} for m in SEARCHES},
        "anytime": anytime.curves(traces, stored, TARGET_ORACLE),
        "autotune": {"recipes": list(only), "count": agent_count, "stop_reason": rep.stop_reason,
                     "noise": _dump(rep.noise), "speedup": _dump(rep.speedup),
                     "steps": [st.model_dump(mode="json", include={"recipe", "bottleneck", "accepted", "changes", "speedup",
                                                                   "reason"}) | {"trials": len(st.trials), "tried": [
                         t.model_dump(mode="json", include={"changes", "samples_per_s", "state", "peak_memory_bytes"})
                         for t in st.trials]} for st in rep.steps],
                     "final_diagnosis": rep.diagnosis.bottleneck.value if rep.diagnosis else None},
        "judge_wall_s": judged["wall_s"], "judge_rounds": judged["rounds"],
        "judge": {k: judged[k] for k in ("looks", "rounds", "windows", "sessions", "half_width", "wall_s")},
        "wall_s": time.perf_counter() - t0,
        "runner": "a process per measurement (isolated)" if case.isolate else "in-process",
        "load_avg": {"before": load_before, "after": _load()},
    }
    res["targets"] = case_targets(res)
    log(f"{case.name}: done in {res['wall_s']:.0f} s")
    return res


def _dump(model: Any) -> dict[str, Any] | None:
    return None if model is None else model.model_dump(mode="json")


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
        log: Log = lambda s: None, measure_grid: bool = False, grid_dir: Path | None = None,
        overhead: bool = True) -> dict[str, Any]:
    t0 = time.perf_counter()
    dev = torch.device(device)
    protocol = QUICK_PROTOCOL if quick else PROTOCOL
    rule = QUICK_RULE if quick else RULE
    threads = torch.get_num_threads()
    results = []
    if not measure_grid:  # a missing or foreign stored grid fails the run before anything is measured
        for case in cases:
            grids.load(case, protocol, dev, grid_dir)
    try:
        for case in cases:
            results.append(run_case(case, rule, protocol, dev, seed, log, measure_grid, grid_dir))
        placebo = None
        if extras:
            placebo = false_acceptances(QUICK_WORKLOADS if quick else WORKLOADS,
                                        QUICK_PLACEBO_RUNS if quick else PLACEBO_RUNS, dev, protocol, log, seed,
                                        QUICK_PLACEBO_MODEL_RUNS if quick else PLACEBO_MODEL_RUNS)
    finally:
        torch.set_num_threads(threads)
    over = overheads(quick, log) if extras and overhead else None
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
        "targets": suite_targets([r for r in results if r["set"] == "bundled"], placebo, total, quick),
        # the held-out workloads (`benchmarks/heldout/`), scored apart: no rule is tuned on them
        "heldout_targets": suite_targets([r for r in results if r["set"] == "heldout"], None, total, quick)
        if any(r["set"] == "heldout" for r in results) else None,
        "command": None,
        "total_s": total,
    }
