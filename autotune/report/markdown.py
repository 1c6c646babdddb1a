"""`report.md`: the run as Markdown, from the shared tables of `tables`."""

from __future__ import annotations

from typing import Any

from autotune.record import Report, Verdict

from .fmt import Code, fmt_ratio, fmt_speedup
from .tables import (
    NOT_RECORDED, Table, budget_text, comparison_table, evidence_table, waste_table, headline, noise_text, protocol_table,
    recommendation_table, run_table, stage_table, step_title, step_verdict, trial_table,
)

__all__ = ["render_markdown"]


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


def _md_diagnosis(title: str, verdict: Verdict | None) -> list[str]:
    if verdict is None:
        return [f"### {title}", "", f"_{NOT_RECORDED}_", ""]
    return [f"### {title}", "", f"**{verdict.bottleneck.value}**: {verdict.reason or 'no reason given'}. "
            f"Slowest stage: {verdict.slowest_stage or '?'}.", "", _md_table(waste_table(verdict)), "",
            _md_table(evidence_table(verdict)), ""]


def _md_head(report: Report) -> list[str]:
    out = [f"# autotune report: {report.workload or 'unnamed workload'}", "", f"**{headline(report)}**", ""]
    if missing := report.missing():
        out += [f"> **This run is incomplete.** Not recorded: {'; '.join(missing)}.", ""]
    return out


def _md_measurements(report: Report) -> list[str]:
    return ["## Run", "", _md_table(run_table(report)), "", "## Measurement protocol", "",
            _md_table(protocol_table(report)), "", "## Noise", "", noise_text(report), "",
            "## Baseline and final", "", "Speedup (final over baseline, measured interleaved): "
            f"{fmt_speedup(report.speedup)}.", "", _md_table(comparison_table(report)), "",
            "### Stages of one step", "", _md_table(stage_table(report)), ""]


def _md_recommendations(report: Report) -> list[str]:
    out = ["## Recommendations", "", "Ranked by measured gain, accepted first.", "",
           _md_table(recommendation_table(report)), ""]
    for i, r in enumerate(report.recommendations, 1):
        if r.accepted and r.snippet:
            out += [f"### {i}. {r.recipe} ({fmt_ratio(r.speedup)})", "", "```python", r.snippet.rstrip(), "```", ""]
    return out


def _md_steps(report: Report) -> list[str]:
    out = ["## Steps tried", ""]
    if not report.steps:
        out += ["_No recipe was tried._", ""]
    for step in report.steps:
        out += [f"### {step_title(step)}", "", step_verdict(step) + ".", ""]
        out += [f"- range grown: {note}" for note in step.grown] + ([""] if step.grown else [])
        out += [_md_table(trial_table(step)), ""]
    return out


def render_markdown(report: Report) -> str:
    """The whole report as Markdown.

    Args:
        report: The run, complete or interrupted; missing parts are named, not skipped.

    Returns:
        The text of `report.md`.
    """
    out = _md_head(report) + _md_measurements(report)
    out += ["## Diagnosis", ""]
    out += _md_diagnosis("Before tuning", report.initial_diagnosis)
    out += _md_diagnosis("After tuning", report.diagnosis)
    out += _md_recommendations(report) + _md_steps(report)
    out += ["## Stop reason", "", report.stop_reason or NOT_RECORDED, "", "## Budget", "", budget_text(report), ""]
    return "\n".join(out)
