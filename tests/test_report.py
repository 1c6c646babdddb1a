"""Reports: the three files, their content, and that an interrupted run still renders."""

from __future__ import annotations

import ast
import json
import math
import re
import typing
from importlib import resources
from pathlib import Path

import pytest
from pydantic import BaseModel

from autotune.errors import UserError
from autotune.record import Ratio, Report, report_schema
from autotune.report import load_report, render_html, render_markdown, rerender, write_reports, write_tuned_config

CONFIG0 = {
    "data.num_workers": 0, "data.prefetch_factor": None, "data.pin_memory": False, "data.persistent_workers": False,
    "data.non_blocking": False, "precision.amp": "none", "precision.tf32": None, "compile.mode": "none",
    "memory.micro_batch_size": None, "memory.activation_checkpointing": False, "layout.channels_last": False,
    "optimizer.impl": "default", "backend.cudnn_benchmark": None, "backend.num_threads": None,
}
FINAL_CONFIG = dict(CONFIG0, **{"data.num_workers": 8, "data.prefetch_factor": 2})


def _summary(config: dict, step_ms: float, shares: dict[str, float], samples_per_s: float, peak: int) -> dict:
    return {
        "config": config,
        "step_time_s": {"median": step_ms / 1e3 * 0.97, "p90": step_ms / 1e3 * 1.3, "mean": step_ms / 1e3},
        "samples_per_s": samples_per_s,
        "windows_samples_per_s": [samples_per_s * f for f in (0.97, 1.02, 1.0, 0.99, 1.03)],
        "window_cv": 0.021,
        "stages": {k: {"s": step_ms / 1e3 * v, "share": v} for k, v in shares.items()},
        "peak_memory_bytes": peak, "peak_rss_bytes": 312_000_000,
        "one_time": {"setup_s": 1.12, "first_step_s": 0.021, "loader_first_batch_s": 0.034},
        "signals": {"ops_per_step": 48, "mean_op_us": 61.0, "syncs_per_step": 0.0},
        "measured_steps": 60,
    }


def _brief(samples_per_s: float, peak: int, step_ms: float, one_time_s: float = 1.141) -> dict:
    return {"samples_per_s": samples_per_s, "peak_memory_bytes": peak, "step_time_s": step_ms / 1e3,
            "one_time_s": one_time_s}


def _diagnosis(bottleneck: str, stage: str, reason: str, data_share: float) -> dict:
    return {"bottleneck": bottleneck, "slowest_stage": stage, "reason": reason,
            "evidence": {"stage_shares": {"data": data_share, "forward": 0.3}, "data_share": data_share,
                         "input_threshold": 0.05, "syncs_per_step": 0.0, "comm_share": None, "mean_op_us": 61.2}}


def _trial(n: int, workers: int, sps: float | None, state: str = "ok", reason: str | None = None) -> dict:
    return {"number": n, "changes": {"data.num_workers": [0, workers]} if workers else {}, "samples_per_s": sps, "state": state,
            "reason": reason, "peak_memory_bytes": 812_000 if sps else None}


def _steps() -> list[dict]:
    return [
        {"round": 1, "recipe": "dataloader", "bottleneck": "input",
         "trials": [_trial(0, 0, 481.0), _trial(1, 4, 1590.0), _trial(2, 8, 1962.0), _trial(3, 2, 930.0),
                    _trial(4, 16, None, "infeasible", "exceeds the 2 GiB memory limit"), _trial(5, 6, 1744.0),
                    _trial(6, 12, None, "failed", "worker killed by signal 9"), _trial(7, 8, 1948.0)],
         "accepted": True, "reason": "CI low 3.88x clears the noise margin 1.05x",
         "changes": {"data.num_workers": [0, 8], "data.prefetch_factor": [None, 2]},
         "speedup": {"ratio": 4.13, "low": 3.88, "high": 4.41, "pairs": 4},
         "before": _brief(478.0, 790_000, 33.5), "after": _brief(1975.0, 812_000, 8.1, 1.351),
         "after_config": FINAL_CONFIG},
        {"round": 2, "recipe": "amp", "bottleneck": "compute",
         "trials": [{"number": 0, "changes": {}, "samples_per_s": 1969.0, "state": "ok", "reason": None,
                     "peak_memory_bytes": 812_000},
                    {"number": 1, "changes": {"precision.amp": ["none", "bf16"]}, "samples_per_s": 2001.0,
                     "state": "ok", "reason": None, "peak_memory_bytes": 640_000},
                    {"number": 2, "changes": {"precision.amp": ["none", "fp16"]}, "samples_per_s": 1702.0,
                     "state": "ok", "reason": None, "peak_memory_bytes": 650_000}],
         "accepted": False, "reason": "CI low 0.98x does not clear the noise margin 1.05x",
         "changes": {"precision.amp": ["none", "bf16"]},
         "speedup": {"ratio": 1.02, "low": 0.98, "high": 1.06, "pairs": 4},
         "before": _brief(1975.0, 812_000, 8.1), "after": _brief(2001.0, 640_000, 8.0),
         "after_config": dict(FINAL_CONFIG, **{"precision.amp": "bf16"})},
    ]


def _recommendations() -> list[dict]:
    return [
        {"recipe": "dataloader", "changes": {"data.num_workers": [0, 8], "data.prefetch_factor": [None, 2]},
         "speedup": 4.13, "ci": [3.88, 4.41], "memory_delta_bytes": 22_000, "accepted": True, "reason": None,
         "one_time_s": 0.21, "payoff_steps": 9,
         "snippet": "loader = DataLoader(dataset, batch_size=32, num_workers=8, prefetch_factor=2)"},
        {"recipe": "amp", "changes": {"precision.amp": ["none", "bf16"]}, "speedup": 1.02, "ci": [0.98, 1.06],
         "memory_delta_bytes": -172_000, "accepted": False,
         "reason": "CI low 0.98x does not clear the noise margin 1.05x <script>",
         "one_time_s": 0.0, "payoff_steps": None,
         "snippet": "with torch.autocast('cpu', dtype=torch.bfloat16):\n    loss = loss_fn(model, batch)"},
    ]


def make_report() -> Report:
    """A realistic report of an input-bound run: one accepted step, one rejected."""
    baseline = _summary(CONFIG0, 33.5, {"data": 0.91, "h2d": 0.0, "forward": 0.04, "backward": 0.03,
                                        "optimizer": 0.01, "other": 0.01}, 478.0, 790_000)
    final = _summary(FINAL_CONFIG, 8.1, {"data": 0.12, "h2d": 0.0, "forward": 0.38, "backward": 0.33,
                                         "optimizer": 0.09, "other": 0.08}, 1975.0, 812_000)
    return Report.model_validate({
        "autotune_version": "0.1.0", "workload": "input-bound (I/O latency)", "target": "examples/input_bound.py",
        "device": "cpu",
        "machine": {"cores": 2, "torch": "2.13.0", "cpu": "Intel Xeon Platinum 8488C", "gpu": None, "python": "3.11.7"},
        "protocol": {"warmup_steps": 3, "steps": 12, "windows": 5, "seed": 0, "profile_steps": 3,
                     "window_rule": "each window at least 4x the loader's buffered batches",
                     "throughput": "samples over a window's wall time"},
        "memory_limit_bytes": None,
        "noise": {"ratio": 1.01, "low": 0.97, "high": 1.04, "pairs": 4, "margin": 1.05, "min_gain": 0.03},
        "baseline": baseline, "final": final, "final_config": FINAL_CONFIG,
        "initial_diagnosis": _diagnosis("input", "data", "the step waits for data 91% of the time (> 5%)", 0.91),
        "diagnosis": _diagnosis("compute", "forward", "the step is spent in forward and no overhead rule fired", 0.12),
        "speedup": {"ratio": 4.13, "low": 3.88, "high": 4.41, "pairs": 4},
        "steps": _steps(),
        "recommendations": _recommendations(),
        "stop_reason": "the slowest stage is acceptable: compute-bound, and the compute recipes were tried",
        "budget": {"trials_used": 11, "trials_run_now": 11, "trials_limit": 40, "wall_s": 300.5, "budget_s": None},
        "study": {"storage": "sqlite:///runs/input/study.db", "name": "input-bound"},
    })


@pytest.fixture
def report() -> Report:
    return make_report()


def _interrupted(report: Report) -> Report:
    return report.model_copy(update={"final": None, "speedup": None, "diagnosis": None, "stop_reason": None,
                                     "steps": [], "recommendations": []})


def _optional(annotation: object) -> bool:
    """Whether a field's type admits None (`X | None`)."""
    return type(None) in typing.get_args(annotation)


OPTIONAL_FIELDS = [name for name, f in Report.model_fields.items() if _optional(f.annotation)]


def _nulled(value: object) -> object:
    """The value with every Optional field of every model inside it set to None."""
    if isinstance(value, BaseModel):
        update = {name: None if _optional(f.annotation) else _nulled(getattr(value, name))
                  for name, f in type(value).model_fields.items()}
        return value.model_copy(update=update)
    if isinstance(value, list):
        return [_nulled(x) for x in value]
    if isinstance(value, dict):
        return {k: _nulled(x) for k, x in value.items()}
    return value


def _validator():
    jsonschema = pytest.importorskip("jsonschema")
    schema = report_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


# --- files --------------------------------------------------------------------------------


def test_write_reports_writes_three_files(report, tmp_path):
    out = tmp_path / "out"
    paths = write_reports(report, out)
    assert [p.name for p in paths] == ["report.json", "report.md", "report.html"]
    assert (out / "report.json").read_text() == report.model_dump_json(indent=2)
    assert Report.model_validate_json((out / "report.json").read_text()) == report
    assert (out / "report.md").read_text() == render_markdown(report)
    assert (out / "report.html").read_text() == render_html(report)
    assert not list(out.glob(".*.tmp")), "atomic writes leave no temporary files"


def test_written_report_json_follows_the_schema(report, tmp_path):
    validator = _validator()
    for r in (report, _interrupted(report), _nulled(report)):
        write_reports(r, tmp_path)
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(json.loads((tmp_path / "report.json").read_text()))]
        assert not errors, errors


def test_shipped_schema_file_is_the_models_schema():
    shipped = resources.files("autotune.report").joinpath("report.schema.json").read_text()
    assert json.loads(shipped) == report_schema()
    assert shipped == json.dumps(report_schema(), indent=2) + "\n"


def test_tuned_config_comments_each_accepted_change(report, tmp_path):
    path = write_tuned_config(report, tmp_path)
    text = path.read_text()
    assert path == tmp_path / "tuned.yaml"
    line = next(x for x in text.splitlines() if x.strip().startswith("num_workers:"))
    assert line.startswith("  num_workers: 8  # ") and "Was 0; dataloader measured 4.13x [3.88, 4.41]" in line
    assert "prefetch_factor: 2  # " in text and "Was null" in text
    assert "amp: none" in text and "bf16" not in text, "a rejected change is neither applied nor commented"
    defaults = write_tuned_config(report.model_copy(update={"final_config": None, "recommendations": []}), tmp_path / "d")
    assert "num_workers: 0\n" in defaults.read_text() and "#" not in defaults.read_text()


# --- content ------------------------------------------------------------------------------


def test_markdown_has_recipes_speedup_and_snippet(report):
    md = render_markdown(report)
    for text in ("dataloader", "amp", "4.13×", "3.88–4.41", "`data.num_workers: 0 → 8`",
                 "`data.prefetch_factor: null → 2`", "num_workers=8, prefetch_factor=2", "rejected: CI low 0.98x",
                 "compute-bound", "11 trials of 40", "worker killed by signal 9", "input", "1.05×",
                 "Round 1: dataloader (for input)", "accepted, 4.13× (CI 3.88–4.41, 4 pairs)", "+313%"):
        assert text in md, text
    assert "```python" in md
    assert "autocast" not in md, "only accepted recommendations show their snippet"
    assert "incomplete" not in md


def test_html_is_self_contained_with_charts(report):
    page = render_html(report)
    assert page.count("<svg") >= 3
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert not re.search(r"<(script|link|img|iframe)\b", page, re.I)
    assert "@import" not in page and "url(" not in page
    assert "&lt;script&gt;" in page, "text from the report is escaped"
    for text in ("dataloader", "4.13×", "data.num_workers: 0 → 8", "infeasible", "failed", "noise margin"):
        assert text in page, text


def test_interrupted_report_renders_and_says_what_is_missing(report, tmp_path):
    r = _interrupted(report)
    md, page = render_markdown(r), render_html(r)
    assert "incomplete" in md and "the final measurement" in md and "No recipe was tried" in md
    assert "incomplete" in page and "not measured" in page
    write_reports(r, tmp_path)
    assert (tmp_path / "report.html").exists()
    assert load_report(tmp_path) == r


@pytest.mark.parametrize("field", ["all", *OPTIONAL_FIELDS])
def test_optional_report_fields_set_to_none_still_render(report, field):
    r = report.model_copy(update=dict.fromkeys(OPTIONAL_FIELDS if field == "all" else [field]))
    md, page = render_markdown(r), render_html(r)
    assert "autotune report" in md and "</html>" in page


def test_every_optional_field_nested_set_to_none_still_renders(report, tmp_path):
    r = _nulled(report)
    assert r.steps[0].speedup is None and r.baseline is None and r.recommendations[0].speedup is None
    assert render_markdown(r) and "</html>" in render_html(r)
    kept = report.model_copy(update={"steps": _nulled(report.steps), "recommendations": _nulled(report.recommendations)})
    md, page = render_markdown(kept), render_html(kept)
    assert "Round 1: dataloader (for input)" in md and "4.13×" in md and page.count("<svg") >= 2


def _non_finite(report: Report) -> Report:
    nan, inf = float("nan"), float("inf")
    r = report.model_copy(deep=True)
    r.speedup = Ratio(ratio=nan, low=nan, high=inf, pairs=4)
    r.baseline.samples_per_s = inf
    r.baseline.window_cv = nan
    r.baseline.step_time_s.median = nan
    r.noise.ratio, r.noise.margin = nan, inf
    r.steps[0].trials[1].samples_per_s = nan
    r.steps[0].speedup = Ratio(ratio=inf, low=nan, high=nan, pairs=4)
    r.recommendations[0].speedup, r.recommendations[0].ci = nan, [nan, inf]
    r.initial_diagnosis.evidence["data_share"] = nan
    return r


def test_nan_and_inf_render_as_na(report):
    r = _non_finite(report)
    md, page = render_markdown(r), render_html(r)
    for text in (md, page):
        assert not re.search(r"\b(nan|inf|infinity)\b", text, re.I)
    assert "n/a" in md and "not measured" in md
    assert page.count("<svg") >= 2


def test_minimal_report_with_nan_renders_without_charts(report):
    r = Report.model_validate({
        **report.model_dump(include={"autotune_version", "workload", "device", "machine", "protocol", "study"}),
        "speedup": {"ratio": float("nan"), "low": None, "high": None},
        "baseline": {**report.baseline.model_dump(), "samples_per_s": float("inf"), "stages": {}},
    })
    md, page = render_markdown(r), render_html(r)
    assert "autotune report" in md and "n/a" in md and not re.search(r"\b(nan|inf)\b", md)
    assert "<svg" not in page and "No trials were run" in page


# --- reading report.json back -------------------------------------------------------------


def test_rerender_missing_folder_or_bad_json_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"autotune tune .*--out"):
        rerender(tmp_path / "nope")
    with pytest.raises(UserError, match=r"report\.json does not exist.*autotune tune .*--out"):
        rerender(str(tmp_path))
    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(UserError, match=r"report\.json cannot be read as JSON.*autotune tune .*--out"):
        rerender(tmp_path)
    (tmp_path / "report.json").write_text("[1, 2]")
    with pytest.raises(UserError, match=r"report\.json holds a JSON list.*autotune tune .*--out"):
        rerender(tmp_path)
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(UserError, match=r"report\.json is not a valid autotune report.*autotune_version.*and \d+ more"):
        rerender(tmp_path)


@pytest.mark.parametrize(("path", "value", "named"), [
    (("baseline", "samples_per_s"), "fast", "baseline.samples_per_s"),
    (("steps", 0, "trials", 2, "state"), "great", "steps.0.trials.2.state"),
    (("budget",), "lots", "budget"),
    (("recommendations", 1, "typo_field"), 1, "recommendations.1.typo_field"),
])
def test_load_report_with_a_wrong_field_names_it(report, tmp_path, path, value, named):
    data = json.loads(report.model_dump_json())
    holder = data
    for k in path[:-1]:
        holder = holder[k]
    holder[path[-1]] = value
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(UserError) as info:
        load_report(tmp_path)
    message = str(info.value)
    assert "report.json is not a valid autotune report" in message and named in message
    assert f"autotune tune TARGET --out {tmp_path}" in message


def test_rerender_rewrites_markdown_and_html(report, tmp_path):
    (tmp_path / "report.json").write_text(report.model_dump_json(indent=2))
    (tmp_path / "report.md").write_text("stale")
    assert rerender(str(tmp_path)) == [tmp_path / "report.md", tmp_path / "report.html"]
    assert load_report(tmp_path) == report
    assert (tmp_path / "report.md").read_text() == render_markdown(report)
    assert (tmp_path / "report.html").read_text() == render_html(report)


# --- terminal -----------------------------------------------------------------------------


def test_terminal_summary_and_live_display(report):
    from rich.progress import Progress

    from autotune.events import Listener
    from autotune.report.terminal import Display, console, print_tune_summary

    with console.capture() as cap:
        print_tune_summary(report, "runs/input")
        print_tune_summary(_nulled(report), "runs/input")
        with Progress(console=console, transient=True) as prog:
            shown: Listener = Display(prog)
            shown.phase("baseline")
            shown.recipe(1, "dataloader", 3)
            for t in report.steps[0].trials[:3]:
                shown.trial(t)
            (task,) = prog.tasks  # the phase's task made way for the round's
            assert task.description == "round 1: dataloader" and task.total == 3 and task.completed == 3
            assert task.fields["note"] == "best 1962 samples/s"
            shown.decision("dataloader", True, "4.13x, interval [3.88, 4.41] clears the noise margin 1.050")
    text = cap.get()
    assert "4.13x" in text and "[3.88, 4.41]" in text and "rejected: CI low 0.98x" in text
    assert "final diagnosis: not recorded" in text and "dataloader: accepted: 4.13x, interval [3.88, 4.41]" in text


# --- structure ----------------------------------------------------------------------------


def test_report_package_imports_flow_one_way():
    package = Path(__file__).resolve().parent.parent / "autotune" / "report"
    forbidden = {"autotune.agent", "autotune.cli", "autotune.search", "autotune.runner", "autotune.report"}
    for path in package.glob("*.py"):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                absolute = node.module if node.level == 0 else None
                assert absolute not in forbidden, (path.name, absolute)
                assert not (node.level == 1 and node.module is None), f"{path.name} imports its own package"
            elif isinstance(node, ast.Import):
                assert not {a.name for a in node.names} & forbidden, path.name
        assert len(path.read_text().splitlines()) < 400, path.name
    html, md = (package / "html.py").read_text(), (package / "markdown.py").read_text()
    assert ".markdown" not in html and ".html" not in md


def test_non_finite_values_are_numbers_only_when_finite():
    from autotune.report.fmt import fmt_rate, fmt_speedup, number

    assert number(float("nan")) is None and number(float("inf")) is None and number(True) is None
    assert fmt_rate(float("inf")) == "n/a" and fmt_speedup(Ratio(ratio=math.nan, low=1, high=2)) == "not measured"


if __name__ == "__main__":  # render the fixture for a look: python tests/test_report.py /tmp/report.html
    import sys

    path = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/report.html")
    fixture = make_report()
    path.write_text(render_html(fixture))
    path.with_suffix(".md").write_text(render_markdown(fixture))
    print(path)


def test_trials_measured_by_several_workers_say_who_measured_each(tmp_path):
    from autotune.record import WorkerRef
    from autotune.report import write_outputs

    report = make_report()
    assert "measured by" not in render_markdown(report)  # one process measured everything: no column
    for i, t in enumerate(report.steps[0].trials):
        t.worker = WorkerRef(host="node-a", pid=100 + i % 2, machine="abc", cores=[i % 2])
    text = render_markdown(report)
    assert "measured by" in text and "node-a:100 (cores 0)" in text and "node-a:101 (cores 1)" in text
    write_outputs(report, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["steps"][0]["trials"][0]["worker"]["pid"] == 100


def test_a_round_that_measured_nothing_is_listed_as_not_tried_not_rejected(report):
    """A recipe whose round ran out of time before its first trial is untested here: the
    recommendations, the round's own verdict and every report say 'not tried'; a round that
    measured and kept nothing still reads 'rejected'."""
    from autotune.recipes import load_recipes
    from autotune.recommend import recommendations
    from autotune.report.tables import recommendation_table, step_verdict

    out = "the time budget ran out before a trial could finish"
    late = report.steps[1].model_copy(update={"round": 3, "recipe": "compile", "trials": [], "changes": {},
                                              "speedup": None, "after": None, "after_config": None, "reason": out})
    report = report.model_copy(update={"steps": [*report.steps, late]})
    recs = recommendations(report.steps, {r.name: r for r in load_recipes()})
    report = report.model_copy(update={"recommendations": recs})
    assert [(r.recipe, r.tried) for r in recs] == [("dataloader", True), ("amp", True), ("compile", False)]
    verdicts = [row[-1] for row in recommendation_table(report)[1]]
    assert verdicts[1].startswith("rejected: ") and verdicts[2] == f"not tried: {out}"
    assert step_verdict(late) == f"not tried: {out}" and step_verdict(report.steps[1]).startswith("rejected")
    assert f"not tried: {out}" in render_markdown(report)
    assert '<span class="badge not-tried">not tried</span>' in render_html(report)


@pytest.mark.parametrize("device, counted, not_counted", [
    ("cpu", "parameters, buffers and optimizer state", "resident memory"),
    ("cuda:0", "peak allocated memory", "reserved but unused"),
])
def test_the_run_table_says_what_the_memory_limit_counts_on_its_device(report, device, counted, not_counted):
    limited = report.model_copy(update={"memory_limit_bytes": 2 * 2**30, "device": device})
    md = render_markdown(limited)
    row = next(line for line in md.splitlines() if "memory limit" in line and "counted" in line)
    assert "2" in row and counted in row and not_counted in row
    assert "counted" not in next(line for line in render_markdown(report).splitlines() if "memory limit" in line)
