"""`report.html`: one self-contained page, with inline CSS and SVG charts drawn here.

No script, stylesheet, font or image is fetched: the file opens offline and can be mailed.
Three pictures lead (where a step's time goes before and after, what each step gained
against the noise, how the search went), then the same tables as `report.md`.
Every piece of text from the report passes through `html.escape`.
"""

from __future__ import annotations

import html
import math
import re
from typing import Any

from .report import (
    Code, Table, as_dict, as_list, comparison_table, evidence_table, fmt_bytes, fmt_ci, fmt_ms,
    fmt_rate, fmt_ratio, fmt_value, headline, missing_parts, noise_text, number, protocol_table,
    recommendation_table, run_table, stage_ms, stage_names, stage_table, step_title, step_verdict,
    trial_table, budget_text, NOT_RECORDED,
)

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
_NUMERIC = {"#", "trial", "speedup", "CI", "memory", "samples/s", "peak memory", "baseline", "final",
            "change", "baseline ms/step", "final ms/step", "share", "one-time cost", "pays off after"}
_BADGES = {"verdict", "state"}


def e(x: Any) -> str:
    return html.escape(str(x), quote=True)


# --- SVG primitives -----------------------------------------------------------------------


def _f(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


def _text(x: float, y: float, s: Any, anchor: str = "start", size: int = 12, fill: str = INK, bold: bool = False) -> str:
    weight = ' font-weight="600"' if bold else ""
    return (f'<text x="{_f(x)}" y="{_f(y)}" text-anchor="{anchor}" font-size="{size}" '
            f'fill="{fill}"{weight}>{e(s)}</text>')


def _rect(x: float, y: float, w: float, h: float, fill: str, title: str | None = None, rx: float = 0) -> str:
    tip = f"<title>{e(title)}</title>" if title else ""
    return f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(max(w, 0))}" height="{_f(max(h, 0))}" rx="{rx}" fill="{fill}">{tip}</rect>'


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
    hi = hi if hi > 0 else 1.0
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


def _empty(message: str) -> str:
    return f'<p class="empty">{e(message)}</p>'


def _stage_color(stage: str, i: int) -> tuple[str, str]:
    return STAGE_COLORS.get(stage) or EXTRA_COLORS[i % len(EXTRA_COLORS)]


# --- the three pictures -------------------------------------------------------------------


def stage_chart(report: dict[str, Any]) -> str:
    """Horizontal stacked bars: ms per step by stage, baseline above final, one scale."""
    b, f = as_dict(report.get("baseline")), as_dict(report.get("final"))
    bars = [(name, s) for name, s in (("baseline", b), ("final", f)) if as_dict(s.get("stages"))]
    if not bars:
        return _empty("No stage times were recorded.")
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
        body.append(_text(left - 12, y + bar_h / 2 + 14, f"{fmt_rate(s.get('samples_per_s'))} samples/s", "end", 11, MUTED))
        x = left
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
    return _svg(bottom + 46, body, "stage breakdown of one step, before and after tuning")


def speedup_chart(report: dict[str, Any]) -> str:
    """Bars per step (and overall) with CI whiskers, the 1x line and the noise margin."""
    items = []
    for step in as_list(report.get("steps")):
        step, sp = as_dict(step), as_dict(as_dict(step).get("speedup"))
        if number(sp.get("ratio")) is not None:
            color = ACCEPTED if step.get("accepted") else REJECTED
            items.append((f"round {fmt_value(step.get('round'))}", str(step.get("recipe", "?")), sp, color))
    overall = as_dict(report.get("speedup"))
    if number(overall.get("ratio")) is not None:
        items.append(("final vs", "baseline", overall, OVERALL))
    if not items:
        return _empty("No step was measured against its baseline.")
    margin = number(as_dict(report.get("noise")).get("margin"))
    values = [number(sp.get(k)) for _, _, sp, _ in items for k in ("ratio", "high")]
    ticks = _nice_ticks(max([v for v in values if v is not None] + [margin or 0, 1.0]) * 1.08)
    left, right, top, plot_h = 64, 24, 40, 230
    slot = (WIDTH - left - right) / len(items)
    bar_w = min(64.0, slot * 0.55)

    def y(v: float) -> float:
        return top + plot_h - v / ticks[-1] * plot_h

    body = _legend([(_box(ACCEPTED), "accepted"), (_box(REJECTED), "rejected"), (_box(OVERALL), "final vs baseline"),
                    (_line(0, 6, 14, 6, MUTED, 1.5), "no change (1×)")]
                   + ([(_line(0, 6, 14, 6, MARGIN, 2, "5 3"), f"noise margin ({fmt_ratio(margin)})")] if margin else []),
                   left, 16)
    for t in ticks:
        body += [_line(left, y(t), WIDTH - right, y(t), GRID), _text(left - 8, y(t) + 4, f"{_tick(t)}×", "end", 11, MUTED)]
    for i, (l1, l2, sp, color) in enumerate(items):
        cx = left + (i + 0.5) * slot
        r, lo, hi = number(sp.get("ratio")) or 0.0, number(sp.get("low")), number(sp.get("high"))
        tip = f"{l1} {l2}: {fmt_ratio(r)} (CI {fmt_ci(lo, hi)})"
        body.append(_rect(cx - bar_w / 2, y(r), bar_w, y(0) - y(r), color, tip, rx=3))
        top_y = y(r)
        if lo is not None and hi is not None:
            body += [_line(cx, y(lo), cx, y(hi), INK, 1.5), _line(cx - 8, y(lo), cx + 8, y(lo), INK, 1.5),
                     _line(cx - 8, y(hi), cx + 8, y(hi), INK, 1.5)]
            top_y = min(top_y, y(hi))
        body.append(_text(cx, top_y - 7, fmt_ratio(r), "middle", 12, INK, bold=True))
        body += [_text(cx, top + plot_h + 18, l1, "middle", 11, MUTED),
                 _text(cx, top + plot_h + 33, _fit(l2, slot - 8, 6.8), "middle", 12)]
    body.append(_line(left, y(1), WIDTH - right, y(1), MUTED, 1.5))
    if margin:
        body.append(_line(left, y(margin), WIDTH - right, y(margin), MARGIN, 2, "6 4"))
    body.append(_line(left, y(0), WIDTH - right, y(0), INK))
    return _svg(top + plot_h + 44, body, "speedup of each step with confidence intervals")


def _marker(x: float, y: float, state: str, tip: str) -> str:
    t = f"<title>{e(tip)}</title>"
    if state == "ok":
        return f'<circle cx="{_f(x)}" cy="{_f(y)}" r="5" fill="{OK}" fill-opacity="0.85">{t}</circle>'
    if state == "infeasible":
        pts = f"{_f(x)},{_f(y - 6)} {_f(x + 6)},{_f(y)} {_f(x)},{_f(y + 6)} {_f(x - 6)},{_f(y)}"
        return f'<polygon points="{pts}" fill="#fff" stroke="{INFEASIBLE}" stroke-width="2">{t}</polygon>'
    return (f'<path d="M{_f(x - 5)},{_f(y - 5)}L{_f(x + 5)},{_f(y + 5)}M{_f(x - 5)},{_f(y + 5)}L{_f(x + 5)},{_f(y - 5)}" '
            f'stroke="{FAILED}" stroke-width="2.2">{t}</path>')


def history_chart(report: dict[str, Any]) -> str:
    """Scatter of every trial in the order tried: samples/s, by state, rounds shaded."""
    points, rounds = [], []
    for step in as_list(report.get("steps")):
        step = as_dict(step)
        trials = [as_dict(t) for t in as_list(step.get("trials"))]
        start = len(points)
        for t in trials:
            state = str(t.get("state") or "failed")
            changes = ", ".join(f"{k}: {fmt_value(v[1]) if isinstance(v, list) and len(v) == 2 else fmt_value(v)}"
                                for k, v in as_dict(t.get("changes")).items())
            tip = (f"{step.get('recipe', '?')} trial {fmt_value(t.get('number'))}: {fmt_rate(t.get('samples_per_s'))} "
                   f"samples/s, {state}" + (f" ({t['reason']})" if t.get("reason") else "") + (f"; {changes}" if changes else ""))
            points.append((number(t.get("samples_per_s")), state, tip))
        if trials:
            rounds.append((start, len(points) - 1, str(step.get("recipe", "?")), bool(step.get("accepted"))))
    if not points:
        return _empty("No trials were run.")
    base = number(as_dict(report.get("baseline")).get("samples_per_s"))
    final = number(as_dict(report.get("final")).get("samples_per_s"))
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

    body = _legend([(f'<circle cx="6" cy="6" r="5" fill="{OK}"/>', "trial"),
                    (_marker(6, 6, "infeasible", "infeasible"), "infeasible"), (_marker(6, 6, "failed", "failed"), "failed"),
                    (_line(0, 6, 14, 6, MUTED, 1.5, "5 3"), "baseline"), (_line(0, 6, 14, 6, ACCEPTED, 2, "5 3"), "final")],
                   left, 16)
    for k, (a, b, name, accepted) in enumerate(rounds):
        x0, x1 = x(a) - step_x / 2, x(b) + step_x / 2
        body.append(_rect(x0, top - 20, x1 - x0, axis_y - top + 20, "#f6f7f9" if k % 2 == 0 else "#ffffff"))
        body.append(_text((x0 + x1) / 2, top - 6, _fit(name, x1 - x0 - 6, 6.5), "middle", 11, ACCEPTED if accepted else MUTED, bold=accepted))
    for t in ticks:
        body += [_line(left, y(t), WIDTH - right, y(t), GRID), _text(left - 8, y(t) + 4, _tick(t), "end", 11, MUTED)]
    body.append(_text(16, top + plot_h / 2, "samples/s", "middle", 11, MUTED).replace(
        "<text ", f'<text transform="rotate(-90 16 {_f(top + plot_h / 2)})" ', 1))
    if has_none:
        body.append(_text(left - 8, top + plot_h + 17, "no result", "end", 10, MUTED))
    for value, color, dash in ((base, MUTED, "6 4"), (final, ACCEPTED, "6 4")):
        if value is not None:
            body.append(_line(left, y(value), WIDTH - right, y(value), color, 2 if color == ACCEPTED else 1.5, dash))
    for i, (v, state, tip) in enumerate(points):
        body.append(_marker(x(i), y(v) if v is not None else top + plot_h + 13, state, tip))
    body.append(_line(left, axis_y, WIDTH - right, axis_y, INK))
    every = max(1, math.ceil(n / 24))
    for i in range(0, n, every):
        body.append(_text(x(i), axis_y + 16, str(i + 1), "middle", 11, MUTED))
    body.append(_text(WIDTH - right, axis_y + 34, "trials, in the order tried", "end", 11, MUTED))
    return _svg(axis_y + 42, body, "search history: samples per second of every trial")


# --- tables and page ----------------------------------------------------------------------


def _cell(c: Any, badge: bool = False) -> str:
    if isinstance(c, list):
        return "<br>".join(_cell(x) for x in c)
    if isinstance(c, Code):
        return f"<code>{e(c)}</code>"
    if badge and c:
        word, rest = re.match(r"(\w*)[:,]?\s*(.*)", str(c), re.S).groups()
        return f'<span class="badge {e(word)}">{e(word)}</span>' + (f' <span class="why">{e(rest)}</span>' if rest else "")
    return e(c)


def _table(table: Table, cls: str = "") -> str:
    headers, rows = table
    if not rows:
        return _empty("none")
    num = [h in _NUMERIC for h in headers]
    head = "".join(f'<th{" class=num" if n else ""}>{e(h)}</th>' for h, n in zip(headers, num))
    body = "".join(
        "<tr>" + "".join(f'<td{" class=num" if n else ""}>{_cell(c, h in _BADGES)}</td>' for c, h, n in zip(row, headers, num))
        + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _kpis(report: dict[str, Any]) -> str:
    """Headline tiles: the final value large, the baseline it came from small."""
    b, f = as_dict(report.get("baseline")), as_dict(report.get("final"))
    sp, d0, d1 = as_dict(report.get("speedup")), as_dict(report.get("initial_diagnosis")), as_dict(report.get("diagnosis"))

    def tile(label: str, get, fmt, unit: str = "") -> tuple[str, str, str]:
        if f:
            return label, fmt(get(f)) + unit, f"from {fmt(get(b))}{unit}" if b else "no baseline recorded"
        return label, (fmt(get(b)) + unit) if b else "n/a", "baseline; no final measurement"

    def med(s: dict[str, Any]) -> float | None:
        m = number(as_dict(s.get("step_time_s")).get("median"))
        return None if m is None else m * 1e3

    pairs = number(sp.get("pairs"))
    if d1:
        verdict = (d1.get("bottleneck", "?"), f"was {d0.get('bottleneck', '?')}; slowest stage {d1.get('slowest_stage', '?')}"
                   if d0 else f"slowest stage {d1.get('slowest_stage', '?')}")
    else:
        verdict = (d0.get("bottleneck", "n/a"), "before tuning; final not diagnosed")
    measured = number(sp.get("ratio")) is not None
    tiles = [
        ("speedup", fmt_ratio(sp.get("ratio")) if measured else "n/a",
         f"CI {fmt_ci(sp.get('low'), sp.get('high'))}" + (f" · {pairs:.0f} pairs" if pairs else "") if measured
         else "not measured: no final measurement"),
        tile("samples/s", lambda s: s.get("samples_per_s"), fmt_rate),
        tile("step time (median)", med, fmt_ms),
        tile("peak tensor memory", lambda s: s.get("peak_memory_bytes"), fmt_bytes),
        ("bottleneck now", *verdict),
    ]
    return '<section class="kpis">' + "".join(
        f'<div class="kpi{" good" if k == "speedup" and measured else ""}"><div class="label">{e(k)}</div><div class="value">{e(v)}</div><div class="note">{e(n)}</div></div>'
        for k, v, n in tiles) + "</section>"


def _diagnosis(title: str, diag: Any) -> str:
    diag = as_dict(diag)
    if not diag:
        return f"<div><h3>{e(title)}</h3>{_empty(NOT_RECORDED)}</div>"
    return (f'<div><h3>{e(title)}: <span class="pill">{e(diag.get("bottleneck", "?"))}</span></h3>'
            f'<p>{e(diag.get("reason") or "no reason given")}. Slowest stage: <b>{e(diag.get("slowest_stage", "?"))}</b>.</p>'
            f"<details open><summary>evidence</summary>{_table(evidence_table(diag))}</details></div>")


def _card(title: str, lede: str, *content: str, anchor: str = "") -> str:
    ident = f' id="{anchor}"' if anchor else ""
    lede_html = f'<p class="lede">{e(lede)}</p>' if lede else ""
    return f'<section class="card"{ident}><h2>{e(title)}</h2>{lede_html}{"".join(content)}</section>'


def render_html(report: dict[str, Any]) -> str:
    report = as_dict(report)
    m = as_dict(report.get("machine"))
    sub = " · ".join(str(p) for p in (report.get("target"), report.get("device"), m.get("cpu"),
                                       m.get("cores") and f"{m['cores']} cores", m.get("torch") and f"torch {m['torch']}") if p)
    missing = missing_parts(report)
    notice = f'<div class="notice"><b>This run is incomplete.</b> Not recorded: {e("; ".join(missing))}.</div>' if missing else ""
    snippets = "".join(
        f'<h3>{e(r.get("recipe", "?"))} <span class="muted">{e(fmt_ratio(r.get("speedup")))}</span></h3>'
        f'<pre><code>{e(str(r["snippet"]).rstrip())}</code></pre>'
        for r in map(as_dict, as_list(report.get("recommendations"))) if r.get("accepted") and r.get("snippet"))
    steps = "".join(
        f'<div class="step"><h3>{e(step_title(s))}</h3><p>{_cell(step_verdict(s), badge=True)}</p>'
        f'<details open><summary>{len(as_list(s.get("trials")))} trials</summary>{_table(trial_table(s))}</details></div>'
        for s in map(as_dict, as_list(report.get("steps")))) or _empty("No recipe was tried.")
    body = [
        f'<header><div class="eyebrow">autotune report</div><h1>{e(report.get("workload") or "unnamed workload")}</h1>'
        f'<div class="sub">{e(sub)}</div><p class="headline">{e(headline(report))}</p></header>',
        notice, _kpis(report),
        _card("Where a step's time goes", "Milliseconds per training step, by stage, at the baseline and with the tuned config.",
              stage_chart(report), _table(stage_table(report))),
        _card("What each step gained", "Measured speedup over the config before it, with its confidence interval. "
              "A step is kept only when its interval clears the noise margin. " + noise_text(report), speedup_chart(report)),
        _card("Search history", "Every trial's throughput, in the order tried; each band is one recipe's search.",
              history_chart(report)),
        _card("Recommendations", "Ranked by measured gain, accepted first.", _table(recommendation_table(report)), snippets,
              anchor="recommendations"),
        _card("Diagnosis", "", '<div class="cols">', _diagnosis("Before tuning", report.get("initial_diagnosis")),
              _diagnosis("After tuning", report.get("diagnosis")), "</div>"),
        _card("Steps tried", "", steps),
        _card("Baseline and final", "", _table(comparison_table(report))),
        _card("Run", "", '<div class="cols">', "<div>", _table(run_table(report), "kv"), "</div><div>",
              _table(protocol_table(report), "kv"), "</div></div>"),
        _card("How it ended", "", f"<p><b>Stop reason:</b> {e(report.get('stop_reason') or NOT_RECORDED)}</p>",
              f"<p><b>Budget:</b> {e(budget_text(report))}</p>"),
        f'<footer>autotune {e(report.get("autotune_version") or "")}: self-contained report, no network needed</footer>',
    ]
    title = f"autotune: {report.get('workload') or 'report'}"
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>{e(title)}</title>'
            f"<style>{_CSS}</style></head><body><main>{''.join(body)}</main></body></html>\n")


_CSS = """
:root{--fg:#1f2937;--muted:#6b7280;--line:#e5e7eb;--bg:#f4f5f7;--card:#fff}*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
main{max-width:1100px;margin:0 auto;padding:32px 24px 48px}
h1{margin:2px 0 4px;font-size:28px;letter-spacing:-.01em}h2{font-size:18px;margin:0 0 4px}
h3{font-size:15px;margin:14px 0 4px}
.eyebrow{text-transform:uppercase;letter-spacing:.08em;font-size:12px;color:var(--muted);font-weight:600}
.sub,.muted,.lede,.empty,.why{color:var(--muted)}.lede{margin:0 0 10px}
.headline{font-size:17px;font-weight:600;margin:12px 0 0}
.kpis{display:grid;grid-template-columns:repeat(auto-fit,minmax(190px,1fr));gap:12px;margin:20px 0}
.kpi{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 16px}
.kpi .label{font-size:11px;color:var(--muted);text-transform:uppercase;letter-spacing:.06em;font-weight:600}
.kpi .value{font-size:21px;font-weight:650;margin-top:2px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.kpi .note{font-size:12px;color:var(--muted)}.kpi.good .value{color:#2f7d32;font-size:26px}
.card{background:var(--card);border:1px solid var(--line);border-radius:12px;padding:20px 22px;margin:16px 0}
.notice{background:#fff8e6;border:1px solid #f3d38a;border-radius:10px;padding:10px 14px;margin:16px 0}
table{border-collapse:collapse;width:100%;font-size:13px;margin:8px 0}
th{text-align:left;font-weight:600;color:var(--muted);border-bottom:2px solid var(--line);padding:6px 8px;white-space:nowrap}
td{border-bottom:1px solid var(--line);padding:6px 8px;vertical-align:top}
tbody tr:nth-child(even){background:#fafbfc}
.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}table.kv thead{display:none}
table.kv td:first-child{color:var(--muted);white-space:nowrap;width:1%}
code{font:12px ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;background:#f1f3f5;border-radius:4px;padding:1px 5px;white-space:nowrap}
pre{background:#111827;color:#e5e7eb;border-radius:8px;padding:12px 14px;overflow:auto}
pre code{background:none;color:inherit;padding:0;white-space:pre}
.badge{display:inline-block;border-radius:999px;padding:0 9px;font-size:12px;font-weight:600;background:#eef0f3;color:#4b5563}
.badge.accepted,.badge.ok{background:#e3f2e6;color:#1e6b34}.badge.infeasible{background:#fdefdc;color:#93520c}
.badge.failed{background:#fde5e5;color:#a11a1a}
.pill{background:#eef2f8;color:#2c4f7c;border-radius:6px;padding:1px 8px;font-size:14px}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:24px}.cols>*{min-width:0}
table.kv code,td:last-child code{white-space:normal;overflow-wrap:anywhere}
@media (max-width:820px){.cols{grid-template-columns:1fr}}
.step+.step{border-top:1px solid var(--line);margin-top:14px}.step h3{margin-top:12px}.step p{margin:2px 0}
details summary{cursor:pointer;color:var(--muted);font-weight:600;margin:6px 0}
svg{display:block;margin:6px 0 10px;max-width:100%}
footer{color:var(--muted);font-size:12px;text-align:center;margin-top:24px}
"""
