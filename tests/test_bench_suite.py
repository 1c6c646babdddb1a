"""The benchmark suite's --quick mode runs end to end and writes every section it promises.

Only structure is checked: figures measured on a shared two-core machine in a smoke run
mean nothing, and targets are reported, never asserted.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import torch

from benchmarks import suite
from benchmarks.__main__ import main
from benchmarks.cases import CASES, QUICK_CASES, select

EXAMPLES = ("input_bound", "memory_bound")  # an in-process case and an isolated one


@pytest.mark.slow
@pytest.mark.timeout(2400)  # ~8 min on 2 idle cores; more than twice that where other work shares them
def test_quick_run_writes_json_and_markdown(tmp_path, capsys):
    threads = torch.get_num_threads()
    out_json, out_md = tmp_path / "suite.json", tmp_path / "suite.md"
    code = main(["--quick", "--quiet", "--measure-grid", "--grid-dir", str(tmp_path / "grids"), "--examples",
                 ",".join(EXAMPLES), "--json", str(out_json), "--md", str(out_md)])
    assert code == 0
    assert torch.get_num_threads() == threads
    assert capsys.readouterr().out == ""  # with --md, nothing on stdout
    assert sorted(p.name for p in (tmp_path / "grids").iterdir()) == [f"quick_{n}.json" for n in sorted(EXAMPLES)]

    r = json.loads(out_json.read_text())
    assert r["benchmark"] == "suite" and r["quick"] is True
    assert r["protocol"]["windows"] == suite.QUICK_PROTOCOL.windows
    assert [c["name"] for c in r["cases"]] == list(EXAMPLES)
    for c in r["cases"]:
        assert set(suite.METHODS) <= set(c["methods"])
        for name, m in c["methods"].items():
            assert isinstance(m["samples_per_s"], float), name
            assert m["samples_per_s"] > 0 or not m["feasible"], (c["name"], name, m)
            assert "ratio" in m["ratio_to_oracle"]
        assert c["grid_summary"]["source"] == "measured"
        assert c["methods"]["oracle"]["trials"] == c["grid_size"] == len(c["grid_results"]["rows"])
        assert c["methods"]["oracle"]["windows"] == c["grid_summary"]["windows"] >= c["grid_size"]
        assert c["methods"]["autotune"]["windows"] >= 3 * r["protocol"]["windows"]  # at least the baseline and an A/A
        assert c["methods"]["rule_of_thumb"]["windows"] <= r["protocol"]["windows"]
        assert c["judge"]["looks"] == suite.QUICK_JUDGE_LOOKS[0] and c["judge"]["windows"] > 0
        assert c["methods"]["oracle"]["ratio_to_oracle"]["ratio"] == 1.0
        assert c["methods"]["oracle"]["label"] in c["methods"]
        for m in suite.SEARCHES:
            assert c["methods"][m]["trials"] == max(1, c["methods"]["autotune"]["trials"])
        curves = c["anytime"]["methods"]
        assert set(curves) == {"autotune", *suite.SEARCHES}
        assert len(curves["blind_tpe"]["points"]) == c["methods"]["blind_tpe"]["trials"]
        assert c["diagnosis"]["planted"] in {"input", "memory"}
        assert isinstance(c["diagnosis"]["correct"], bool)
        steps = c["autotune"]["steps"]  # each round's trials, to replay what the search saw
        assert sum(len(st["tried"]) for st in steps) == sum(st["trials"] for st in steps) >= 1
        assert all("changes" in t and "state" in t for st in steps for t in st["tried"])
        assert {"oracle", "oracle_lower", "windows", "wall", "not_below_default", "beats_rule_where_wrong",
                "at_least_rule", "within_limit", "not_below_blind", "not_below_random"} <= set(c["targets"])
    assert r["cases"][1]["runner"].startswith("a process per measurement")
    assert r["cases"][1]["targets"]["within_limit"]["met"] is not None  # memory_bound runs under a limit
    assert any("pin_memory" in n for n in r["cases"][0]["rule_of_thumb"]["notes"])  # dropped on CPU, and said so

    fa = r["false_acceptances"]
    assert len(fa["runs"]) == suite.QUICK_PLACEBO_RUNS and {x["workload"] for x in fa["runs"]} == {"input", "compute",
                                                                                                     "memory"}
    assert fa["decided"] >= fa["accepted"] >= 0 and len(fa["interval"]) == 2
    assert isinstance(fa["met"], bool) and fa["why_nothing_helps"]
    assert set(fa["model"]["power"]) == {"1.05", "1.10", "1.20"}
    o = r["overheads"]
    assert "error" not in o, o.get("error")
    assert o["summary"] and all(s["instrumented_vs_bare"] is not None for s in o["summary"])
    assert {"oracle_every_example", "better_than_blind_on_half", "diagnosis", "no_false_acceptances"} <= set(r["targets"])

    md = out_md.read_text()
    assert md.startswith("# autotune benchmark suite (--quick)")
    for section in ("## Targets", "## Methods against the grid's best", "## Anytime curves", "## Grids",
                    "## Diagnosis", "## Rule of thumb", "## False acceptances", "## Overheads"):
        assert section in md
    for name in EXAMPLES:
        assert f"| {name} | autotune |" in md
    svg = tmp_path / "suite-anytime.svg"
    assert r["svg"] == svg.name and f"({svg.name})" in md
    ET.fromstring(svg.read_text())  # well-formed

    # The grids just stored are read back, not measured again.
    assert main(["--quick", "--quiet", "--no-extras", "--grid-dir", str(tmp_path / "grids"), "--examples",
                 "input_bound", "--json", str(out_json), "--md", str(out_md)]) == 0
    assert json.loads(out_json.read_text())["cases"][0]["grid_summary"]["source"] == "stored"


def test_every_grid_holds_the_default_first_and_no_duplicates():
    from autotune.config import TrainConfig

    for case in CASES + QUICK_CASES:
        configs = case.configs()
        assert configs[0] == TrainConfig(), case.name
        assert len({tuple(sorted(c.flat().items())) for c in configs}) == len(configs), case.name
        assert case.workload().batch_size > 0


def test_unknown_example_is_bad_input(capsys):
    assert main(["--quick", "--examples", "nope"]) == 2
    assert "--examples" in capsys.readouterr().err
    assert [c.name for c in select(CASES, "memory_bound.py,input_bound")] == ["input_bound", "memory_bound"]


def test_a_judged_ratio_counts_each_shared_session_once():
    """Two sessions whose pairs each agree closely but disagree with each other: the
    interval over sessions is wide; pooled as one session's pairs it would be narrow. A
    label measured in one session only (the default) is paired on that session's windows."""
    from autotune.stats import paired_ratio
    from benchmarks.methods import session_ratio

    a = [100.0, 101.0, 99.0, 100.0, 100.0, 100.0]
    b = [120.0, 121.0, 119.0, 95.0, 96.0, 94.0]
    over = session_ratio(a, [0, 0, 0, 1, 1, 1], b, [0, 0, 0, 1, 1, 1])
    pooled = paired_ratio(a, b)
    assert over["looks"] == 2 and over["pairs"] == 6
    assert over["high"] / over["low"] > 2 * pooled["high"] / pooled["low"]
    alone = session_ratio(a, [0, 0, 0, 1, 1, 1], b[:3], [0, 0, 0])
    assert alone == paired_ratio(a[:3], b[:3])
