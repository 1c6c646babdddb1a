"""The files of a run: `report.json`, `report.md`, `report.html` and `tuned.yaml`.

Each is written atomically. `report.json` is exactly the `Report` model's JSON and is
written first, so a rendering bug can never cost the measurements; `load_report` reads it
back (for `autotune report DIR`) with errors that say how to get a good one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pydantic import ValidationError

from autotune import atomic
from autotune.config import TrainConfig, from_flat, save_config
from autotune.errors import UserError
from autotune.record import Recommendation, Report

from .fmt import number
from .html import render_html
from .markdown import render_markdown

__all__ = ["load_report", "rerender", "write_reports", "write_tuned_config"]

_SHOWN_ERRORS = 3  # validation errors named in a message; the rest are counted


def write_reports(report: Report, out_dir: str | Path) -> list[Path]:
    """Write `report.json` (first), `report.md` and `report.html` into `out_dir` (created when
    missing), each atomically; returns the paths written."""
    out = Path(out_dir)
    paths = [out / "report.json", out / "report.md", out / "report.html"]
    atomic.write_text(paths[0], report.model_dump_json(indent=2))
    atomic.write_text(paths[1], render_markdown(report))
    atomic.write_text(paths[2], render_html(report))
    return paths


def write_outputs(report: Report, out_dir: str | Path) -> None:
    """The three reports and `tuned.yaml`; a failed write (a full disk) leaves every file as
    it was before (each write is atomic) and says so."""
    try:
        write_reports(report, out_dir)
        write_tuned_config(report, out_dir)
    except OSError as exc:
        raise UserError(
            f"the reports could not be written to {str(out_dir)!r} ({exc.strerror or exc}); the files there are "
            "as they were before this write, and every measurement is kept in the study's storage: free the "
            "space (or fix the folder) and rerun the same command, which resumes without measuring again."
        ) from None


def _key_description(key: str) -> str:
    """The `TrainConfig` field's description of a dotted key, or "" for an unknown key."""
    section, _, name = key.partition(".")
    field = TrainConfig.model_fields.get(section)
    fields = getattr(field.annotation, "model_fields", {}) if field is not None else {}
    return (fields[name].description or "") if name in fields else ""


def _gain(rec: Recommendation) -> str:
    """`4.13x [3.88, 4.41]`, or why a change without a measured gain was kept."""
    speedup = number(rec.speedup)
    if not speedup:
        return "fits the memory limit"
    low, high = (list(rec.ci) + [None, None])[:2]
    low, high = number(low), number(high)
    ci = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    return f"{speedup:.2f}x{ci}"


def tuned_comments(report: Report) -> dict[str, str]:
    """A comment per changed key: what the knob does, its old value, and what its recipe measured."""
    comments = {}
    for rec in report.recommendations:
        if not rec.accepted:
            continue
        for key, pair in rec.changes.items():
            old = pair[0] if isinstance(pair, list) and pair else None
            desc = _key_description(key)
            comments[key] = f"{desc} Was {json.dumps(old, default=str)}; {rec.recipe} measured {_gain(rec)}".lstrip()
    return comments


def write_tuned_config(report: Report, out_dir: str | Path) -> Path:
    """Write `tuned.yaml` into `out_dir`: the final config (the defaults without one), each changed
    key commented with its evidence; a final config that is not valid raises `ConfigError`."""
    final = TrainConfig() if report.final_config is None else from_flat(report.final_config, source="final config")
    path = Path(out_dir) / "tuned.yaml"
    save_config(final, path, tuned_comments(report))
    return path


def _validation_text(exc: ValidationError) -> str:
    errors = exc.errors()
    shown = "; ".join(f"{'.'.join(str(p)[:60] for p in err['loc']) or 'top level'}: {err['msg'][:200]}"
                      for err in errors[:_SHOWN_ERRORS])
    more = f"; and {len(errors) - _SHOWN_ERRORS} more" if len(errors) > _SHOWN_ERRORS else ""
    return f"{len(errors)} error(s): {shown}{more}"


_MAX_INT = 2**63  # report.json holds counts and byte sizes: a bigger integer is not from autotune


def _refuse_constant(name: str) -> float:
    """`NaN`, `Infinity` and `-Infinity` are not JSON, and autotune writes non-finite numbers as null."""
    raise ValueError(f"{name} is not a JSON number (autotune writes a number that is not finite as null)")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(int(text)) >= _MAX_INT:
        shown = text if len(text) <= 24 else f"{text[:12]}...({len(text)} digits)"
        raise ValueError(f"the integer {shown} is too large for an autotune report (at most 2**63)")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        shown = text if len(text) <= 24 else f"{text[:12]}...({len(text)} characters)"
        raise ValueError(f"the number {shown} is out of the range of a float")
    return value


def load_report(folder: str | Path) -> Report:
    """The validated `Report` of `folder/report.json`; a missing, unreadable or invalid file raises a
    `UserError` that names it and says to run `autotune tune TARGET --out DIR` again."""
    folder = Path(folder)
    path = folder / "report.json"
    again = f"run `autotune tune TARGET --out {folder}` again to write it, then `autotune report {folder}`"
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder: run `autotune tune TARGET --out {folder}` first, "
                        f"then `autotune report {folder}`.")
    if path.is_dir():
        raise UserError(f"{path} is a folder, not the report file: {again}.")
    if not path.is_file():
        raise UserError(f"{path} does not exist, so there is nothing to render: {again}.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_refuse_constant, parse_int=_bounded_int,
                          parse_float=_finite_float)
    except RecursionError:
        raise UserError(f"{path} nests deeper than an autotune report ever does, so it is not one: {again}.") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{path} cannot be read as JSON ({str(exc)[:300]}): {again}.") from None
    try:  # text autotune can write back out: no lone surrogates (from \ud800 escapes)
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError, ValueError):
        raise UserError(f"{path} holds text that is not valid Unicode (a lone surrogate escape such as \\ud800), "
                        f"so it is not an autotune report: {again}.") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} holds a JSON {type(data).__name__}, not an autotune report: {again}.")
    try:
        return Report.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"{path} is not a valid autotune report ({_validation_text(exc)}): {again}.") from None


def rerender(folder: str | Path) -> list[Path]:
    """`autotune report DIR`: write `report.md` and `report.html` again from `DIR/report.json` and
    return their paths (errors as `load_report`'s)."""
    folder = Path(folder)
    report = load_report(folder)
    paths = [folder / "report.md", folder / "report.html"]
    for path, text in zip(paths, (render_markdown(report), render_html(report))):
        try:
            atomic.write_text(path, text)
        except OSError as exc:
            raise UserError(f"{path} cannot be written ({exc.strerror or exc}); make {folder} writable "
                            f"(and {path.name} a file, not a folder), then run `autotune report {folder}` again.") from None
    return paths

