"""The SVG pictures of `report.html`, drawn here as text: no library, no script, no fetch.

Three charts read the typed `Report`: where a step's time goes before and after
(`stage_chart`), what each step gained against the noise (`speedup_chart`), and how the
search went (`history_chart`). Every piece of text passes through `html.escape`.
"""

from __future__ import annotations

import html
import math
from typing import Any

from autotune.record import Ratio, Report, Summary, Trial

from .fmt import fmt_ci, fmt_ms, fmt_rate, fmt_ratio, fmt_value, number
from .tables import stage_ms, stage_names

__all__ = ["e", "empty", "history_chart", "speedup_chart", "stage_chart"]

# (fill, text on it): the stage palette, so that the same stage has the same colour everywhere.
STAGE_COLORS = {
    "data": ("#f28e2b", "#fff"), "h2d": ("#edc948", "#3b3b3b"), "forward": ("#4e79a7", "#fff"),
    "backward": ("#76b7b2", "#fff"), "optimizer": ("#59a14f", "#fff"), "other": ("#bab0ac", "#3b3b3b"),
}
EXTRA_COLORS = [("#b07aa1", "#fff"), ("#ff9da7", "#3b3b3b"), ("#9c755f", "#fff"), ("#e15759", "#fff")]
ACCEPTED, REJECTED, OVERALL, MARGIN, OK, INFEASIBLE, FAILED = (
    "#59a14f", "#c5c9d0", "#4e79a7", "#e15759", "#4e79a7", "#f28e2b", "#d62728")
GRID, MUTED, INK = "#e5e7eb", "#6b7280", "#1f2937"
WIDTH = 960


def e(x: Any) -> str:
    """Any value as escaped HTML text (quotes too, so it is safe in attributes)."""
    return html.escape(str(x), quote=True)


def empty(message: str) -> str:
    """A muted paragraph standing in for a chart or table with nothing to show."""
    return f'<p class="empty">{e(message)}</p>'


# --- SVG primitives -----------------------------------------------------------------------


def _f(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _text(x: float, y: float, s: Any, anchor: str = "start", size: int = 12, fill: str = INK, bold: bool = False) -> str:
    weight = ' font-weight="600"' if bold else ""
    return (f'<text x="{_f(x)}" y="{_f(y)}" text-anchor="{anchor}" font-size="{size}" '
            f'fill="{fill}"{weight}>{e(s)}</text>')


def _rect(x: float, y: float, w: float, h: float, fill: str, title: str | None = None, rx: float = 0) -> str:
    tip = f"<title>{e(title)}</title>" if title else ""
    return (f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(max(w, 0))}" height="{_f(max(h, 0))}" rx="{rx}" '
            f'fill="{fill}">{tip}</rect>')


def _line(x1: float, y1: float, x2: float, y2: float, stroke: str, width: float = 1, dash: str | None = None) -> str:
    d = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<line x1="{_f(x1)}" y1="{_f(y1)}" x2="{_f(x2)}" y2="{_f(y2)}" stroke="{stroke}" '
            f'stroke-width="{width}"{d}/>')


def _svg(height: float, body: list[str], label: str) -> str:
    return (f'<svg viewBox="0 0 {WIDTH} {_f(height)}" width="100%" role="img" aria-label="{e(label)}" '
            f'font-family="system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif">'
            + "".join(body) + "</svg>")


def _legend(items: list[tuple[str, str]], x: float, y: float) -> list[str]:
    """A row of (swatch svg at 0,0 12x12, label) entries starting at x, baseline y."""
    out = []
    for swatch, label in items:
        out.append(f'<g transform="translate({_f(x)},{_f(y - 10)})">{swatch}</g>')
        out.append(_text(x + 18, y, label, size=12, fill=MUTED))
        x += 18 + 6.8 * len(label) + 22
    return out


def _box(color: str) -> str:
    return _rect(0, 0, 12, 12, color, rx=2)


def _nice_ticks(hi: float, n: int = 5) -> list[float]:
    """Round tick values from 0 to at least `hi`."""
    # A report may hold any finite number: keep the scale where floats can still be stepped.
    hi = min(max(hi, 1e-9), 1e300) if math.isfinite(hi) and hi > 0 else 1.0
    raw = hi / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))
    return [i * step for i in range(math.ceil(hi / step - 1e-9) + 1)]


def _tick(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:g}"


def _fit(label: str, width: float, char_w: float) -> str:
    """The label, cut with an ellipsis to about `width` px (the full text is in the tooltip)."""
    if len(label) * char_w <= width:
        return label
    return label[: max(1, int(width / char_w) - 1)] + "…"


def _stage_color(stage: str, i: int) -> tuple[str, str]:
    return STAGE_COLORS.get(stage) or EXTRA_COLORS[i % len(EXTRA_COLORS)]


# --- where a step's time goes -------------------------------------------------------------


def _stage_bar(s: Summary, stages: list[str], total: float, x: float, y: float, scale: float, bar_h: float) -> list[str]:
    body = []
    for i, st in enumerate(stages):
        ms = stage_ms(s, st) or 0.0
        w = ms * scale
        if w <= 0:
            continue
        fill, ink = _stage_color(st, i)
        share = ms / total if total else 0
        body.append(_rect(x, y, w, bar_h, fill, f"{st}: {fmt_ms(ms)} per step ({share:.0%})"))
        label = fmt_ms(ms).replace(" ms", "")
        if w > 8 * len(label) + 10:
            body.append(_text(x + w / 2, y + bar_h / 2 + 4, label, "middle", 11, ink))
        x += w
    body.append(_text(x + 8, y + bar_h / 2 + 5, fmt_ms(total), size=13, bold=True))
    return body


def stage_chart(report: Report) -> str:
    """Horizontal stacked bars of ms per step by stage, baseline above final on one scale, as an
    `<svg>`; a short paragraph where no stage times were recorded."""
    b, f = report.baseline, report.final
    bars = [(name, s) for name, s in (("baseline", b), ("final", f)) if s is not None and s.stages]
    if not bars:
        return empty("No stage times were recorded.")
    stages = stage_names(b, f)
    totals = [sum(stage_ms(s, st) or 0 for st in stages) for _, s in bars]
    ticks = _nice_ticks(max(totals))
    left, right, top, bar_h, gap = 120, 80, 46, 40, 22
    scale = (WIDTH - left - right) / ticks[-1]
    bottom = top + len(bars) * (bar_h + gap) - gap
    body = _legend([(_box(_stage_color(st, i)[0]), st) for i, st in enumerate(stages)], left, 18)
    for t in ticks:
        x = left + t * scale
        body += [_line(x, top - 8, x, bottom + 6, GRID), _text(x, bottom + 22, _tick(t), "middle", 11, MUTED)]
    body.append(_text(WIDTH - right, bottom + 40, "ms per step", "end", 11, MUTED))
    for row, ((name, s), total) in enumerate(zip(bars, totals)):
        y = top + row * (bar_h + gap)
        body.append(_text(left - 12, y + bar_h / 2 - 2, name, "end", 13, INK, bold=True))
        body.append(_text(left - 12, y + bar_h / 2 + 14, f"{fmt_rate(s.samples_per_s)} samples/s", "end", 11, MUTED))
        body += _stage_bar(s, stages, total, left, y, scale, bar_h)
    return _svg(bottom + 46, body, "stage breakdown of one step, before and after tuning")


# --- what each step gained ----------------------------------------------------------------


def _speedup_items(report: Report) -> list[tuple[str, str, Ratio, str]]:
    """(label line 1, label line 2, ratio, colour) per measured step, then the overall ratio."""
    items = [(f"round {step.round}", step.recipe, step.speedup, ACCEPTED if step.accepted else REJECTED)
             for step in report.steps if step.speedup is not None and number(step.speedup.ratio) is not None]
    if report.speedup is not None and number(report.speedup.ratio) is not None:
        items.append(("final vs", "baseline", report.speedup, OVERALL))
    return items


def _speedup_legend(bar: float | None, left: float) -> list[str]:
    items = [(_box(ACCEPTED), "accepted"), (_box(REJECTED), "rejected"), (_box(OVERALL), "final vs baseline"),
             (_line(0, 6, 14, 6, MUTED, 1.5), "no change (1×)")]
    if bar:
        items.append((_line(0, 6, 14, 6, MARGIN, 2, "5 3"), f"least gain kept ({fmt_ratio(bar)})"))
    return _legend(items, left, 16)


def speedup_chart(report: Report) -> str:
    """Bars per step (and overall) with CI whiskers, the 1x line and the least gain kept, as an
    `<svg>`; steps without a measured speedup are left out."""
    items = _speedup_items(report)
    if not items:
        return empty("No step was measured against its baseline.")
    gain = number(report.noise.min_gain) if report.noise is not None else None
    bar = 1 + gain if gain is not None else None
    values = [number(v) for _, _, sp, _ in items for v in (sp.ratio, sp.high)]
    ticks = _nice_ticks(max([v for v in values if v is not None] + [bar or 0, 1.0]) * 1.08)
    left, right, top, plot_h = 64, 24, 40, 230
    slot = (WIDTH - left - right) / len(items)
    bar_w = min(64.0, slot * 0.55)

    def y(v: float) -> float:
        return top + plot_h - v / ticks[-1] * plot_h

    body = _speedup_legend(bar, left)
    for t in ticks:
        body += [_line(left, y(t), WIDTH - right, y(t), GRID), _text(left - 8, y(t) + 4, f"{_tick(t)}×", "end", 11, MUTED)]
    for i, (l1, l2, sp, color) in enumerate(items):
        cx = left + (i + 0.5) * slot
        r, lo, hi = number(sp.ratio) or 0.0, number(sp.low), number(sp.high)
        body.append(_rect(cx - bar_w / 2, y(r), bar_w, y(0) - y(r), color, f"{l1} {l2}: {fmt_ratio(r)} (CI {fmt_ci(lo, hi)})", rx=3))
        top_y = y(r)
        if lo is not None and hi is not None:
            body += [_line(cx, y(lo), cx, y(hi), INK, 1.5), _line(cx - 8, y(lo), cx + 8, y(lo), INK, 1.5),
                     _line(cx - 8, y(hi), cx + 8, y(hi), INK, 1.5)]
            top_y = min(top_y, y(hi))
        body.append(_text(cx, top_y - 7, fmt_ratio(r), "middle", 12, INK, bold=True))
        body += [_text(cx, top + plot_h + 18, l1, "middle", 11, MUTED),
                 _text(cx, top + plot_h + 33, _fit(l2, slot - 8, 6.8), "middle", 12)]
    body.append(_line(left, y(1), WIDTH - right, y(1), MUTED, 1.5))
    if bar:
        body.append(_line(left, y(bar), WIDTH - right, y(bar), MARGIN, 2, "6 4"))
    body.append(_line(left, y(0), WIDTH - right, y(0), INK))
    return _svg(top + plot_h + 44, body, "speedup of each step with confidence intervals")


# --- how the search went ------------------------------------------------------------------


def _marker(x: float, y: float, state: str, tip: str) -> str:
    t = f"<title>{e(tip)}</title>"
    if state == "ok":
        return f'<circle cx="{_f(x)}" cy="{_f(y)}" r="5" fill="{OK}" fill-opacity="0.85">{t}</circle>'
    if state == "slow":  # stopped after a window far below the incumbent: a partial reading
        return (f'<circle cx="{_f(x)}" cy="{_f(y)}" r="4.5" fill="#fff" stroke="{OK}" stroke-width="2">{t}</circle>')
    if state == "infeasible":
        pts = f"{_f(x)},{_f(y - 6)} {_f(x + 6)},{_f(y)} {_f(x)},{_f(y + 6)} {_f(x - 6)},{_f(y)}"
        return f'<polygon points="{pts}" fill="#fff" stroke="{INFEASIBLE}" stroke-width="2">{t}</polygon>'
    return (f'<path d="M{_f(x - 5)},{_f(y - 5)}L{_f(x + 5)},{_f(y + 5)}M{_f(x - 5)},{_f(y + 5)}L{_f(x + 5)},{_f(y - 5)}" '
            f'stroke="{FAILED}" stroke-width="2.2">{t}</path>')


def _trial_tip(recipe: str, t: Trial) -> str:
    changes = ", ".join(f"{k}: {fmt_value(v[1]) if isinstance(v, list) and len(v) == 2 else fmt_value(v)}"
                        for k, v in t.changes.items())
    return (f"{recipe} trial {t.number}: {fmt_rate(t.samples_per_s)} samples/s, {t.state.value}"
            + (f" ({t.reason})" if t.reason else "") + (f"; {changes}" if changes else ""))


def _history_points(report: Report) -> tuple[list[tuple[float | None, str, str]], list[tuple[int, int, str, bool]]]:
    """Every trial as (samples/s, state, tooltip), and each round's (first, last, recipe, accepted)."""
    points: list[tuple[float | None, str, str]] = []
    rounds = []
    for step in report.steps:
        start = len(points)
        points += [(number(t.samples_per_s), t.state.value, _trial_tip(step.recipe, t)) for t in step.trials]
        if step.trials:
            rounds.append((start, len(points) - 1, step.recipe, step.accepted))
    return points, rounds


def _history_legend(left: float) -> list[str]:
    return _legend([(f'<circle cx="6" cy="6" r="5" fill="{OK}"/>', "trial"),
                    (_marker(6, 6, "infeasible", "infeasible"), "infeasible"), (_marker(6, 6, "slow", "slow"), "stopped: slow"),
                    (_marker(6, 6, "failed", "failed"), "failed"),
                    (_line(0, 6, 14, 6, MUTED, 1.5, "5 3"), "baseline"), (_line(0, 6, 14, 6, ACCEPTED, 2, "5 3"), "final")],
                   left, 16)


def history_chart(report: Report) -> str:
    """Every trial in the order tried (samples/s, by state, rounds shaded) as an `<svg>`; trials
    without a result sit on a "no result" row under the axis."""
    points, rounds = _history_points(report)
    if not points:
        return empty("No trials were run.")
    base = number(report.baseline.samples_per_s) if report.baseline is not None else None
    final = number(report.final.samples_per_s) if report.final is not None else None
    ys = [p[0] for p in points if p[0] is not None] + [v for v in (base, final) if v is not None]
    ticks = _nice_ticks(max(ys or [1.0]) * 1.05)
    left, right, top, plot_h = 72, 24, 58, 260
    n = len(points)
    step_x = (WIDTH - left - right) / n
    has_none = any(p[0] is None for p in points)
    axis_y = top + plot_h + (26 if has_none else 0)

    def x(i: float) -> float:
        return left + (i + 0.5) * step_x

    def y(v: float) -> float:
        return top + plot_h - v / ticks[-1] * plot_h

    body = _history_legend(left)
    for k, (a, b, name, accepted) in enumerate(rounds):
        x0, x1 = x(a) - step_x / 2, x(b) + step_x / 2
        body.append(_rect(x0, top - 20, x1 - x0, axis_y - top + 20, "#f6f7f9" if k % 2 == 0 else "#ffffff"))
        body.append(_text((x0 + x1) / 2, top - 6, _fit(name, x1 - x0 - 6, 6.5), "middle", 11,
                          ACCEPTED if accepted else MUTED, bold=accepted))
    for t in ticks:
        body += [_line(left, y(t), WIDTH - right, y(t), GRID), _text(left - 8, y(t) + 4, _tick(t), "end", 11, MUTED)]
    body.append(_text(16, top + plot_h / 2, "samples/s", "middle", 11, MUTED).replace(
        "<text ", f'<text transform="rotate(-90 16 {_f(top + plot_h / 2)})" ', 1))
    if has_none:
        body.append(_text(left - 8, top + plot_h + 17, "no result", "end", 10, MUTED))
    for value, color in ((base, MUTED), (final, ACCEPTED)):
        if value is not None:
            body.append(_line(left, y(value), WIDTH - right, y(value), color, 2 if color == ACCEPTED else 1.5, "6 4"))
    body += [_marker(x(i), y(v) if v is not None else top + plot_h + 13, state, tip) for i, (v, state, tip) in enumerate(points)]
    body.append(_line(left, axis_y, WIDTH - right, axis_y, INK))
    body += [_text(x(i), axis_y + 16, str(i + 1), "middle", 11, MUTED) for i in range(0, n, max(1, math.ceil(n / 24)))]
    body.append(_text(WIDTH - right, axis_y + 34, "trials, in the order tried", "end", 11, MUTED))
    return _svg(axis_y + 42, body, "search history: samples per second of every trial")
