"""`report.md`: the run as Markdown, from the shared tables of `tables`."""

from __future__ import annotations

import re
from typing import Any

from autotune.record import Report, Verdict

from .fmt import Code, fmt_ratio, fmt_speedup
from .tables import (
    NOT_RECORDED, Table, budget_text, comparison_table, evidence_table, waste_table, headline, noise_text, noise_warning,
    protocol_table, recommendation_table, run_table, stage_table, step_title, step_verdict, stop_lines, trial_table,
)

__all__ = ["md_code", "md_fence", "md_text", "render_markdown"]


_SPECIAL = re.compile(r"([\\`*\[\]<>|~])")  # backslash-escaped wherever they appear
_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # emphasis; snake_case is left alone
_ENTITY = re.compile(r"&(?=#?\w+;)")  # `&lt;` would render as `<`


def md_text(text: Any, block: bool = False) -> str:
    """`text` (its `str`, line breaks made spaces) as Markdown that renders as that text: its
    punctuation escaped, and with `block`, a leading `#`, `>`, `-`, `+`, `=` or `1.` too."""
    out = " ".join(str(text).splitlines())
    out = _SPECIAL.sub(r"\\\1", out)
    out = _UNDERSCORE.sub(r"\\_", out)
    out = _ENTITY.sub(r"\\&", out).replace("#", "\\#")
    if block:  # no indented code block, heading, quote, list or rule at the start of the line
        out = out.lstrip()
        out = "\\" + out if out[:1] in (">", "+", "-", "=") else re.sub(r"^(\d+)([.)])", r"\1\\\2", out)
    return out


def md_code(text: Any) -> str:
    """Text as an inline code span that survives a table: a fence longer than any run of
    backticks inside, `|` escaped (GFM splits cells before it reads code), one line."""
    body = " ".join(str(text).splitlines()).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if body.startswith("`") or body.endswith("`") or not body.strip() else ""
    return f"{fence}{pad}{body}{pad}{fence}"


def md_fence(text: str, lang: str = "") -> list[str]:
    """A fenced code block whose fence no line of `text` can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}{lang}", text, fence]


def _md_cell(c: Any) -> str:
    if isinstance(c, list):
        return "<br>".join(_md_cell(x) for x in c)
    return md_code(c) if isinstance(c, Code) else md_text(c)


def _md_table(table: Table) -> str:
    headers, rows = table
    if not rows:
        return "_none_"
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _md_diagnosis(title: str, verdict: Verdict | None) -> list[str]:
    if verdict is None:
        return [f"### {title}", "", f"_{NOT_RECORDED}_", ""]
    return [f"### {title}", "", f"**{verdict.bottleneck.value}**: {md_text(verdict.reason or 'no reason given')}. "
            f"Slowest stage: {md_text(verdict.slowest_stage or '?')}.", "", _md_table(waste_table(verdict)), "",
            _md_table(evidence_table(verdict)), ""]


def _md_head(report: Report) -> list[str]:
    out = [f"# autotune report: {md_text(report.workload or 'unnamed workload')}", "", f"**{md_text(headline(report))}**", ""]
    if missing := report.missing():
        out += [f"> **This run is incomplete.** Not recorded: {md_text('; '.join(missing))}.", ""]
    if busy := noise_warning(report):
        out += [f"> **Noisy measurements.** {md_text(busy)}", ""]
    return out


def _md_measurements(report: Report) -> list[str]:
    return ["## Run", "", _md_table(run_table(report)), "", "## Measurement protocol", "",
            _md_table(protocol_table(report)), "", "## Noise", "", md_text(noise_text(report), block=True), "",
            "## Baseline and final", "", "Speedup (final over baseline, measured interleaved): "
            f"{md_text(fmt_speedup(report.speedup))}.", "", _md_table(comparison_table(report)), "",
            "### Stages of one step", "", _md_table(stage_table(report)), ""]


def _md_recommendations(report: Report) -> list[str]:
    out = ["## Recommendations", "", "Ranked by measured gain, accepted first.", "",
           _md_table(recommendation_table(report)), ""]
    for i, r in enumerate(report.recommendations, 1):
        if r.accepted and r.snippet:
            out += [f"### {i}. {md_text(r.recipe)} ({fmt_ratio(r.speedup)})", "", *md_fence(r.snippet.rstrip(), "python"), ""]
    return out


def _md_steps(report: Report) -> list[str]:
    out = ["## Steps tried", ""]
    if not report.steps:
        out += ["_No recipe was tried._", ""]
    for step in report.steps:
        out += [f"### {md_text(step_title(step))}", "", md_text(step_verdict(step), block=True) + ".", ""]
        out += [f"- range grown: {md_text(note)}" for note in step.grown] + ([""] if step.grown else [])
        out += [_md_table(trial_table(step)), ""]
    return out


def render_markdown(report: Report) -> str:
    """The whole report as Markdown; an interrupted run's missing parts are named, not skipped."""
    out = _md_head(report) + _md_measurements(report)
    out += ["## Diagnosis", ""]
    out += _md_diagnosis("Before tuning", report.initial_diagnosis)
    out += _md_diagnosis("After tuning", report.diagnosis)
    out += _md_recommendations(report) + _md_steps(report)
    out += ["## Stop reason", ""]
    for i, (label, text) in enumerate(stop_lines(report)):
        out += [md_text(text, block=True) if i == 0 else f"**{md_text(label)}:** {md_text(text)}", ""]
    out += ["## Budget", "", md_text(budget_text(report), block=True), ""]
    return "\n".join(out)
