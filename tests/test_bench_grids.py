"""Stored grids (loading, refusing one measured elsewhere) and the anytime curves, on a tiny
recorded grid: no measurement runs here."""

from __future__ import annotations

import json
import math
import shutil
import sys
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


# --- sessions and provenance (format 2), and the judge's shortlist ------------------------------------
def _reading(config, thr: float | None, wall: float = 2.0, losses=(2.0, 1.9)) -> dict:
    from autotune.config import TrainConfig

    ok = thr is not None
    return {"config": config.flat(), "changes": TrainConfig().diff(config), "started": "2026-12-07T00:00:00+00:00",
            "load_avg": [1.5, 1.2, 1.0], "samples_per_s": thr or 0.0, "measured_samples_per_s": thr,
            "windows_samples_per_s": [thr] * 2 if ok else [], "window_cv": 0.0 if ok else None, "feasible": ok,
            "reason": None if ok else "crash: the session process exited with code -9", "wall_s": wall,
            "peak_memory_bytes": 1000 if ok else None, "first_losses": list(losses) if ok else []}


def _fake_session(figures: dict[str, list[float | None]]):
    """A session that reads each config at `figures[config.short()][k]` in session k, and the sessions it saw."""
    seen: list[tuple[list[str], list[float]]] = []

    def session(case, runner, protocol, device, configs, constraints, log):
        k = len(seen)
        seen.append(([c.short() for c in configs], list(constraints.reference_losses)))
        return [_reading(c, figures[c.short()][k]) for c in configs]

    return session, seen


def test_a_measured_grid_keeps_every_session_and_its_provenance_and_reads_back(tmp_path):
    figures = {"defaults": [100.0, 110.0], "optimizer.impl=foreach": [200.0, 180.0]}
    session, seen = _fake_session(figures)
    g = grids.measure(CASE, None, QUICK_PROTOCOL, CPU, lambda _: None, session=session)
    assert [order for order, _ in seen] == [list(figures), list(figures)[::-1]]  # reversed every session
    assert seen[0][1] == [] and seen[1][1] == [2.0, 1.9]  # the default's first losses are the reference after it
    assert g["format"] == grids.FORMAT == 2
    p = g["provenance"]
    assert p["sessions"] == grids.SESSIONS == 2 and p["host"] and p["load_avg_start"] is not None
    assert p["commit"] is None or len(p["commit"]) == 40
    assert isinstance(p["autotune_dirty"], (bool, type(None))) and p["started"] <= p["finished"]
    default, foreach = g["rows"]
    assert [s["samples_per_s"] for s in default["sessions"]] == [100.0, 110.0]
    assert default["samples_per_s"] == pytest.approx((100.0 * 110.0) ** 0.5)  # geometric mean of the sessions
    assert default["wall_s"] == 2.0 and len(default["windows_samples_per_s"]) == 2  # one reading's cost
    assert foreach["sessions"][1]["load_avg"] == [1.5, 1.2, 1.0]
    where = grids.save(g, CASE, tmp_path)
    back = grids.load(CASE, QUICK_PROTOCOL, CPU, tmp_path)
    assert back["rows"][1]["sessions"] == json.loads(json.dumps(foreach["sessions"]))
    assert back["provenance"] == json.loads(json.dumps(p)) and where.name == "quick_compute_bound.json"
    s = grids.summarize(back, 3)
    assert s["best"] == [1, 0] and s["shortlist"] == [1]  # 190 vs 105 with this little spread: foreach alone


def test_a_session_that_fails_makes_the_config_infeasible():
    session, _ = _fake_session({"defaults": [100.0, 100.0], "optimizer.impl=foreach": [300.0, None]})
    g = grids.measure(CASE, None, QUICK_PROTOCOL, CPU, lambda _: None, session=session)
    row = g["rows"][1]
    assert not row["feasible"] and row["samples_per_s"] == 0.0 and "exited with code -9" in row["reason"]
    assert grids.shortlist(g).rows == [0]


def test_an_old_grid_without_sessions_still_loads_and_shortlists_its_fixed_top(here):
    g = grids.load(CASE, QUICK_PROTOCOL, CPU, here)
    assert g["format"] == 1 and "provenance" not in g and "sessions" not in g["rows"][0]
    s = grids.shortlist(g)
    assert s.rows == grids.summarize(g, 3)["best"] and s.sd is None and "one reading" in s.basis


def _grid(sessions: list[list[float | None]]) -> dict:
    rows = []
    for xs in sessions:
        ok = all(x is not None for x in xs)
        rows.append({"feasible": ok, "samples_per_s": 1.0 if ok else 0.0,
                     "sessions": [{"measured_samples_per_s": x} for x in xs]})
    return {"rows": rows}


def test_the_shortlist_is_every_config_whose_interval_reaches_the_bests():
    g = _grid([[100, 104], [103, 99], [96, 100], [80, 83], [150, None], [60, 58]])
    s = grids.shortlist(g)
    assert s.rows == [0, 1, 2] and s.dof == 5  # the infeasible one has no readings; 5 configs of 2
    lo, hi = s.intervals[0]
    assert lo < 102 < hi and s.intervals[3][1] < s.intervals[0][0]
    assert all(s.intervals[i][1] >= s.intervals[0][0] for i in s.rows)
    sd = (sum((math.log(a) - math.log(b)) ** 2 / 2 for a, b in ([100, 104], [103, 99], [96, 100], [80, 83], [60, 58]))
          / 5) ** 0.5
    assert s.sd == pytest.approx(sd)


def test_the_shortlist_is_not_a_fixed_three():
    close = [[100, 120], [118, 99], [110, 105], [95, 115], [112, 101]]
    many = grids.shortlist(_grid([*close, [60, 58]]))
    assert set(many.rows) == {0, 1, 2, 3, 4}  # five it cannot tell apart, not the first three
    means = [math.prod(xs) for xs in close]
    assert many.rows == sorted(range(5), key=lambda i: -means[i])  # fastest first
    one = grids.shortlist(_grid([[200, 201], [100, 101], [99, 100]]))
    assert one.rows == [0]  # a clear winner stands alone
    assert grids.shortlist(_grid([[None, 1.0]])).rows == [] and grids.shortlist({"rows": []}).rows == []


@pytest.mark.slow
def test_a_tiny_held_out_grid_measures_in_two_processes_and_loads(tmp_path):
    from benchmarks.cases import QUICK_HELDOUT

    case = next(c for c in QUICK_HELDOUT if c.name == "ctr")
    lines: list[str] = []
    threads = torch.get_num_threads()
    (where,) = grids.measure_all([case], QUICK_PROTOCOL, CPU, lines.append, tmp_path)
    assert torch.get_num_threads() == threads
    g = grids.load(case, QUICK_PROTOCOL, CPU, tmp_path)
    assert g["format"] == 2 and len(g["rows"]) == len(case.configs()) == 2
    assert all(len(r["sessions"]) == 2 and r["feasible"] for r in g["rows"]), g["rows"]
    assert g["provenance"]["sessions"] == 2 and "fresh process" in g["runner"]
    assert sum("session 2/2" in x for x in lines) == 1


FAKE_SESSION = """
import json, sys, time
spec = json.load(open(sys.argv[1]))
with open(sys.argv[2], "a") as out:
    for c in spec["configs"]:
        if c["optimizer.impl"] == "foreach":
            sys.exit("a segfault, as it were")
        if c["optimizer.impl"] == "fused":
            time.sleep(30)
        out.write(json.dumps({"config": c, "changes": {}, "started": "", "load_avg": None, "samples_per_s": 10.0,
                              "measured_samples_per_s": 10.0, "windows_samples_per_s": [10.0], "window_cv": 0.0,
                              "feasible": True, "reason": None, "wall_s": 0.1, "peak_memory_bytes": None,
                              "first_losses": [1.0]}) + "\\n")
        out.flush()
"""


def test_a_config_that_kills_or_hangs_its_session_fails_alone(monkeypatch, tmp_path):
    from autotune.config import TrainConfig
    from autotune.search import Constraints
    from benchmarks import sessions

    script = tmp_path / "fake_session.py"
    script.write_text(FAKE_SESSION)
    monkeypatch.setattr(sessions, "TIMEOUT_S", 1.0)
    impls = ["default", "foreach", "default", "fused", "default"]
    configs = [TrainConfig().with_changes({"optimizer.impl": i, "backend.num_threads": n + 1})
               for n, i in enumerate(impls)]
    rows = sessions.in_one_process(CASE, QUICK_PROTOCOL, CPU, configs, Constraints(None, []), lambda _: None,
                                   command=(sys.executable, str(script)))
    assert [r["config"]["backend.num_threads"] for r in rows] == [1, 2, 3, 4, 5]  # every config, in order
    assert [r["feasible"] for r in rows] == [True, False, True, False, True]
    assert rows[1]["reason"].startswith("crash: the session process exited with code 1 (a segfault, as it were)")
    assert rows[3]["reason"].startswith("timeout: no reading within 1 s")
