"""The workers benchmark's Markdown, from a stored result (the run itself takes minutes:
`python -m benchmarks.workers --quick` is its smoke run)."""

from __future__ import annotations

from benchmarks.workers import to_markdown


def _arm(workers: int, search_s: float, wall_s: float, config: dict) -> dict:
    return {"workers": workers, "cores": [0], "wall_s": wall_s, "search_s": search_s, "trials": 12,
            "final_config": config, "speedup": {"ratio": 3.0}, "changes": {"data.num_workers": [0, 4]},
            "measured_by": []}


def test_the_table_reports_ratios_and_what_differs():
    one = _arm(1, 200.0, 330.0, {"data.num_workers": 4, "backend.num_threads": 1})
    two = _arm(2, 100.0, 220.0, {"data.num_workers": 4, "backend.num_threads": None})
    res = {"command": "c", "target": "t", "recipe": "dataloader", "trials_limit": 12, "machine": "m", "load_before": [1.0],
           "arms": [one, two], "search_ratio": 2.0, "wall_ratio": 1.5, "same_config": False}
    md = to_markdown(res)
    assert "**2.00x**" in md and "1.50x" in md
    assert "`backend.num_threads`: 1 with 1 worker, None with 2" in md
    assert "num_workers=4" in md
