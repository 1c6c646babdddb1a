"""The suite's results as Markdown: one table per question, targets with measured figures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

LABELS = {"oracle": "oracle (grid)", "default": "default", "rule_of_thumb": "rule of thumb",
          "blind_optuna": "blind Optuna", "autotune": "autotune"}


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
    lines = ["| example | method | samples/s (judged) | ratio to oracle [95% CI] | trials | wall s | config |",
             "|---|---|---:|---:|---:|---:|---|"]
    for c in cases:
        for m, label in LABELS.items():
            r = c["methods"][m]
            thr = _f(r["samples_per_s"], 0) + ("" if r["feasible"] else " (infeasible)")
            lines.append(f"| {c['name']} | {label} | {thr} | {_ci(r['ratio_to_oracle'])} | {r['trials']} | "
                         f"{r['wall_s']:.1f} | {_changes(r['changes'])} |")
    return lines


def diagnosis_table(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["| example | planted | diagnosed | correct | evidence |", "|---|---|---|---|---|"]
    for c in cases:
        d = c["diagnosis"]
        lines.append(f"| {c['name']} | {d['planted']} | {d['diagnosed']} | {'yes' if d['correct'] else '**no**'} | "
                     f"{(d.get('reason') or '').replace('|', '/')} |")
    return lines


def targets_table(cases: list[dict[str, Any]]) -> list[str]:
    lines = ["| example | >= 0.95 of oracle | <= 1/4 grid trials | <= 1/4 grid wall | vs blind Optuna | vs default | vs rule of thumb |",
             "|---|---|---|---|---|---|---|"]
    for c in cases:
        t = c["targets"]
        blind = t["not_below_blind"]
        vs_blind = f"{_ci(blind['measured'])}: " + ("better" if t["better_than_blind"]["met"] else
                                                     ("not worse" if blind["met"] else "**worse**"))
        d = t["not_below_default"]
        rule = t["beats_rule_where_wrong"]
        vs_rule = (f"{_ci(rule['measured'])}: " + (_mark(rule["met"]) if rule["rule_wrong"] else "rule not wrong here"))
        lines.append(
            f"| {c['name']} | {_f(t['oracle']['measured'])}: {_mark(t['oracle']['met'])} | "
            f"{t['trials']['measured']} of {c['methods']['oracle']['trials']}: {_mark(t['trials']['met'])} | "
            f"{_f(t['wall']['measured'])}: {_mark(t['wall']['met'])} | {vs_blind} | "
            f"{_ci(d['measured'])}: {_mark(d['met'])} | {vs_rule} |")
    return lines


def summary_lines(report: dict[str, Any]) -> list[str]:
    t = report["targets"]
    names = {
        "oracle_every_example": "autotune >= 0.95 of the oracle on every example",
        "trials_quarter_every_example": "autotune uses <= 1/4 of the grid's trials on every example",
        "wall_quarter_every_example": "autotune uses <= 1/4 of the grid's wall time on every example",
        "not_below_blind_every_example": "autotune >= blind Optuna on every example",
        "not_below_default_every_example": "autotune never below the default",
        "beats_rule_where_wrong": "autotune beats the rule of thumb wherever the rule is wrong for this machine",
    }
    out = []
    for key, text in names.items():
        x = t[key]
        out.append(f"- {text}: {_mark(x['met'])}" + (f" (missed on: {'; '.join(x['missed'])})" if x["missed"] else "")
                   + f" [{x['examples']} example(s) apply]")
    b = t["better_than_blind_on_half"]
    out.append(f"- autotune better than blind Optuna on at least half: {_mark(b['met'])} "
               f"({len(b['better_on'])} of {b['examples']}: {', '.join(b['better_on']) or 'none'})")
    d = t["diagnosis"]
    out.append(f"- diagnosis: {d['correct']} of {d['examples']} planted classes named"
               + (f" (wrong: {'; '.join(d['wrong'])})" if d["wrong"] else ""))
    if "no_false_acceptances" in t:
        f = t["no_false_acceptances"]
        out.append(f"- false acceptances: {f['not_reproduced']} not reproduced of {f['accepted']} accepted over "
                   f"{f['runs']} placebo run(s): {_mark(f['met'])}")
    if "under_30_minutes" in t:
        u = t["under_30_minutes"]
        out.append(f"- whole suite under 30 minutes: {_mark(u['met'])} ({u['measured_s'] / 60:.1f} min)")
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
             "| memory limit | case wall s | load avg before / after |",
             "|---|---|---|---:|---:|---:|---|"]
    for c in cases:
        grid = " x ".join(f"{k.split('.', 1)[1]} {{{', '.join('null' if v is None else str(v) for v in vs)}}}"
                          for k, vs in c["grid"].items())
        lim = "none" if not c["memory_limit_bytes"] else f"{c['memory_limit_bytes'] / 2**20:g} MiB"
        load = " / ".join(_f(x[0]) if x else "n/a" for x in (c["load_avg"]["before"], c["load_avg"]["after"]))
        lines.append(f"| {c['name']} | `{c['target']}` | {grid} | {c['grid_size']} | {lim} | {c['wall_s']:.0f} | {load} |")
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
            "## Methods against the oracle", "",
            "Throughput and ratios come from re-measuring every method's chosen config in turns (round robin); "
            "trials and wall time are each method's own search. Blind Optuna had as many trials as autotune used.", "",
            *methods_table(cases), "", "## Grids", "", *cases_table(cases), "", "## Diagnosis", "", *diagnosis_table(cases), ""]
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
