"""Rich output for the terminal: measurements, stage bars, verdicts, recipe tables, the
summary of a tuning run, and the live progress display the agent reports to.

Rich reads markup (`[bold]`, `[link=...]`) in every printed string and every table cell:
text that comes from the user (workload and recipe names, recipe summaries, exception
messages, paths) always passes through `escape`, and the progress bar's description and
note columns are not markup at all. Emoji codes (`:smile:`) are never replaced."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from autotune.record import Report, Summary, Trial, Verdict
from autotune.units import format_bytes

from .fmt import number
from .tables import noise_warning, stage_names, stop_lines, verdict_word

if TYPE_CHECKING:
    from autotune.recipes import Recipe

__all__ = [
    "Display", "console", "measurement_lines", "print_profile", "print_tune_summary", "progress", "recipe_table",
    "stage_table", "verdict_lines",
]

# Piped or captured output gets 120 columns rather than rich's 80, so tables stay readable.
console = Console(highlight=False, emoji=False, width=None if sys.stdout.isatty() else 120)
_COLORS = {"data": "red", "h2d": "magenta", "forward": "cyan", "backward": "blue", "optimizer": "green", "other": "white"}


def progress() -> Progress:
    """A transient progress bar (description, bar, i/N, note, elapsed and remaining time) whose
    description and note are plain text, never markup."""
    return Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(),
                    TextColumn("{task.completed}/{task.total}"), TextColumn("{task.fields[note]}", markup=False),
                    TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True)


def _ms(seconds: float | None) -> str:
    s = number(seconds)
    return "n/a" if s is None else f"{s * 1e3:.2f}"


def stage_table(summary: Summary, title: str = "Stages of one step") -> Table:
    """Milliseconds and share per stage of one measurement, with a bar per stage."""
    t = Table(title=title, title_justify="left")
    t.add_column("stage"), t.add_column("ms/step", justify="right"), t.add_column("share", justify="right"), t.add_column("")
    for s in stage_names(summary):
        v = summary.stages.get(s)
        if v is None:
            continue
        share = number(v.share) or 0.0
        t.add_row(escape(s), _ms(v.s), f"{share:.1%}", f"[{_COLORS.get(s, 'white')}]{'█' * round(40 * share)}[/]")
    return t


def measurement_lines(summary: Summary) -> list[str]:
    """Throughput, step times, windows and their spread, memory and one-time costs."""
    st = summary.step_time_s
    wins = ", ".join(f"{x:.0f}" for x in summary.windows_samples_per_s)
    return [
        f"throughput [bold]{summary.samples_per_s:.1f}[/] samples/s   "
        f"step median {_ms(st.median)} ms, p90 {_ms(st.p90)} ms",
        f"windows (samples/s): {wins}   spread (CV) {summary.window_cv:.1%}",
        f"peak memory {format_bytes(summary.peak_memory_bytes)} (tensors)   peak RSS {format_bytes(summary.peak_rss_bytes)}",
        "one-time: " + escape(", ".join(f"{k} {v:.3f} s" for k, v in summary.one_time.items())),
    ] + [f"rank {r} (of {summary.world_size}, global throughput above): " + ", ".join(
        f"{k} {_ms(v.s)} ms ({v.share:.0%})" for k, v in stages.items() if v.s > 0)
        for r, stages in enumerate(summary.rank_stages)]


def verdict_lines(v: Verdict) -> list[str]:
    """The bottleneck with its reason and slowest stage, then the evidence."""
    ev = {k: x for k, x in v.evidence.items() if k != "stage_shares" and x is not None}
    lines = [(f"Bottleneck: [bold yellow]{v.bottleneck.value}[/]  ({escape(v.reason)}); "
              f"slowest stage: {escape(str(v.slowest_stage))}")]
    for i, w in enumerate(v.wastes, 1):
        bound = "" if w.max_gain is None else f", a fix gains at most {w.max_gain:.2f}x"
        lines.append(f"  {i}. {w.cls.value}: {w.share:.1%} of the step{bound} ({escape(w.reason)})")
    lines.append("evidence: " + escape(", ".join(f"{k}={round(x, 4) if isinstance(x, float) else x}" for k, x in ev.items())))
    return lines


def recipe_table(recipes: Sequence[Recipe], device: str | None = None, facts: dict[str, bool] | None = None,
                 title: str = "Recipe ladder (cheapest first)") -> Table:
    """The recipes with their cost rank, targets and knobs; with a device, whether each
    applies there. The rows keep the given order (tune's order is by expected gain per second)."""
    t = Table(title=title, title_justify="left")
    for c in ("cost", "recipe", "targets", "knobs", "applies", "what it does"):
        t.add_column(c, overflow="fold")
    for r in recipes:
        ok, why = r.applies(device, facts or {}) if device else (True, "")
        t.add_row(str(r.cost), escape(r.name), ", ".join(b.value for b in r.targets), escape("\n".join(k.key for k in r.knobs)),
                  ("yes" if ok else f"no: {escape(why)}") if device else ", ".join(r.devices), escape(r.summary))
    return t


def print_profile(workload: str, device: str, batch_size: int, summary: Summary, verdict: Verdict,
                  recipes: Sequence[Recipe], facts: dict[str, bool], advice: str, left_out: Sequence[str] = ()) -> None:
    """What `autotune profile` shows: the measurement, its stages, the verdict, the recipes worth
    a search in tune's order (or `advice` where none is), and why any was `left_out`."""
    c = console
    c.print(f"[bold]{escape(workload)}[/] on {escape(device)}, batch {batch_size}, default config")
    for line in measurement_lines(summary):
        c.print(line)
    c.print(stage_table(summary))
    for line in verdict_lines(verdict):
        c.print(line)
    if recipes:
        c.print(recipe_table(recipes, device, facts, title="Recipes worth a search, by expected gain per second (what tune tries first)"))
    else:
        c.print("No recipe targets this bottleneck: " + escape(advice))
    for line in left_out:
        c.print(escape(line))


def _rate(x: float | None) -> str:
    v = number(x)
    return "n/a" if v is None else f"{v:.1f}"


def _recommendations_table(report: Report) -> Table:
    t = Table(title="Recommendations, ranked by measured gain", title_justify="left")
    for col in ("recipe", "changes", "speedup", "95% CI", "memory", "verdict"):
        t.add_column(col, overflow="fold")
    for r in report.recommendations:
        ch = ", ".join(f"{k}: {v[0]} -> {v[1]}" if len(v) == 2 else f"{k}: {v}" for k, v in r.changes.items()) or "-"
        low, high = (list(r.ci) + [None, None])[:2]
        ci = f"[{low:.2f}, {high:.2f}]" if number(low) is not None and number(high) is not None else "-"
        spd = f"{r.speedup:.2f}x" if number(r.speedup) else "-"
        t.add_row(escape(r.recipe), escape(ch), spd, escape(ci), format_bytes(r.memory_delta_bytes),
                  "[green]accepted[/]" if r.accepted else f"{verdict_word(False, r.tried)}: {escape(r.reason or '')}")
    return t


def print_tune_summary(report: Report, out: str | Path) -> None:
    """The end of `autotune tune`: throughput before and after, speedup, noise, recommendations,
    why it stopped (and what a person can do), the budget, and the folder `out` written."""
    c = console
    base = report.baseline.samples_per_s if report.baseline is not None else None
    final = report.final.samples_per_s if report.final is not None else None
    c.print(f"\n[bold]{escape(report.workload)}[/] on {escape(report.device)}: "
            f"baseline {_rate(base)} samples/s -> final {_rate(final)} samples/s")
    sp = report.speedup
    if sp is not None and sp.measured and number(sp.ratio):
        c.print(f"speedup (final vs baseline, interleaved): [bold green]{sp.ratio:.2f}x[/] \\[{sp.low:.2f}, {sp.high:.2f}]")
    n = report.noise
    if n is not None and n.measured:
        c.print(f"noise (A/A): {n.ratio:.3f} \\[{n.low:.3f}, {n.high:.3f}]; a change is kept when its looks make a "
                f"gain past {1 + n.min_gain:.3f}x near certain ({1 - n.alpha:g})")
    if busy := noise_warning(report):
        c.print(f"[yellow]warning:[/] {escape(busy)}")
    c.print(_recommendations_table(report))
    d = report.diagnosis
    c.print(f"final diagnosis: {d.bottleneck.value} ({escape(d.reason)})" if d is not None else "final diagnosis: not recorded")
    lines = stop_lines(report)
    c.print(f"stopped: {escape(lines[0][1])}")
    for label, text in lines[1:]:
        c.print(f"  {escape(label[0].lower() + label[1:])}: {escape(text)}")
    b = report.budget
    if b is not None:
        c.print(f"trials used {b.trials_used} of {b.trials_limit}, wall {b.wall_s:.0f} s")
    c.print(f"wrote {escape(str(out))}/tuned.yaml, report.json, report.md, report.html")


class Display:
    """The live progress of `autotune tune` on `prog` (an `autotune.events.Listener`): a task per
    phase or round, each trial advancing it with the best so far, each decision printed above."""

    def __init__(self, prog: Progress) -> None:
        self.prog = prog
        self.task: TaskID | None = None
        self.best: float | None = None
        # `progress()` shows descriptions and notes as plain text; a Progress whose columns
        # read them as markup gets them escaped instead.
        self._markup = {field: any(isinstance(c, TextColumn) and c.markup and field in c.text_format for c in prog.columns)
                        for field in ("task.description", "task.fields[note]")}

    def _plain(self, text: str, field: str) -> str:
        return escape(text) if self._markup[field] else text

    def _start(self, label: str, total: int | None) -> None:
        if self.task is not None:
            self.prog.remove_task(self.task)
        self.task = self.prog.add_task(self._plain(label, "task.description"), total=total, note="")

    def phase(self, name: str) -> None:
        """A measurement phase began: a task without a known length."""
        self._start(name, None)

    def recipe(self, round_no: int, recipe: str, trials: int) -> None:
        """A recipe's search began: a task of `trials` steps, best reset."""
        self.best = None
        self._start(f"round {round_no}: {recipe}", trials)

    def trial(self, trial: Trial) -> None:
        """A trial finished: advance, and note the best throughput (or why this one failed)."""
        if self.task is None:
            self._start("trials", None)
        v = number(trial.samples_per_s)
        if v is not None and (self.best is None or v > self.best):
            self.best = v
        note = f"best {self.best:.0f} samples/s" if self.best else (trial.reason or "")[:60]
        self.prog.update(self.task, advance=1, note=self._plain(" ".join(note.split()), "task.fields[note]"))

    def decision(self, recipe: str, accepted: bool, reason: str) -> None:
        """A candidate was accepted or rejected: print it above the bar."""
        mark = "[green]accepted[/]" if accepted else "[yellow]rejected[/]"
        self.prog.console.print(f"{escape(recipe)}: {mark}: {escape(reason)}")
