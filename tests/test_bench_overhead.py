"""The overhead benchmark's quick mode runs in-process and writes the fields the README quotes."""

from __future__ import annotations

import json

import torch

from benchmarks import overhead

ARMS = ("bare", "autotune", "profiler")


def test_quick_run_writes_json_and_markdown(tmp_path, capsys):
    threads = torch.get_num_threads()
    out_json, out_md = tmp_path / "overhead.json", tmp_path / "overhead.md"
    assert overhead.main(["--quick", "--quiet", "--json", str(out_json), "--md", str(out_md)]) == 0
    assert torch.get_num_threads() == threads  # the benchmark puts the thread count back

    report = json.loads(out_json.read_text())
    assert report["benchmark"] == "overhead"
    assert report["rounds"] == overhead.QUICK_ROUNDS
    assert report["environment"]["threads"] == 1
    added = report["added_cost_per_step"]
    assert added["pairs"] == overhead.QUICK_PAIRS
    assert added["thread_cpu"]["bare_step_s"] > 0 and added["thread_cpu"]["autotune_step_s"] > 0

    assert [w["target"].rsplit("/", 1)[-1] for w in report["workloads"]] == [t for t, _, _ in overhead.QUICK_RUNS]
    for w in report["workloads"]:
        assert set(w["step_time_s"]) == set(ARMS)
        assert all(w["step_time_s"][a] > 0 for a in ARMS)
        for a in ARMS:
            per_round = w["step_time_s_per_round"][a]
            assert len(per_round) == overhead.QUICK_ROUNDS and all(t > 0 for t in per_round)
            assert w["window_cpu_s"][a] > 0
        assert w["profiler_start_stop_s"] > 0
        for key in ("autotune_overhead", "profiler_overhead", "profiler_overhead_with_start_stop", "autotune_cpu_overhead"):
            o = w[key]
            assert set(o) == {"overhead", "ci", "pairs"} and o["pairs"] == overhead.QUICK_ROUNDS
            assert isinstance(o["overhead"], float) and len(o["ci"]) == 2
        assert set(w["stage_timer_vs_profiler"]) == {"fraction", "bounds"}
        assert set(w["autotune_stages_s"]) == {"data", "h2d", "forward", "backward", "optimizer", "other"}
        assert w["added_share"] is not None
        assert set(w["targets"]) >= {"per_step_overhead_met", "per_step_fraction_met", "window_overhead_met"}
        assert "added_vs_profiler" in w and "added_vs_profiler_with_start_stop" in w

    md = out_md.read_text()
    assert md.startswith("| workload |") and "autotune overhead" in md
    for w in report["workloads"]:
        assert w["workload"] in md
    assert capsys.readouterr().out == ""  # with --md, nothing on stdout


def test_too_few_rounds_is_bad_input(capsys):
    assert overhead.main(["--rounds", "1", "--quick"]) == 2
    assert "--rounds" in capsys.readouterr().err
