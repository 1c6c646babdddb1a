"""The reports of a tuning run, rendered from the typed `Report` (`autotune.record`).

`report.json` is exactly `Report.model_dump_json(indent=2)`; `report.md` and `report.html`
are rendered from the same model, and `tuned.yaml` holds its final config. Modules:
`fmt` (value formatters), `tables` (tables and sentences both renderers share),
`markdown`, `charts` and `html` (the renderers), `files` (writing and reading the files)
and `terminal` (rich output and the live progress display).
"""

from __future__ import annotations

from autotune.record import report_schema

from .files import load_report, rerender, write_outputs, write_reports, write_tuned_config
from .html import render_html
from .markdown import render_markdown

__all__ = [
    "load_report", "render_html", "render_markdown", "report_schema", "rerender", "write_outputs", "write_reports",
    "write_tuned_config",
]
