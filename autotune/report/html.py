"""`report.html`: one self-contained page, with inline CSS and the SVG charts of `charts`.

No script, stylesheet, font or image is fetched: the file opens offline and can be mailed.
Three pictures lead (where a step's time goes before and after, what each step gained
against the noise, how the search went), then the same tables as `report.md`.
Every piece of text from the report passes through `html.escape`.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from autotune.record import Report, Summary, Verdict

from .charts import e, empty, history_chart, speedup_chart, stage_chart
from .fmt import Code, fmt_bytes, fmt_ci, fmt_ms, fmt_rate, fmt_ratio, number
from .tables import (
    NOT_RECORDED, Table, budget_text, comparison_table, evidence_table, waste_table, headline, noise_text, noise_warning,
    protocol_table, recommendation_table, run_table, stage_table, step_title, step_verdict, stop_lines, trial_table,
)

__all__ = ["render_html"]

_NUMERIC = {"#", "trial", "speedup", "CI", "memory", "samples/s", "peak memory", "baseline", "final",
            "change", "baseline ms/step", "final ms/step", "share", "one-time cost", "pays off after"}
_BADGES = {"verdict", "state"}


# --- tables -------------------------------------------------------------------------------


def _cell(c: Any, badge: bool = False) -> str:
    if isinstance(c, list):
        return "<br>".join(_cell(x) for x in c)
    if isinstance(c, Code):
        return f"<code>{e(c)}</code>"
    if badge and c:
        word, rest = re.match(r"(not tried|\w*)[:,]?\s*(.*)", str(c), re.S).groups()
        return f'<span class="badge {e(word.replace(" ", "-"))}">{e(word)}</span>' + \
            (f' <span class="why">{e(rest)}</span>' if rest else "")
    return e(c)


def _table(table: Table, cls: str = "") -> str:
    headers, rows = table
    if not rows:
        return empty("none")
    num = [h in _NUMERIC for h in headers]
    head = "".join(f'<th{" class=num" if n else ""}>{e(h)}</th>' for h, n in zip(headers, num))
    body = "".join(
        "<tr>" + "".join(f'<td{" class=num" if n else ""}>{_cell(c, h in _BADGES)}</td>' for c, h, n in zip(row, headers, num))
        + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


# --- headline tiles -----------------------------------------------------------------------


def _median_ms(s: Summary) -> float | None:
    m = number(s.step_time_s.median)
    return None if m is None else m * 1e3


def _tile(report: Report, label: str, get: Callable[[Summary], Any], fmt: Callable[[Any], str]) -> tuple[str, str, str]:
    """The final value large and the baseline it came from small; the baseline alone without a final."""
    b, f = report.baseline, report.final
    if f is not None:
        return label, fmt(get(f)), f"from {fmt(get(b))}" if b is not None else "no baseline recorded"
    return label, fmt(get(b)) if b is not None else "n/a", "baseline; no final measurement"


def _speedup_tile(report: Report) -> tuple[str, str, str]:
    sp = report.speedup
    if sp is None or number(sp.ratio) is None:
        return "speedup", "n/a", "not measured: no final measurement"
    pairs = f" · {sp.pairs} pairs" if sp.pairs else ""
    return "speedup", fmt_ratio(sp.ratio), f"CI {fmt_ci(sp.low, sp.high)}{pairs}"


def _verdict_tile(report: Report) -> tuple[str, str, str]:
    d0, d1 = report.initial_diagnosis, report.diagnosis
    if d1 is not None:
        note = f"slowest stage {d1.slowest_stage}"
        return "bottleneck now", d1.bottleneck.value, (f"was {d0.bottleneck.value}; " + note) if d0 is not None else note
    return "bottleneck now", d0.bottleneck.value if d0 is not None else "n/a", "before tuning; final not diagnosed"


def _kpis(report: Report) -> str:
    """Headline tiles: speedup, throughput, step time, memory, bottleneck."""
    measured = report.speedup is not None and number(report.speedup.ratio) is not None
    tiles = [
        _speedup_tile(report),
        _tile(report, "samples/s", lambda s: s.samples_per_s, fmt_rate),
        _tile(report, "step time (median)", _median_ms, fmt_ms),
        _tile(report, "peak tensor memory", lambda s: s.peak_memory_bytes, fmt_bytes),
        _verdict_tile(report),
    ]
    return '<section class="kpis">' + "".join(
        f'<div class="kpi{" good" if k == "speedup" and measured else ""}"><div class="label">{e(k)}</div>'
        f'<div class="value">{e(v)}</div><div class="note">{e(n)}</div></div>'
        for k, v, n in tiles) + "</section>"


# --- cards --------------------------------------------------------------------------------


def _diagnosis(title: str, verdict: Verdict | None) -> str:
    if verdict is None:
        return f"<div><h3>{e(title)}</h3>{empty(NOT_RECORDED)}</div>"
    return (f'<div><h3>{e(title)}: <span class="pill">{e(verdict.bottleneck.value)}</span></h3>'
            f'<p>{e(verdict.reason or "no reason given")}. Slowest stage: <b>{e(verdict.slowest_stage or "?")}</b>.</p>'
            f"{_table(waste_table(verdict))}"
            f"<details><summary>evidence</summary>{_table(evidence_table(verdict))}</details></div>")


def _card(title: str, lede: str, *content: str, anchor: str = "") -> str:
    ident = f' id="{anchor}"' if anchor else ""
    lede_html = f'<p class="lede">{e(lede)}</p>' if lede else ""
    return f'<section class="card"{ident}><h2>{e(title)}</h2>{lede_html}{"".join(content)}</section>'


def _header(report: Report) -> str:
    m = report.machine
    parts = (report.target, report.device, m.cpu, f"{m.cores} cores" if m.cores else "", f"torch {m.torch}" if m.torch else "")
    sub = " · ".join(p for p in parts if p)
    missing = report.missing()
    notice = (f'<div class="notice"><b>This run is incomplete.</b> Not recorded: {e("; ".join(missing))}.</div>'
              if missing else "")
    if busy := noise_warning(report):
        notice += f'<div class="notice"><b>Noisy measurements.</b> {e(busy)}</div>'
    return (f'<header><div class="eyebrow">autotune report</div><h1>{e(report.workload or "unnamed workload")}</h1>'
            f'<div class="sub">{e(sub)}</div><p class="headline">{e(headline(report))}</p></header>{notice}')


def _snippets(report: Report) -> str:
    return "".join(
        f'<h3>{e(r.recipe)} <span class="muted">{e(fmt_ratio(r.speedup))}</span></h3>'
        f'<pre><code>{e(r.snippet.rstrip())}</code></pre>'
        for r in report.recommendations if r.accepted and r.snippet)


def _steps(report: Report) -> str:
    return "".join(
        f'<div class="step"><h3>{e(step_title(s))}</h3><p>{_cell(step_verdict(s), badge=True)}</p>'
        + "".join(f'<p class="muted">range grown: {e(note)}</p>' for note in s.grown) +
        f'<details open><summary>{len(s.trials)} trials</summary>{_table(trial_table(s))}</details></div>'
        for s in report.steps) or empty("No recipe was tried.")


def _cards(report: Report) -> list[str]:
    return [
        _card("Where a step's time goes", "Milliseconds per training step, by stage, at the baseline and with the tuned config.",
              stage_chart(report), _table(stage_table(report))),
        _card("What each step gained", "Measured speedup over the config before it, with its confidence interval. "
              "A step is kept only when its side-by-side looks, each a fresh pair of sessions, make the gain near certain. " + noise_text(report), speedup_chart(report)),
        _card("Search history", "Every trial's throughput, in the order tried; each band is one recipe's search.",
              history_chart(report)),
        _card("Recommendations", "Ranked by measured gain, accepted first.", _table(recommendation_table(report)),
              _snippets(report), anchor="recommendations"),
        _card("Diagnosis", "", '<div class="cols">', _diagnosis("Before tuning", report.initial_diagnosis),
              _diagnosis("After tuning", report.diagnosis), "</div>"),
        _card("Steps tried", "", _steps(report)),
        _card("Baseline and final", "", _table(comparison_table(report))),
        _card("Run", "", '<div class="cols">', "<div>", _table(run_table(report), "kv"), "</div><div>",
              _table(protocol_table(report), "kv"), "</div></div>"),
        _card("How it ended", "", *(f"<p><b>{e(label)}:</b> {e(text)}</p>" for label, text in stop_lines(report)),
              f"<p><b>Budget:</b> {e(budget_text(report))}</p>"),
    ]


def render_html(report: Report) -> str:
    """The whole report as one self-contained HTML page (inline CSS and SVG, nothing fetched, all
    text escaped); an interrupted run's missing parts are named, not skipped."""
    body = [_header(report), _kpis(report), *_cards(report),
            f'<footer>autotune {e(report.autotune_version)}: self-contained report, no network needed</footer>']
    title = f"autotune: {report.workload or 'report'}"
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
