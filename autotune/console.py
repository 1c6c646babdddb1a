"""Rich rendering for the terminal: stage bars, verdicts, recipe tables, progress."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from .clock import STAGES
from .units import format_bytes

# Piped or captured output gets 120 columns rather than rich's 80, so tables stay readable.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
_COLORS = {"data": "red", "h2d": "magenta", "forward": "cyan", "backward": "blue", "optimizer": "green", "other": "white"}


def progress() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TextColumn("{task.fields[note]}"), TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True)


def stage_table(summary: dict[str, Any], title: str = "Stages of one step") -> Table:
    t = Table(title=title, title_justify="left")
    t.add_column("stage"), t.add_column("ms/step", justify="right"), t.add_column("share", justify="right"), t.add_column("")
    for s in STAGES:
        v = summary["stages"][s]
        bar = "█" * round(40 * v["share"])
        t.add_row(s, f"{v['s'] * 1e3:.2f}", f"{v['share']:.1%}", f"[{_COLORS[s]}]{bar}[/]")
    return t


def measurement_lines(summary: dict[str, Any]) -> list[str]:
    st = summary["step_time_s"]
    wins = ", ".join(f"{x:.0f}" for x in summary["windows_samples_per_s"])
    ot = summary.get("one_time", {})
    lines = [
        f"throughput [bold]{summary['samples_per_s']:.1f}[/] samples/s   step median {st['median'] * 1e3:.2f} ms, p90 {st['p90'] * 1e3:.2f} ms",
        f"windows (samples/s): {wins}   spread (CV) {summary['window_cv']:.1%}",
        f"peak memory {format_bytes(summary['peak_memory_bytes'])} (tensors)   peak RSS {format_bytes(summary['peak_rss_bytes'])}",
        "one-time: " + ", ".join(f"{k} {v:.3f} s" for k, v in ot.items()),
    ]
    return lines


def verdict_lines(diag: dict[str, Any]) -> list[str]:
    lines = [f"Bottleneck: [bold yellow]{diag['bottleneck']}[/]  ({diag['reason']}); slowest stage: {diag['slowest_stage']}"]
    ev = {k: v for k, v in diag["evidence"].items() if k != "stage_shares" and v is not None}
    lines.append("evidence: " + ", ".join(f"{k}={round(v, 4) if isinstance(v, float) else v}" for k, v in ev.items()))
    return lines


def recipe_table(recipes, device: str | None = None, facts: dict | None = None, title: str = "Recipe ladder (cheapest first)") -> Table:
    t = Table(title=title, title_justify="left")
    for c in ("rank", "recipe", "targets", "knobs", "applies", "what it does"):
        t.add_column(c, overflow="fold")
    for r in recipes:
        ok, why = r.applies(device, facts or {}) if device else (True, "")
        t.add_row(str(r.cost), r.name, ", ".join(b.value for b in r.targets), "\n".join(k.key for k in r.knobs),
                  ("yes" if ok else f"no: {why}") if device else ", ".join(r.devices), r.summary)
    return t


def print_tune_summary(report: dict[str, Any], out) -> None:
    c = console
    base, final = report.get("baseline") or {}, report.get("final") or {}
    sp = report.get("speedup") or {}
    c.print(f"\n[bold]{report.get('workload')}[/] on {report.get('device')}: "
            f"baseline {base.get('samples_per_s', 0):.1f} samples/s -> final {final.get('samples_per_s', 0):.1f} samples/s")
    if sp.get("ratio"):
        c.print(f"speedup (final vs baseline, interleaved): [bold green]{sp['ratio']:.2f}x[/] [{sp['low']:.2f}, {sp['high']:.2f}]")
    noise = report.get("noise")
    if noise:
        c.print(f"noise (A/A): {noise['ratio']:.3f} [{noise['low']:.3f}, {noise['high']:.3f}]; a change must clear {noise['margin']:.3f}x")
    t = Table(title="Recommendations, ranked by measured gain", title_justify="left")
    for col in ("recipe", "changes", "speedup", "95% CI", "memory", "verdict"):
        t.add_column(col, overflow="fold")
    for r in report.get("recommendations", []):
        ch = ", ".join(f"{k}: {v[0]} -> {v[1]}" for k, v in r["changes"].items()) or "-"
        ci = f"[{r['ci'][0]:.2f}, {r['ci'][1]:.2f}]" if r.get("ci") and r["ci"][0] is not None else "-"
        spd = f"{r['speedup']:.2f}x" if r.get("speedup") else "-"
        t.add_row(r["recipe"], ch, spd, ci, format_bytes(r.get("memory_delta_bytes")),
                  "[green]accepted[/]" if r["accepted"] else f"rejected: {r.get('reason')}")
    c.print(t)
    d = report.get("diagnosis") or {}
    c.print(f"final diagnosis: {d.get('bottleneck')} ({d.get('reason')})")
    c.print(f"stopped: {report.get('stop_reason')}")
    b = report.get("budget") or {}
    if b:
        c.print(f"trials used {b['trials_used']} of {b['trials_limit']}, wall {b['wall_s']:.0f} s")
    c.print(f"wrote {out}/tuned.yaml, report.json, report.md, report.html")
