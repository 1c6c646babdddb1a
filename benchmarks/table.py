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
             "| wall s | config |", "|---|---|---:|---:|---:|---:|---:|---|"]
    for c in cases:
        for m, label in LABELS.items():
            if m not in c["methods"]:
                continue
            r = c["methods"][m]
            if m == "oracle":
                label += f" = {LABELS.get(r.get('label'), r.get('label'))}"
            thr = _f(r["samples_per_s"], 0) + ("" if r["feasible"] else " (infeasible)")
            trials = "" if r["trials"] is None else r["trials"]
            wall = "" if r["wall_s"] is None else f"{r['wall_s']:.1f}"
            lines.append(f"| {c['name']} | {label} | {thr} | {_ci(r['ratio_to_oracle'])} | "
                         f"{_f(r['search_samples_per_s'], 0)} | {trials} | {wall} | {_changes(r['changes'])} |")
    return lines


def diagnosis_table(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["| example | planted | diagnosed | correct | evidence | autotune's rounds |", "|---|---|---|---|---|---|"]
    for c in cases:
        d = c["diagnosis"]
        ok = "n/a (realistic)" if d["correct"] is None else ("yes" if d["correct"] else "**no**")
        rounds = "; ".join(f"{st['recipe']} ({st['trials']}): {'accepted' if st['accepted'] else 'rejected'}"
                           for st in c["autotune"]["steps"]) + f"; stop: {c['autotune']['stop_reason']}"
        lines.append(f"| {c['name']} | {d['planted'] or 'none'} | {d['diagnosed']} | {ok} | "
                     f"{(d.get('reason') or '').replace('|', '/')} | {rounds.replace('|', '/')} |")
    return lines


def targets_table(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["| example | >= 0.95 of grid's best | <= 1/4 grid trials | <= 1/4 grid wall | vs default | vs rule of thumb "
             "| vs blind TPE | vs random search |", "|---|---|---|---|---|---|---|---|"]
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
        ora = f"{_f(t['oracle']['measured'])}: {_mark(t['oracle']['met'])}"
        if t["within_limit"]["met"] is not None:
            ora += f"; within the limit: {_mark(t['within_limit']['met'])}"
        lines.append(
            f"| {c['name']} | {ora} | {t['trials']['measured']} of {c['grid_summary']['trials']}: "
            f"{_mark(t['trials']['met'])} | {_f(t['wall']['measured'])}: {_mark(t['wall']['met'])} | "
            f"{_ci(d['measured'])}: {_mark(d['met'])} | {vs_rule} | {vs_blind} | {vs_rnd} |")
    return lines


def summary_lines(report: dict[str, Any]) -> list[str]:
    t = report["targets"]
    names = {
        "oracle_every_example": "autotune >= 0.95 of the grid's best (re-measured side by side) on every example",
        "trials_quarter_every_example": "autotune uses <= 1/4 of the grid's trials on every example",
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
        out.append(f"- {text}: {_mark(x['met'])}" + (f" (missed on: {'; '.join(x['missed'])})" if x["missed"] else "")
                   + f" [{x['examples']} example(s) apply]")
    b = t["better_than_blind_on_half"]
    out.append(f"- autotune better than blind TPE on at least half: {_mark(b['met'])} "
               f"({len(b['better_on'])} of {b['examples']}: {', '.join(b['better_on']) or 'none'})")
    d = t["diagnosis"]
    out.append(f"- diagnosis: {d['correct']} of {d['examples']} planted classes named"
               + (f" (wrong: {'; '.join(d['wrong'])})" if d["wrong"] else ""))
    if "no_false_acceptances" in t:
        f = t["no_false_acceptances"]
        out.append(f"- false acceptances: {f['not_reproduced']} not reproduced of {f['accepted']} accepted over "
                   f"{f['runs']} placebo run(s): {_mark(f['met'])}")
    out.append(f"- whole suite: {t['total_minutes']['measured_s'] / 60:.1f} min (grids read from storage)")
    return out


def placebo_lines(p: dict[str, Any]) -> list[str]:
    lines = [f"Workload {p['workload']}, recipe `{p['recipe']['name']}` over {', '.join(p['recipe']['knobs'])}: "
             f"{p['why_nothing_helps']}", "",
             "| run (seed) | A/A margin | trials | accepted | decisions |", "|---|---:|---:|---:|---|"]
    for r in p["runs"]:
        margin = (r.get("noise") or {}).get("margin")
        dec = "; ".join(f"{d['recipe']}: {'accepted' if d['accepted'] else 'rejected'} ({d.get('reason') or ''})"
                        for d in r["decisions"]).replace("|", "/")
        lines.append(f"| {r['seed']} | {_f(margin, 3)} | {r['trials_used']} | {r['accepted']} | {dec} |")
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


def to_markdown(report: dict[str, Any]) -> str:
    env, cases = report["environment"], report["cases"]
    p = report["protocol"]
    out = [f"# autotune benchmark suite{' (--quick)' if report['quick'] else ''}", "",
           f"{env['cpu']}, {env['cores']} cores, torch {env['torch']}, device {env['device']}; "
           f"protocol: {p['warmup_steps']} warm-up + {p['steps']} measured steps x {p['windows']} windows "
           f"(longer for deep loader buffers), seed {p['seed']}; {report['runner']}; "
           f"total {report['total_s'] / 60:.1f} min.", ""]
    if report.get("command"):
        out += [f"Command: `{report['command']}`", ""]
    out += ["Load averages (1 min) count this run's own loader workers too; well above 1 before a case means "
            "something else was running.", "", "## Targets", "", *summary_lines(report), "", *targets_table(cases), "",
            "## Methods against the grid's best", "",
            "Throughput and ratios come from re-measuring every method's chosen config in turns (round robin), the "
            "grid's best few among them: the grid's best is the fastest of those on rounds of their own (the figures "
            "use the other half). Where autotune's interval against the leading one of them is wider than +-5%, rounds of "
            "autotune and the grid's best few alone go on in blocks of four, each block in fresh sessions (processes) "
            "and alternately held out and picking, up to four times as many ("
            + "; ".join(f"{c['name']}: {c['judge_rounds']}" for c in cases if c.get("judge_rounds")) + " rounds); "
            "an interval over several sessions counts each session's pairs once (the spread between sessions). Trials, "
            "wall time and 'search samples/s' are each method's own search (the grid's: its stored measurement; blind "
            "TPE and random search: stored look-ups, with autotune's trial count).", "",
            *methods_table(cases), "", "## Anytime curves", "",
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
