"""Reports: the three files, their content, and that an interrupted run still renders."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from autotune.errors import UserError
from autotune.report import render_html, render_markdown, rerender, write_reports

CONFIG0 = {
    "data.num_workers": 0, "data.prefetch_factor": None, "data.pin_memory": False, "data.persistent_workers": False,
    "data.non_blocking": False, "precision.amp": "none", "precision.tf32": False, "compile.mode": "none",
    "memory.micro_batch_size": None, "memory.activation_checkpointing": False, "layout.channels_last": False,
    "optimizer.impl": "default", "backend.cudnn_benchmark": False, "backend.num_threads": None,
}


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


def _diagnosis(bottleneck: str, stage: str, reason: str, data_share: float) -> dict:
    return {"bottleneck": bottleneck, "slowest_stage": stage, "reason": reason,
            "evidence": {"stage_shares": {"data": data_share, "forward": 0.3}, "data_share": data_share,
                         "input_threshold": 0.05, "syncs_per_step": 0.0, "comm_share": None, "mean_op_us": 61.2}}


def _trial(n: int, workers: int, sps: float | None, state: str = "ok", reason: str | None = None) -> dict:
    return {"number": n, "changes": {"data.num_workers": [0, workers]} if workers else {}, "samples_per_s": sps, "state": state,
            "reason": reason, "peak_memory_bytes": 812_000 if sps else None}


def make_report() -> dict:
    """A realistic report of an input-bound run: one accepted step, one rejected."""
    final_config = dict(CONFIG0, **{"data.num_workers": 8, "data.prefetch_factor": 2})
    baseline = _summary(CONFIG0, 33.5, {"data": 0.91, "h2d": 0.0, "forward": 0.04, "backward": 0.03,
                                        "optimizer": 0.01, "other": 0.01}, 478.0, 790_000)
    final = _summary(final_config, 8.1, {"data": 0.12, "h2d": 0.0, "forward": 0.38, "backward": 0.33,
                                         "optimizer": 0.09, "other": 0.08}, 1975.0, 812_000)
    return {
        "autotune_version": "0.1.0", "workload": "input-bound (I/O latency)", "target": "examples/input_bound.py",
        "device": "cpu",
        "machine": {"cores": 2, "torch": "2.13.0", "cpu": "Intel Xeon Platinum 8488C", "gpu": None, "python": "3.11.7"},
        "protocol": {"warmup_steps": 3, "steps": 12, "windows": 5, "seed": 0, "profile_steps": 3,
                     "window_rule": "each window at least 4x the loader's buffered batches",
                     "throughput": "samples over a window's wall time"},
        "memory_limit_bytes": None,
        "noise": {"ratio": 1.01, "low": 0.97, "high": 1.04, "pairs": 4, "margin": 1.05},
        "baseline": baseline, "final": final,
        "initial_diagnosis": _diagnosis("input", "data", "the step waits for data 91% of the time (> 5%)", 0.91),
        "diagnosis": _diagnosis("compute", "forward", "the step is spent in forward and no overhead rule fired", 0.12),
        "speedup": {"ratio": 4.13, "low": 3.88, "high": 4.41, "pairs": 4},
        "steps": [
            {"round": 1, "recipe": "dataloader", "bottleneck": "input",
             "trials": [_trial(0, 0, 481.0), _trial(1, 4, 1590.0), _trial(2, 8, 1962.0), _trial(3, 2, 930.0),
                        _trial(4, 16, None, "infeasible", "exceeds the 2 GiB memory limit"), _trial(5, 6, 1744.0),
                        _trial(6, 12, None, "failed", "worker killed by signal 9"), _trial(7, 8, 1948.0)],
             "accepted": True, "reason": "CI low 3.88x clears the noise margin 1.05x",
             "changes": {"data.num_workers": [0, 8], "data.prefetch_factor": [None, 2]},
             "speedup": {"ratio": 4.13, "low": 3.88, "high": 4.41, "pairs": 4}},
            {"round": 2, "recipe": "amp", "bottleneck": "compute",
             "trials": [{"number": 0, "changes": {}, "samples_per_s": 1969.0, "state": "ok", "reason": None,
                         "peak_memory_bytes": 812_000},
                        {"number": 1, "changes": {"precision.amp": ["none", "bf16"]}, "samples_per_s": 2001.0,
                         "state": "ok", "reason": None, "peak_memory_bytes": 640_000},
                        {"number": 2, "changes": {"precision.amp": ["none", "fp16"]}, "samples_per_s": 1702.0,
                         "state": "ok", "reason": None, "peak_memory_bytes": 650_000}],
             "accepted": False, "reason": "CI low 0.98x does not clear the noise margin 1.05x",
             "changes": {"precision.amp": ["none", "bf16"]},
             "speedup": {"ratio": 1.02, "low": 0.98, "high": 1.06, "pairs": 4}},
        ],
        "recommendations": [
            {"recipe": "dataloader", "changes": {"data.num_workers": [0, 8], "data.prefetch_factor": [None, 2]},
             "speedup": 4.13, "ci": [3.88, 4.41], "memory_delta_bytes": 22_000, "accepted": True, "reason": None,
             "one_time_s": 0.21, "payoff_steps": 9,
             "snippet": "loader = DataLoader(dataset, batch_size=32, num_workers=8, prefetch_factor=2)"},
            {"recipe": "amp", "changes": {"precision.amp": ["none", "bf16"]}, "speedup": 1.02, "ci": [0.98, 1.06],
             "memory_delta_bytes": -172_000, "accepted": False,
             "reason": "CI low 0.98x does not clear the noise margin 1.05x <script>",
             "one_time_s": 0.0, "payoff_steps": None,
             "snippet": "with torch.autocast('cpu', dtype=torch.bfloat16):\n    loss = loss_fn(model, batch)"},
        ],
        "stop_reason": "the slowest stage is acceptable: compute-bound, and the compute recipes were tried",
        "budget": {"trials_used": 11, "trials_limit": 40, "wall_s": 300.5, "budget_s": None},
        "study": {"storage": "sqlite:///runs/input/study.db", "name": "input-bound"},
    }


@pytest.fixture
def report() -> dict:
    return make_report()


def test_write_reports_writes_three_files(report, tmp_path):
    write_reports(report, tmp_path / "out")
    out = tmp_path / "out"
    assert json.loads((out / "report.json").read_text()) == report
    assert (out / "report.md").read_text() == render_markdown(report)
    assert (out / "report.html").read_text() == render_html(report)
    assert not list(out.glob(".*.tmp")), "atomic writes leave no temporary files"


def test_markdown_has_recipes_speedup_and_snippet(report):
    md = render_markdown(report)
    for text in ("dataloader", "amp", "4.13×", "3.88–4.41", "`data.num_workers: 0 → 8`",
                 "`data.prefetch_factor: null → 2`", "num_workers=8, prefetch_factor=2", "rejected: CI low 0.98x",
                 "compute-bound", "11 trials of 40", "worker killed by signal 9", "input", "1.05×"):
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


def _interrupted(report: dict) -> dict:
    r = copy.deepcopy(report)
    for key in ("final", "speedup", "diagnosis", "stop_reason", "recommendations"):
        r.pop(key)
    r["steps"] = []
    return r


def test_interrupted_report_renders_and_says_what_is_missing(report, tmp_path):
    r = _interrupted(report)
    md, page = render_markdown(r), render_html(r)
    assert "incomplete" in md and "the final measurement" in md and "No recipe was tried" in md
    assert "incomplete" in page and "not measured" in page
    write_reports(r, tmp_path)
    assert (tmp_path / "report.html").exists()


@pytest.mark.parametrize("value", ["missing", None, "junk", [], {}])
def test_any_field_missing_or_wrong_still_renders(report, value):
    paths = [(k,) for k in report] + [("baseline", k) for k in report["baseline"]] + \
            [("steps", 0, k) for k in report["steps"][0]] + [("recommendations", 0, k) for k in report["recommendations"][0]] + \
            [("steps", 0, "trials", 0, k) for k in report["steps"][0]["trials"][0]] + \
            [("baseline", "stages", "data", "s"), ("noise", "margin"), ("speedup", "ratio")]
    for path in paths:
        r = copy.deepcopy(report)
        holder = r
        for k in path[:-1]:
            holder = holder[k]
        if value == "missing":
            holder.pop(path[-1])
        else:
            holder[path[-1]] = value
        assert render_markdown(r) and render_html(r), path


def test_empty_and_nan_reports_render():
    for r in ({}, {"speedup": {"ratio": float("nan")}, "baseline": {"samples_per_s": float("inf")}}):
        assert "autotune report" in render_markdown(r)
        assert "<svg" not in render_html(r) and "No trials were run" in render_html(r)


def test_rerender_missing_folder_or_json_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match=r"autotune tune .*--out"):
        rerender(str(tmp_path / "nope"))
    with pytest.raises(UserError, match=r"report\.json does not exist.*autotune tune"):
        rerender(str(tmp_path))
    (tmp_path / "report.json").write_text("{not json")
    with pytest.raises(UserError, match="cannot be read as JSON"):
        rerender(str(tmp_path))


def test_rerender_rewrites_markdown_and_html(report, tmp_path):
    (tmp_path / "report.json").write_text(json.dumps(report, indent=2))
    (tmp_path / "report.md").write_text("stale")
    assert rerender(str(tmp_path)) == 0
    assert (tmp_path / "report.md").read_text() == render_markdown(report)
    assert (tmp_path / "report.html").read_text() == render_html(report)


def test_cli_report_command(report, tmp_path, capsys):
    from autotune.cli import main

    (tmp_path / "report.json").write_text(json.dumps(report))
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "report.html").exists()
    assert main(["report", str(tmp_path / "missing")]) == 2


if __name__ == "__main__":  # render the fixture for a look: python tests/test_report.py /tmp/report.html
    import sys

    path = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/report.html")
    fixture = make_report()
    path.write_text(render_html(fixture))
    path.with_suffix(".md").write_text(render_markdown(fixture))
    print(path)
