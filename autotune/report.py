"""The reports of a tuning run: `report.json`, `report.md` and `report.html` from one dict.

The agent hands over a plain dict (the shape `report.json` stores); this module renders it
and never trusts it to be complete: an interrupted run may lack its final measurement, its
speedup or every step, and the reports then say what is missing instead of failing.
Tables are built once here, as headers and rows of text, and drawn by both renderers;
`report_html` adds the pictures.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from . import atomic
from .clock import STAGES
from .errors import UserError
from .units import format_bytes

__all__ = ["render_html", "render_markdown", "rerender", "write_reports"]

Table = tuple[list[str], list[list[Any]]]
NOT_RECORDED = "not recorded"


class Code(str):
    """Text shown as code: backticks in Markdown, `<code>` in HTML."""


# --- reading a report that may be incomplete ----------------------------------------------


def as_dict(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def as_list(x: Any) -> list[Any]:
    return x if isinstance(x, list) else []


def number(x: Any) -> float | None:
    """A finite number, or None for anything else (missing, null, text, NaN)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def stage_names(*summaries: dict[str, Any]) -> list[str]:
    """The known stages in step order, then any other stage a summary holds."""
    extra = [k for s in summaries for k in as_dict(s.get("stages")) if k not in STAGES]
    return list(STAGES) + sorted(set(extra))


def stage_ms(summary: dict[str, Any], stage: str) -> float | None:
    s = number(as_dict(as_dict(summary.get("stages")).get(stage)).get("s"))
    return None if s is None else s * 1e3


def missing_parts(report: dict[str, Any]) -> list[str]:
    """What an interrupted run did not get to record, in words."""
    checks = [
        ("baseline", "the baseline measurement"),
        ("final", "the final measurement"),
        ("speedup", "the final-versus-baseline speedup"),
        ("diagnosis", "the diagnosis of the final config"),
        ("steps", "any recipe step (none was tried)"),
        ("stop_reason", "the reason the search stopped"),
    ]
    return [words for key, words in checks if not report.get(key)]


# --- formatting ---------------------------------------------------------------------------


def fmt_value(v: Any) -> str:
    """A config value as YAML would write it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return v if isinstance(v, str) else json.dumps(v, default=str)


def change_list(changes: Any) -> list[Code]:
    """`key: old → new` for each changed dotted key."""
    out = []
    for key, pair in as_dict(changes).items():
        if isinstance(pair, (list, tuple)) and len(pair) == 2:
            out.append(Code(f"{key}: {fmt_value(pair[0])} → {fmt_value(pair[1])}"))
        else:
            out.append(Code(f"{key}: {fmt_value(pair)}"))
    return out


def fmt_ratio(x: Any) -> str:
    x = number(x)
    return "n/a" if x is None else f"{x:.2f}×"


def fmt_ci(low: Any, high: Any) -> str:
    low, high = number(low), number(high)
    return "n/a" if low is None or high is None else f"{low:.2f}–{high:.2f}"


def fmt_speedup(sp: Any) -> str:
    """`4.20× (CI 3.90–4.50, 4 pairs)` from a {ratio, low, high, pairs} dict."""
    sp = as_dict(sp)
    if number(sp.get("ratio")) is None:
        return "not measured"
    pairs = number(sp.get("pairs"))
    tail = f", {pairs:.0f} pairs" if pairs is not None else ""
    return f"{fmt_ratio(sp.get('ratio'))} (CI {fmt_ci(sp.get('low'), sp.get('high'))}{tail})"


def fmt_ms(ms: Any) -> str:
    ms = number(ms)
    if ms is None:
        return "n/a"
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


def fmt_seconds(s: Any) -> str:
    s = number(s)
    if s is None:
        return "n/a"
    if abs(s) < 1:
        return fmt_ms(s * 1e3)
    return f"{s:.2f} s" if s < 60 else f"{int(s // 60)} min {s % 60:.0f} s"


def fmt_rate(x: Any) -> str:
    x = number(x)
    return "n/a" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def fmt_bytes(n: Any) -> str:
    return format_bytes(number(n))


def fmt_delta_bytes(n: Any) -> str:
    n = number(n)
    if n is None:
        return "n/a"
    return "no change" if n == 0 else ("+" if n > 0 else "") + format_bytes(n)


def fmt_pct_change(base: Any, new: Any) -> str:
    base, new = number(base), number(new)
    if base is None or new is None or base == 0:
        return ""
    return f"{(new - base) / base:+.0%}"


def fmt_evidence(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {fmt_evidence(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:.4g}"
    return fmt_value(v)


# --- tables shared by both renderers ------------------------------------------------------


def run_table(report: dict[str, Any]) -> Table:
    m = as_dict(report.get("machine"))
    machine = ", ".join(
        p for p in (
            m.get("cpu") and str(m["cpu"]),
            number(m.get("cores")) is not None and f"{m['cores']} cores",
            m.get("gpu") and f"GPU {m['gpu']}",
            m.get("torch") and f"torch {m['torch']}",
            m.get("python") and f"Python {m['python']}",
        ) if p
    )
    limit = report.get("memory_limit_bytes")
    study = as_dict(report.get("study"))
    rows = [
        ["workload", str(report.get("workload") or NOT_RECORDED)],
        ["target", Code(str(report.get("target") or NOT_RECORDED))],
        ["device", str(report.get("device") or NOT_RECORDED)],
        ["machine", machine or NOT_RECORDED],
        ["memory limit", fmt_bytes(limit) if number(limit) else "none"],
        ["study", Code(f"{study.get('name')} in {study.get('storage')}") if study else NOT_RECORDED],
        ["autotune", str(report.get("autotune_version") or NOT_RECORDED)],
    ]
    return ["", ""], rows


def protocol_table(report: dict[str, Any]) -> Table:
    labels = {
        "warmup_steps": "warm-up steps", "steps": "measured steps per window", "windows": "windows",
        "seed": "seed", "profile_steps": "profiled steps", "window_rule": "window rule", "throughput": "throughput",
    }
    p = as_dict(report.get("protocol"))
    rows = [[labels.get(k, k), fmt_value(v)] for k, v in p.items()]
    return ["", ""], rows


def comparison_table(report: dict[str, Any]) -> Table:
    b, f = as_dict(report.get("baseline")), as_dict(report.get("final"))

    def row(label: str, get, fmt, change: str | None = None) -> list[Any]:
        vb, vf = get(b), get(f)
        return [label, fmt(vb) if b else NOT_RECORDED, fmt(vf) if f else NOT_RECORDED,
                change if change is not None else fmt_pct_change(vb, vf)]

    def st(key: str):
        return lambda s: None if number(as_dict(s.get("step_time_s")).get(key)) is None else s["step_time_s"][key] * 1e3

    def ot(key: str):
        return lambda s: as_dict(s.get("one_time")).get(key)

    mem_b, mem_f = number(b.get("peak_memory_bytes")), number(f.get("peak_memory_bytes"))
    rows = [
        row("throughput (samples/s)", lambda s: s.get("samples_per_s"), fmt_rate),
        row("step time median", st("median"), fmt_ms),
        row("step time p90", st("p90"), fmt_ms),
        row("spread across windows (CV)", lambda s: s.get("window_cv"),
            lambda v: "n/a" if number(v) is None else f"{v:.1%}", ""),
        row("peak tensor memory", lambda s: s.get("peak_memory_bytes"), fmt_bytes,
            fmt_delta_bytes(mem_f - mem_b) if mem_b is not None and mem_f is not None else ""),
        row("peak RSS", lambda s: s.get("peak_rss_bytes"), fmt_bytes, ""),
        row("setup (one-time)", ot("setup_s"), fmt_seconds, ""),
        row("first step (one-time)", ot("first_step_s"), fmt_seconds, ""),
        row("first batch (one-time)", ot("loader_first_batch_s"), fmt_seconds, ""),
        row("measured steps", lambda s: s.get("measured_steps"), fmt_value, ""),
    ]
    return ["", "baseline", "final", "change"], rows


def stage_table(report: dict[str, Any]) -> Table:
    b, f = as_dict(report.get("baseline")), as_dict(report.get("final"))

    def cells(s: dict[str, Any], stage: str) -> list[str]:
        if not as_dict(s.get("stages")):
            return [NOT_RECORDED, ""]
        share = number(as_dict(as_dict(s.get("stages")).get(stage)).get("share"))
        return [fmt_ms(stage_ms(s, stage)), "n/a" if share is None else f"{share:.1%}"]

    rows = [[stage, *cells(b, stage), *cells(f, stage)] for stage in stage_names(b, f)]
    return ["stage", "baseline ms/step", "share", "final ms/step", "share"], rows


def evidence_table(diag: dict[str, Any]) -> Table:
    rows = [[Code(str(k)), fmt_bytes(v) if str(k).endswith("_bytes") and number(v) else fmt_evidence(v)]
            for k, v in as_dict(diag.get("evidence")).items() if v is not None]
    return ["evidence", "value"], rows


def recommendation_table(report: dict[str, Any]) -> Table:
    rows = []
    for i, r in enumerate(as_list(report.get("recommendations")), 1):
        r, ci = as_dict(r), as_list(as_dict(r).get("ci")) + [None, None]
        one_time = number(r.get("one_time_s"))
        payoff = number(r.get("payoff_steps"))
        verdict = "accepted" if r.get("accepted") else "rejected"
        rows.append([
            str(i), str(r.get("recipe", "?")), change_list(r.get("changes")) or "no change",
            fmt_ratio(r.get("speedup")), fmt_ci(ci[0], ci[1]), fmt_delta_bytes(r.get("memory_delta_bytes")),
            "n/a" if one_time is None else "none" if one_time <= 0 else fmt_seconds(one_time),
            "—" if payoff is None else "at once" if payoff <= 0 else f"{payoff:,.0f} steps",
            verdict + (f": {r['reason']}" if r.get("reason") else ""),
        ])
    headers = ["#", "recipe", "changes", "speedup", "CI", "memory", "one-time cost", "pays off after", "verdict"]
    return headers, rows


def trial_table(step: dict[str, Any]) -> Table:
    rows = []
    for t in as_list(step.get("trials")):
        t = as_dict(t)
        rows.append([
            fmt_value(t.get("number")), change_list(t.get("changes")) or "baseline config",
            fmt_rate(t.get("samples_per_s")), str(t.get("state") or "?"),
            fmt_bytes(t.get("peak_memory_bytes")), str(t.get("reason") or ""),
        ])
    return ["trial", "changes", "samples/s", "state", "peak memory", "note"], rows


def step_title(step: dict[str, Any]) -> str:
    target = f" (for {step['bottleneck']})" if step.get("bottleneck") else ""
    return f"Round {fmt_value(step.get('round'))}: {step.get('recipe', '?')}{target}"


def step_verdict(step: dict[str, Any]) -> str:
    verdict = "accepted" if step.get("accepted") else "rejected"
    sp = as_dict(step.get("speedup"))
    measured = f", {fmt_speedup(sp)}" if sp else ""
    return f"{verdict}{measured}" + (f": {step['reason']}" if step.get("reason") else "")


def headline(report: dict[str, Any]) -> str:
    """One sentence: the measured gain, or why there is none."""
    b, f, sp = as_dict(report.get("baseline")), as_dict(report.get("final")), as_dict(report.get("speedup"))
    if number(sp.get("ratio")) is None:
        return "No final speedup was measured: the run stopped before its final measurement."
    thr = f": {fmt_rate(b.get('samples_per_s'))} → {fmt_rate(f.get('samples_per_s'))} samples/s" if b and f else ""
    return f"{fmt_ratio(sp.get('ratio'))} the baseline's throughput (CI {fmt_ci(sp.get('low'), sp.get('high'))}){thr}."


def noise_text(report: dict[str, Any]) -> str:
    n = as_dict(report.get("noise"))
    if number(n.get("ratio")) is None:
        return "The baseline's noise was not measured."
    margin = f"; a change is accepted only when its CI's low end clears {fmt_ratio(n.get('margin'))}" \
        if number(n.get("margin")) is not None else ""
    return (f"Re-measuring the unchanged baseline (A/A, {fmt_value(n.get('pairs'))} interleaved pairs) gave "
            f"{fmt_ratio(n.get('ratio'))} (CI {fmt_ci(n.get('low'), n.get('high'))}){margin}.")


def budget_text(report: dict[str, Any]) -> str:
    b = as_dict(report.get("budget"))
    if not b:
        return NOT_RECORDED
    limit = f" of {fmt_value(b['trials_limit'])}" if b.get("trials_limit") is not None else ""
    budget = f" of a {fmt_seconds(b['budget_s'])} budget" if number(b.get("budget_s")) else ""
    return f"{fmt_value(b.get('trials_used'))} trials{limit}; {fmt_seconds(b.get('wall_s'))} wall time{budget}."


# --- Markdown -----------------------------------------------------------------------------


def _md_cell(c: Any) -> str:
    if isinstance(c, list):
        return "<br>".join(_md_cell(x) for x in c)
    text = str(c).replace("|", "\\|").replace("\n", " ")
    return f"`{text}`" if isinstance(c, Code) else text


def _md_table(table: Table) -> str:
    headers, rows = table
    if not rows:
        return "_none_"
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _md_diagnosis(title: str, diag: Any) -> list[str]:
    diag = as_dict(diag)
    if not diag:
        return [f"### {title}", "", f"_{NOT_RECORDED}_", ""]
    return [f"### {title}", "", f"**{diag.get('bottleneck', '?')}**: {diag.get('reason') or 'no reason given'}. "
            f"Slowest stage: {diag.get('slowest_stage', '?')}.", "", _md_table(evidence_table(diag)), ""]


def render_markdown(report: dict[str, Any]) -> str:
    report = as_dict(report)
    out = [f"# autotune report: {report.get('workload') or 'unnamed workload'}", "", f"**{headline(report)}**", ""]
    if missing := missing_parts(report):
        out += [f"> **This run is incomplete.** Not recorded: {'; '.join(missing)}.", ""]
    out += ["## Run", "", _md_table(run_table(report)), "", "## Measurement protocol", "",
            _md_table(protocol_table(report)), "", "## Noise", "", noise_text(report), "",
            "## Baseline and final", "", f"Speedup (final over baseline, measured interleaved): "
            f"{fmt_speedup(report.get('speedup'))}.", "", _md_table(comparison_table(report)), "",
            "### Stages of one step", "", _md_table(stage_table(report)), "", "## Diagnosis", ""]
    out += _md_diagnosis("Before tuning", report.get("initial_diagnosis"))
    out += _md_diagnosis("After tuning", report.get("diagnosis"))
    out += ["## Recommendations", "", "Ranked by measured gain, accepted first.", "",
            _md_table(recommendation_table(report)), ""]
    for i, r in enumerate(as_list(report.get("recommendations")), 1):
        r = as_dict(r)
        if r.get("accepted") and r.get("snippet"):
            out += [f"### {i}. {r.get('recipe', '?')} ({fmt_ratio(r.get('speedup'))})", "",
                    "```python", str(r["snippet"]).rstrip(), "```", ""]
    out += ["## Steps tried", ""]
    steps = as_list(report.get("steps"))
    if not steps:
        out += ["_No recipe was tried._", ""]
    for step in steps:
        step = as_dict(step)
        out += [f"### {step_title(step)}", "", step_verdict(step) + ".", "", _md_table(trial_table(step)), ""]
    out += ["## Stop reason", "", str(report.get("stop_reason") or NOT_RECORDED), "",
            "## Budget", "", budget_text(report), ""]
    return "\n".join(out)


# --- files --------------------------------------------------------------------------------


def render_html(report: dict[str, Any]) -> str:
    from .report_html import render_html as render

    return render(report)


def write_reports(report: dict[str, Any], out_dir: Path) -> None:
    """Write `report.json`, `report.md` and `report.html` into `out_dir`, each atomically.

    The JSON goes first, so a rendering bug can never cost the measurements.
    """
    out_dir = Path(out_dir)
    atomic.write_text(out_dir / "report.json", json.dumps(report, indent=2, default=str))
    atomic.write_text(out_dir / "report.md", render_markdown(report))
    atomic.write_text(out_dir / "report.html", render_html(report))


def rerender(dir: str) -> int:
    """`autotune report DIR`: render `report.md` and `report.html` again from `DIR/report.json`."""
    folder = Path(dir)
    path = folder / "report.json"
    hint = f"run `autotune tune TARGET --out {folder}` first, then `autotune report {folder}`"
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder: {hint}.")
    if not path.is_file():
        raise UserError(f"{path} does not exist, so there is nothing to render: {hint}.")
    try:
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{path} cannot be read as JSON ({exc}): {hint} to write it again.") from exc
    if not isinstance(report, dict):
        raise UserError(f"{path} holds a JSON {type(report).__name__}, not an autotune report: {hint}.")
    atomic.write_text(folder / "report.md", render_markdown(report))
    atomic.write_text(folder / "report.html", render_html(report))
    from .console import console

    console.print(f"wrote {folder / 'report.md'} and {folder / 'report.html'}")
    return 0
