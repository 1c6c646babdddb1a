"""Stored grids (loading, refusing one measured elsewhere) and the anytime curves, on a tiny
recorded grid: no measurement runs here."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from benchmarks import anytime, grids
from benchmarks.__main__ import main
from benchmarks.cases import QUICK_CASES
from benchmarks.methods import search_stored
from benchmarks.suite import QUICK_PROTOCOL

DATA = Path(__file__).resolve().parent / "data" / "grids"  # quick_compute_bound.json, recorded on "Test CPU"
CPU = torch.device("cpu")
CASE = next(c for c in QUICK_CASES if c.name == "compute_bound")


@pytest.fixture
def here(tmp_path) -> Path:
    """The recorded grid, re-labelled as measured on this machine."""
    g = json.loads((DATA / "quick_compute_bound.json").read_text())
    g["machine"] = grids.machine(CPU)
    (tmp_path / "quick_compute_bound.json").write_text(json.dumps(g))
    return tmp_path


def test_a_grid_from_this_machine_loads(here):
    g = grids.load(CASE, QUICK_PROTOCOL, CPU, here)
    assert len(g["rows"]) == len(CASE.configs()) == 2
    s = grids.summarize(g, 3)
    assert s["trials"] == 2 and s["default"] is g["rows"][0] and s["best"]
    assert all(g["rows"][i]["feasible"] for i in s["best"])


def test_a_grid_from_another_machine_is_refused_with_what_differs_and_the_fix():
    with pytest.raises(grids.GridRefused) as exc:
        grids.load(CASE, QUICK_PROTOCOL, CPU, DATA)
    msg = str(exc.value)
    assert "Test CPU" in msg and "cpu:" in msg and "--measure-grid --examples compute_bound" in msg


def test_one_cpu_name_with_other_vector_units_is_another_machine(monkeypatch, here):
    """A virtual machine's "AMD EPYC" is an AVX2-only CPU on one host and one with
    AVX512-BF16 on the next: a grid from the one is refused on the other, filed apart."""
    g = json.loads((here / "quick_compute_bound.json").read_text())
    monkeypatch.setattr(grids, "cpu_name", lambda: "AMD EPYC")
    monkeypatch.setattr(grids, "cpu_isa", lambda: "avx2")
    (here / "quick_compute_bound.json").write_text(json.dumps({**g, "machine": grids.machine(CPU)}))
    avx2 = grids.machine_folder(CPU).name
    assert grids.load(CASE, QUICK_PROTOCOL, CPU, here)["rows"]
    monkeypatch.setattr(grids, "cpu_isa", lambda: "avx512_bf16")
    assert grids.machine_folder(CPU).name == f"amd-epyc-avx512-bf16-{grids.cores()}c" != avx2
    with pytest.raises(grids.GridRefused, match="isa: stored 'avx2', here 'avx512_bf16'"):
        grids.load(CASE, QUICK_PROTOCOL, CPU, here)


def test_another_protocol_or_grid_definition_is_refused(here):
    from autotune.measure import Protocol

    with pytest.raises(grids.GridRefused, match="protocol windows"):
        grids.load(CASE, Protocol(warmup_steps=1, steps=3, windows=3, profile_steps=1), CPU, here)
    g = json.loads((here / "quick_compute_bound.json").read_text())
    g["grid"] = {"optimizer.impl": ["default"]}
    (here / "quick_compute_bound.json").write_text(json.dumps(g))
    with pytest.raises(grids.GridRefused, match="grid: stored"):
        grids.load(CASE, QUICK_PROTOCOL, CPU, here)


def test_a_grid_missing_configs_or_unreadable_or_absent_is_refused(here, tmp_path):
    g = json.loads((here / "quick_compute_bound.json").read_text())
    g["rows"] = g["rows"][:1]
    (here / "quick_compute_bound.json").write_text(json.dumps(g))
    with pytest.raises(grids.GridRefused, match="1 missing"):
        grids.load(CASE, QUICK_PROTOCOL, CPU, here)
    (here / "quick_compute_bound.json").write_text("{not json")
    with pytest.raises(grids.GridRefused, match="cannot be read"):
        grids.load(CASE, QUICK_PROTOCOL, CPU, here)
    with pytest.raises(grids.GridRefused, match="no stored grid"):
        grids.load(CASE, QUICK_PROTOCOL, CPU, tmp_path / "empty")


def test_the_command_line_refuses_a_foreign_grid_as_bad_input(tmp_path, capsys):
    shutil.copy(DATA / "quick_compute_bound.json", tmp_path)
    code = main(["--quick", "--quiet", "--no-extras", "--grid-dir", str(tmp_path), "--examples", "compute_bound"])
    assert code == 2
    err = capsys.readouterr().err
    assert "Test CPU" in err and "--measure-grid" in err and "Traceback" not in err
    assert main(["--quick", "--grids-only"]) == 2  # --grids-only without --measure-grid


def test_stored_searches_look_up_and_count_repeats_at_no_cost(here):
    g = grids.load(CASE, QUICK_PROTOCOL, CPU, here)
    for sampler in ("blind_tpe", "random"):
        s = search_stored(g, sampler, 5, seed=0, log=lambda _: None)
        assert s["trials"] == 5 and s["measured"] <= 2  # two configs: the rest are repeats
        assert s["trace"][0]["config"] == g["rows"][0]["config"]  # the default first
        assert s["wall_s"] == pytest.approx(sum(r["wall_s"] for r in g["rows"]
                                                if any(t["config"] == r["config"] for t in s["trace"])))
        assert all(t["reused"] for t in s["trace"][s["measured"]:]) or s["measured"] == 5
        assert s["samples_per_s"] == max(t["samples_per_s"] for t in s["trace"])
        again = search_stored(g, sampler, 5, seed=0, log=lambda _: None)
        assert [t["config"] for t in again["trace"]] == [t["config"] for t in s["trace"]]  # seeded


def test_anytime_curve_is_the_running_best_in_grid_units():
    rows = [{"config": {"data.num_workers": 1}, "samples_per_s": 100.0, "wall_s": 2.0},
            {"config": {"data.num_workers": 2}, "samples_per_s": 300.0, "wall_s": 3.0},
            {"config": {"data.num_workers": 3}, "samples_per_s": 200.0, "wall_s": 4.0}]
    stored = {"rows": rows}
    trace = [{"config": {"data.num_workers": 1}, "samples_per_s": 120.0, "wall_s": 5.0},   # in the grid: counted at 100
             {"config": {"data.num_workers": 9}, "samples_per_s": 250.0, "wall_s": 9.0},   # not in the grid: its own 250
             {"config": None, "samples_per_s": 0.0, "wall_s": 11.0},        # failed
             {"config": {"data.num_workers": 2}, "samples_per_s": 280.0, "wall_s": 15.0}]  # counted at 300
    units, own = anytime.in_grid_units(trace, stored)
    assert own == 2 and [t["samples_per_s"] for t in units] == [100.0, 250.0, 0.0, 300.0]
    pts = anytime.curve(units)
    assert [p["best"] for p in pts] == [100.0, 250.0, 250.0, 300.0]
    assert [p["trial"] for p in pts] == [1, 2, 3, 4] and pts[-1]["wall_s"] == 15.0
    assert anytime.best_after(pts, trials=2) == 250.0
    assert anytime.best_after(pts, wall_s=10.0) == 250.0 and anytime.best_after(pts, wall_s=1.0) is None
    assert anytime.reach(pts, 0.95 * 300) == {"trial": 4, "wall_s": 15.0}
    assert anytime.reach(pts, 301) is None
    c = anytime.curves({"autotune": trace}, stored, 0.95)
    assert c["grid_best_samples_per_s"] == 300.0 and c["grid_trials"] == 3 and c["grid_wall_s"] == 9.0
    assert c["methods"]["autotune"]["reached"] == {"trial": 4, "wall_s": 15.0}
    case = {"name": "x", "anytime": c}
    lines = anytime.table_lines([case], 0.95)
    assert lines[2].startswith("| x | autotune (2 own) | 0.33 | 0.83 |") and "4, 15 s" in lines[2]
    ET.fromstring(anytime.svg([case]))


def test_grids_are_stored_per_machine_and_a_missing_one_names_the_machines_that_have_it(monkeypatch, tmp_path):
    from benchmarks import cases

    monkeypatch.setattr(grids, "GRID_DIR", tmp_path)
    monkeypatch.setattr(grids, "cpu_name", lambda: "Intel(R) Xeon(R) Gold 6338")
    monkeypatch.setattr(grids, "cpu_isa", lambda: "avx512")
    assert grids.machine_folder(CPU).name == f"intel-xeon-gold-6338-avx512-{grids.cores()}c"
    (tmp_path / "amd-epyc-avx2-2c").mkdir()
    shutil.copy(DATA / "quick_compute_bound.json", tmp_path / "amd-epyc-avx2-2c")
    with pytest.raises(grids.GridRefused, match="stored for other machines: amd-epyc-avx2-2c"):
        grids.load(CASE, QUICK_PROTOCOL, CPU)
    g = json.loads((DATA / "quick_compute_bound.json").read_text())
    g["machine"] = grids.machine(CPU)
    assert grids.save(g, CASE).parent.name.startswith("intel-xeon-gold-6338")
    assert grids.load(CASE, QUICK_PROTOCOL, CPU)["rows"]
    assert cases.CASES  # the shipped grids are filed under a machine's folder, none at the top
    assert not list(Path(cases.__file__).parent.joinpath("grids").glob("*.json"))


def test_a_grid_holds_bf16_only_where_the_machine_has_units_for_it():
    from benchmarks.cases import CASES

    gpt = next(c for c in CASES if c.name == "gpt")
    assert gpt.lowp and "precision.amp" not in gpt.grid
    assert gpt.for_machine([]) is gpt  # emulated everywhere: the grid as it was
    fast = gpt.for_machine(["bf16"])
    assert fast.grid["precision.amp"] == ["none", "bf16"] and len(fast.configs()) == 2 * len(gpt.configs())
    decode = next(c for c in CASES if c.name == "decode_bound")
    assert decode.for_machine(["bf16"]) is decode  # a step that waits on decoding: no precision knob
