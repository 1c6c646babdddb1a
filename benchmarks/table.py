"""The suite's results as Markdown: one table per question, targets with measured figures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from benchmarks import anytime

TARGET = 0.95

LABELS = {"oracle": "grid's best (re-measured)", "grid_1": "grid #1", "grid_2": "grid #2", "grid_3": "grid #3",
          "default": "default", "rule_of_thumb": "rule of thumb", "blind_tpe": "blind TPE", "random": "random search",
          "autotune": "autotune"}


def _f(x: float | None, d: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{d}f}"


def _ci(r: dict[str, Any]) -> str:
    if r.get("only_b_feasible"):
        return "only it fits"
    if r.get("ratio") is None:
        return "n/a"
    if r.get("same_config"):
        return f"{r['ratio']:.2f} (same config)"
    if not r.get("pairs"):
        return f"{r['ratio']:.2f}"
    return f"{r['ratio']:.2f} [{_f(r['low'])}, {_f(r['high'])}]"


def _changes(ch: dict[str, list[Any]]) -> str:
    return ", ".join(f"{k.split('.', 1)[1]}={v[1]}" for k, v in ch.items()) or "defaults"


def _mark(met: bool | None) -> str:
    return "n/a" if met is None else ("met" if met else "**missed**")


def methods_table(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["| example | method | samples/s (judged) | fraction of grid's best [95% CI] | search samples/s | trials "
             "| windows | wall s | config |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for c in cases:
        for m, label in LABELS.items():
            if m not in c["methods"]:
                continue
            r = c["methods"][m]
            if m == "oracle":
                label += f" = {LABELS.get(r.get('label'), r.get('label'))}"
            thr = _f(r["samples_per_s"], 0) + ("" if r["feasible"] else " (infeasible)")
            trials = "" if r["trials"] is None else r["trials"]
            windows = "" if r.get("windows") is None else r["windows"]
            wall = "" if r["wall_s"] is None else f"{r['wall_s']:.1f}"
            lines.append(f"| {c['name']} | {label} | {thr} | {_ci(r['ratio_to_oracle'])} | "
                         f"{_f(r['search_samples_per_s'], 0)} | {trials} | {windows} | {wall} | "
                         f"{_changes(r['changes'])} |")
    return lines


def diagnosis_table(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["| example | planted | diagnosed | found | evidence | autotune's rounds |", "|---|---|---|---|---|---|"]
    for c in cases:
        d = c["diagnosis"]
        ok = "n/a (realistic)" if d["correct"] is None else ("yes" if d["correct"] else "**no**")
        rounds = "; ".join(f"{st['recipe']} ({st['trials']}): {'accepted' if st['accepted'] else 'rejected'}"
                           for st in c["autotune"]["steps"]) + f"; stop: {c['autotune']['stop_reason']}"
        lines.append(f"| {c['name']} | {d['planted'] or 'none'} | {d['diagnosed']} | {ok} | "
                     f"{(d.get('reason') or '').replace('|', '/')} | {rounds.replace('|', '/')} |")
    return lines


def targets_table(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["| example | >= 0.95 of grid's best [95% CI]: point / lower bound | <= 1/4 grid windows (trials) "
             "| <= 1/4 grid wall | vs default | vs rule of thumb | vs blind TPE | vs random search |",
             "|---|---|---|---|---|---|---|---|"]
    for c in cases:
        t = c["targets"]
        blind, rnd = t["not_below_blind"], t["not_below_random"]
        vs_blind = f"{_ci(blind['measured'])}: " + ("better" if t["better_than_blind"]["met"] else
                                                     ("not worse" if blind["met"] else "**worse**"))
        vs_rnd = f"{_ci(rnd['measured'])}: " + ("not worse" if rnd["met"] else "**worse**")
        d = t["not_below_default"]
        rule, floor = t["beats_rule_where_wrong"], t["at_least_rule"]
        vs_rule = f"{_ci(rule['measured'])}: " + (f"rule wrong, beat it: {_mark(rule['met'])}" if rule["rule_wrong"]
                                                  else "rule not wrong here")
        if floor["met"] is not None:
            vs_rule += f"; at least the rule: {_mark(floor['met'])}"
        low, high = t["oracle"].get("interval") or (None, None)
        ora = (f"{_f(t['oracle']['measured'])} [{_f(low)}, {_f(high)}]: {_mark(t['oracle']['met'])} / "
               f"{_mark(t['oracle_lower']['met'])}")
        if t["within_limit"]["met"] is not None:
            ora += f"; within the limit: {_mark(t['within_limit']['met'])}"
        lines.append(
            f"| {c['name']} | {ora} | {t['windows']['measured']} of {c['grid_summary']['windows']} "
            f"({t['windows']['trials']} of {c['grid_summary']['trials']}): {_mark(t['windows']['met'])} | "
            f"{_f(t['wall']['measured'])}: {_mark(t['wall']['met'])} | "
            f"{_ci(d['measured'])}: {_mark(d['met'])} | {vs_rule} | {vs_blind} | {vs_rnd} |")
    return lines


def summary_lines(report: dict[str, Any]) -> list[str]:
    t = report["targets"]
    names = {
        "oracle_every_example": "autotune >= 0.95 of the grid's best (re-measured side by side) on every example, "
                                "on the point estimate",
        "oracle_lower_every_example": "the same on the 95% interval's lower bound",
        "windows_quarter_every_example": "autotune measures <= 1/4 of the grid's windows on every example",
        "wall_quarter_every_example": "autotune uses <= 1/4 of the grid's wall time on every example",
        "not_below_default_every_example": "autotune never below the default",
        "beats_rule_where_wrong": "autotune beats the rule of thumb wherever the rule is wrong for this machine",
        "at_least_rule_on_io": "on the I/O example, autotune reaches at least the rule of thumb's throughput",
        "within_memory_limit": "under a memory limit, autotune's config fits (and the grid's best is the fastest fit)",
        "not_below_blind_every_example": "autotune >= blind TPE on every example",
        "not_below_random_every_example": "autotune >= random search on every example",
    }
    out = []
    for key, text in names.items():
        x = t[key]
        out.append(f"- {text}: {_mark(x['met'])}, met on {x['examples'] - len(x['missed'])} of {x['examples']}"
                   + (f" (missed on: {'; '.join(x['missed'])})" if x["missed"] else ""))
    b = t["better_than_blind_on_half"]
    out.append(f"- autotune better than blind TPE on at least half: {_mark(b['met'])} "
               f"({len(b['better_on'])} of {b['examples']}: {', '.join(b['better_on']) or 'none'})")
    d = t["diagnosis"]
    out.append(f"- diagnosis: {d['correct']} of {d['examples']} planted classes found (the bottleneck, or a waste listed beside it)"
               + (f" (wrong: {'; '.join(d['wrong'])})" if d["wrong"] else ""))
    if "no_false_acceptances" in t:
        f = t["no_false_acceptances"]
        lo, hi = f["interval"]
        out.append(f"- false acceptances: {f['accepted']} of {f['decided']} placebo decisions over {f['runs']} run(s), "
                   f"{_rate(f['rate'])} [{_rate(lo)}, {_rate(hi)}] (Wilson 95%): {_mark(f['met'])}")
    out.append(f"- whole suite: {t['total_minutes']['measured_s'] / 60:.1f} min (grids read from storage)")
    return out


def placebo_lines(p: dict[str, Any]) -> list[str]:
    lo, hi = p["interval"]
    lines = [f"Workloads: {', '.join(f'{k} `{v}`' for k, v in p['workloads'].items())}; recipe `{p['recipe']['name']}` "
             f"over {', '.join(p['recipe']['knobs'])}: {p['why_nothing_helps']}", "",
             f"Every acceptance is false: {p['accepted']} of {p['decided']} decisions, {_rate(p['rate'])} "
             f"[{_rate(lo)}, {_rate(hi)}] (Wilson 95%); target: {p['target']}.", "",
             "| workload | run (seed) | A/A margin | trials | accepted | decisions |", "|---|---|---:|---:|---:|---|"]
    for r in p["runs"]:
        margin = (r.get("noise") or {}).get("margin")
        dec = "; ".join(f"{d['recipe']}: {'accepted' if d['accepted'] else 'rejected'} ({d.get('reason') or ''})"
                        for d in r["decisions"]).replace("|", "/")
        lines.append(f"| {r['workload']} | {r['seed']} | {_f(margin, 3)} | {r['trials_used']} | {r['accepted']} | "
                     f"{dec or 'none decided'} |")
    m = p.get("model")
    if m:
        par = m["parameters"]
        lines += ["", f"Power, on FakeRunner with this machine's noise model ({par['noise']:.0%} window noise with "
                      f"{par['tails']} tails, {par['session']:.0%} session offsets, drift {par['drift']}, "
                      f"{par['carry']:.0%} carry-over, the candidate's windows {par['noisier']}x as noisy), the same "
                      "recipe with channels_last truly faster by the gain, the same agent:", "",
                  "| true gain | runs | kept [Wilson 95%] | false acceptances [Wilson 95%] |", "|---:|---:|---|---|"]
        for g, r in {"1.00": m["placebo"], **m["power"]}.items():
            kept = "-" if g == "1.00" else f"{_rate(r['kept']['rate'])} [{_rate(r['kept']['interval'][0])}, " \
                                            f"{_rate(r['kept']['interval'][1])}]"
            f = r["false"]
            lines.append(f"| {g} | {r['runs']} | {kept} | {f['count']} of {f['of']}: {_rate(f['rate'])} "
                         f"[{_rate(f['interval'][0])}, {_rate(f['interval'][1])}] |")
    return lines


def overhead_lines(o: dict[str, Any]) -> list[str]:
    if o.get("error"):
        return [f"The overhead benchmark failed: {o['error']}"]
    lines = ["| workload | instrumented / bare step time [95% CI] | profiler / bare | stage timers' cost / profiler's |",
             "|---|---:|---:|---:|"]
    for r in o["summary"]:
        lo, hi = r["instrumented_ci"]
        frac = r["stage_timers_vs_profiler_cost"]
        lines.append(f"| {r['workload']} | {_f(r['instrumented_vs_bare'], 4)} [{_f(lo, 4)}, {_f(hi, 4)}] | "
                     f"{_f(r['profiler_vs_bare'], 4)} | {'n/a' if frac is None else f'{frac:.1%}'} |")
    return lines


def cases_table(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["| example | workload | grid (every combination; duplicates after normalisation collapse) | configs "
             "| held at default | memory limit | grid: source, date, min, load avg (1 min) min-max | case wall s "
             "| load avg before / after |", "|---|---|---|---:|---|---:|---|---:|---|"]
    for c in cases:
        grid = " x ".join(f"{k.split('.', 1)[1]} {{{', '.join('null' if v is None else str(v) for v in vs)}}}"
                          for k, vs in c["grid"].items())
        lim = "none" if not c["memory_limit_bytes"] else f"{c['memory_limit_bytes'] / 2**20:g} MiB"
        load = " / ".join(_f(x[0]) if x else "n/a" for x in (c["load_avg"]["before"], c["load_avg"]["after"]))
        g = c["grid_summary"]
        gl = g["load_avg"]
        gsrc = (f"{g['source']}, {g['date'][:16]}, {g['wall_s'] / 60:.1f}, "
                + (f"{min(gl):.1f}-{max(gl):.1f}" if gl else "n/a"))
        lines.append(f"| {c['name']} | `{c['target']}` | {grid} | {c['grid_size']} | {c.get('held') or ''} | {lim} | "
                     f"{gsrc} | {c['wall_s']:.0f} | {load} |")
    return lines


def top_table(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["| example | grid rank | stored samples/s | judged samples/s | config |", "|---|---|---:|---:|---|"]
    for c in cases:
        for t in c["grid_summary"]["top"]:
            m = c["methods"][t["label"]]
            lines.append(f"| {c['name']} | {LABELS.get(t['label'], t['label'])} | {_f(t['samples_per_s'], 0)} | "
                         f"{_f(m['samples_per_s'], 0)} | {_changes(t['changes'])} |")
    return lines


def _judge_cost(c: dict[str, Any]) -> str:
    j = c["judge"]
    return f"{c['name']}: {j['looks']} looks, {j['windows']} windows, {j['sessions']} sessions, {j['wall_s']:.0f} s"


def _rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def heldout_lines(report: dict[str, Any]) -> list[str]:
    """The held-out workloads' section: their targets and methods, scored apart from the bundled examples."""
    held = [c for c in report["cases"] if c.get("set") == "heldout"]
    if not held:
        return []
    return ["## Held-out workloads", "",
            "Workloads in `benchmarks/heldout/` (`--set heldout`), of shapes the bundled examples do not have: written "
            "and their grids measured before any later change to autotune's decisions, and never used to tune a rule. "
            "Scored as the bundled examples are, apart from them.", "",
            *summary_lines({"targets": report["heldout_targets"]}), "", *targets_table(held), "",
            *methods_table(held), ""]


def to_markdown(report: dict[str, Any]) -> str:
    env, cases = report["environment"], report["cases"]
    bundled = [c for c in cases if c.get("set", "bundled") == "bundled"]
    p = report["protocol"]
    out = [f"# autotune benchmark suite{' (--quick)' if report['quick'] else ''}", "",
           f"{env['cpu']}, {env['cores']} cores, torch {env['torch']}, device {env['device']}; "
           f"protocol: {p['warmup_steps']} warm-up + {p['steps']} measured steps x {p['windows']} windows "
           f"(longer for deep loader buffers), seed {p['seed']}; {report['runner']}; "
           f"total {report['total_s'] / 60:.1f} min.", ""]
    if report.get("command"):
        out += [f"Command: `{report['command']}`", ""]
    out += ["Load averages (1 min) count this run's own loader workers too; well above 1 before a case means "
            "something else was running.", "", "## Targets", "",
            *(summary_lines(report) if bundled else ["No bundled example in this run (`--set heldout`)."]), "",
            *targets_table(bundled), "",
            "## Methods against the grid's best", "",
            "Throughput and ratios come from re-measuring every method's chosen config alike, the grid's best few "
            "among them, in blocks: each block opens a fresh session (process) of every config and takes two windows "
            "of each in turns, one look of every ratio; the interval is over the spread between looks. The grid's "
            "best is the fastest of its best few on blocks of their own, between the figures' blocks. Blocks go on "
            "until every config's interval against every one of the grid's best few is within +-5%, 6 to 16 of them, "
            "whichever config leads (" + "; ".join(_judge_cost(c) for c in cases if c.get("judge")) + "). Trials, "
            "windows, wall time and 'search samples/s' are each method's own search (the grid's: its stored "
            "measurement; blind TPE and random search: stored look-ups, with autotune's trial count; autotune: every "
            "window it measured, its baseline, A/As, comparisons and duels included); the judge's windows are nobody's.",
            "",
            *methods_table(bundled), "", *heldout_lines(report), "## Anytime curves", "",
            "Best found so far, as a fraction of the stored grid's best, after n trials; every trial counted at the "
            "stored grid's figure of its config (blind TPE and random search look it up; autotune runs for real and "
            "counts at its own measurement only where the grid lacks the config: 'own'). The last column is when "
            f"the best found first reached {TARGET:.2f} of the stored grid's best: autotune's wall time is its own, "
            "the others' the stored measurements' wall time. Drawn in " + (f"[{report['svg']}]({report['svg']})."
                                                                            if report.get("svg") else "the SVG file."),
            "", *anytime.table_lines(cases, TARGET), "",
            "## Grids", "", *cases_table(cases), "", "The grid's best few, stored against re-measured:", "",
            *top_table(cases), "", "## Diagnosis", "", *diagnosis_table(cases), ""]
    rule = report["rule_of_thumb"]
    compiled = f"torch.compile(mode={rule['compile_mode']!r})" if rule["compile_mode"] else "no torch.compile"
    out += ["## Rule of thumb", "",
            f"The guides' settings: num_workers={rule['num_workers']}, prefetch_factor={rule['prefetch_factor']}, "
            f"persistent_workers={rule['persistent_workers']}, pin_memory={rule['pin_memory']}, "
            f"AMP {'where the hardware has it' if rule['amp'] else 'off'}, {compiled}.",
            "", f"Applied on this machine, to every example: `{rule['applied']}`."
            + ("" if not rule["notes"] else " " + "; ".join(rule["notes"]) + "."), ""]
    if report.get("false_acceptances"):
        out += ["## False acceptances", "", *placebo_lines(report["false_acceptances"]), ""]
    if report.get("overheads"):
        out += ["## Overheads", "", *overhead_lines(report["overheads"]), ""]
    return "\n".join(out)


def emit(md: str, json_text: Callable[[], str], json_path: str | None, md_path: str | None) -> None:
    """Write the JSON where asked (rendered only then), and the Markdown to its file or else to stdout."""
    if json_path:
        Path(json_path).write_text(json_text())
    if md_path:
        Path(md_path).write_text(md)
    else:
        sys.stdout.write(md)
