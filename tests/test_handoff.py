"""The loader hand-off probe (`autotune.handoff`) and what it decides: loader workers are
searched only where the step loads a batch in its own process for longer than receiving
one from a worker costs, by enough for the noise to resolve."""

from __future__ import annotations

import math

import optuna
import torch

from autotune import machine
from autotune.agent import Agent, Settings
from autotune.handoff import batch_handoff_s
from autotune.recipes import load_recipes
from autotune.testing import FakeRunner
from autotune.workload import Workload

FACTS = {"conv": False, "checkpoint_blocks": True}


def _run(tmp_path, data: float, handoff: float | None, workers_speed: float, **kw):
    """A CPU-bound data wait of `data` on a FakeRunner step of 0.32 s (batch 32 at 100
    samples/s), loader workers multiplying the speed by `workers_speed`."""

    def speed(c):
        return 100.0 * (workers_speed if c.data.num_workers else 1.0)

    def stages(c):
        wait = 0.0 if c.data.num_workers else data
        return {"data": wait, "forward": (1 - wait) / 2, "backward": (1 - wait) / 2}

    runner = FakeRunner(speed, noise=0.005, stages=stages, handoff=handoff,
                        signals=lambda c: {} if c.data.num_workers else {"data_cpu_share": 1.0}, **kw)
    return Agent(runner, load_recipes(), optuna_storage(tmp_path), "s", Settings(only=("dataloader",)), FACTS).run()


def optuna_storage(tmp_path):
    return optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")


def test_workers_are_not_searched_where_a_hand_off_costs_more_than_the_step_spends_loading(tmp_path, monkeypatch):
    """overhead_bound's shape: 6% of the step loading in process (19 ms here), a worker's
    batch costs 50 ms to receive: no loader trial, and the stop reason says why."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    r = _run(tmp_path, data=0.06, handoff=0.05, workers_speed=0.5)
    assert not r.steps, [(s.recipe, s.reason) for s in r.steps]
    assert r.machine.batch_handoff_s == 0.05
    assert "handing a batch over from a loader worker costs 50.00 ms here, more than the" in r.stop_reason, \
        r.stop_reason
    assert "workers cannot shorten the wait" in r.stop_reason


def test_without_the_probe_the_same_wait_gets_its_loader_look(tmp_path, monkeypatch):
    """The guard of the test above: not measured, the 6% wait is worth its short look."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    r = _run(tmp_path, data=0.06, handoff=None, workers_speed=0.5)
    assert r.steps and r.steps[0].recipe == "dataloader"
    assert r.machine.batch_handoff_s is None and "handing a batch" not in r.stop_reason


def test_a_hand_off_that_leaves_too_little_of_the_wait_is_not_searched(tmp_path, monkeypatch):
    """A 12% wait (38 ms) of which receiving a batch would cost 32 ms: workers could gain
    at most 1.02x, within what the noise can resolve."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    r = _run(tmp_path, data=0.12, handoff=0.032, workers_speed=1.02)
    assert not r.steps, [(s.recipe, s.reason) for s in r.steps]
    assert "workers could gain at most 1.0" in r.stop_reason and "the noise can resolve" in r.stop_reason, \
        r.stop_reason


def test_workers_are_searched_where_loading_costs_far_more_than_the_hand_off(tmp_path, monkeypatch):
    """decode_bound's shape: 80% of the step loading in process, a hand-off of 2 ms: the
    loader is searched and kept."""
    monkeypatch.setattr(machine, "cores", lambda: 2)
    r = _run(tmp_path, data=0.8, handoff=0.002, workers_speed=2.0)
    assert r.steps and r.steps[0].recipe == "dataloader" and r.steps[0].accepted, r.steps[0].reason
    assert r.final_config["data.num_workers"] > 0


def test_a_resumed_run_reads_the_stored_probe(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "cores", lambda: 2)

    class Counting(FakeRunner):
        probes = 0

        def batch_handoff(self):
            Counting.probes += 1
            return 0.05

    storage = optuna_storage(tmp_path)
    for _ in range(2):
        r = Agent(Counting(lambda c: 100.0, noise=0.005), load_recipes(), storage, "s", Settings(only=("threads",)),
                  FACTS).run()
    assert Counting.probes == 1 and r.machine.batch_handoff_s == 0.05


class _Rows(torch.utils.data.Dataset):
    def __init__(self, n: int = 256, fail: bool = False) -> None:
        self.x, self.fail = torch.randn(n, 16), fail

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.fail:
            raise ValueError("no such row")
        return self.x[i], i % 3


def _workload(dataset) -> Workload:
    return Workload(name="rows", model=lambda: torch.nn.Linear(16, 3), dataset=lambda: dataset,
                    optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                    loss=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]), batch_size=16)


def test_the_probe_reads_a_real_hand_off_from_a_worker():
    h = batch_handoff_s(_workload(_Rows()))
    assert h is not None and math.isfinite(h) and 0 < h < 1.0


def test_a_dataset_that_fails_in_the_probe_reads_nothing():
    assert batch_handoff_s(_workload(_Rows(fail=True))) is None



def test_profile_says_why_the_loader_is_not_listed(tmp_path, monkeypatch, capsys):
    """`autotune profile` left the loader out of its recipe list without a word where the
    probe gated it: a recommender whose batches load in 1.25 ms, 29% of its step, read
    "Bottleneck: input" above a list with no loader recipe in it. It says why now; and
    where the hand-off is cheap, the loader is listed and nothing is said."""
    import json
    from pathlib import Path

    from autotune import handoff
    from autotune.cli import main

    target = str(Path(__file__).resolve().parents[1] / "examples" / "input_bound.py") + ":small"
    for hand, gated in ((10.0, True), (0.0, False)):  # a hand-off longer than any step; a free one
        monkeypatch.setattr(handoff, "batch_handoff_s", lambda workload, seed=0, h=hand: h)
        out_json = tmp_path / f"p{hand}.json"
        assert main(["profile", target, "--windows", "2", "--steps", "4", "--warmup", "1", "--json", str(out_json)]) == 0
        out = capsys.readouterr().out
        doc = json.loads(out_json.read_text())
        assert doc["diagnosis"]["bottleneck"] == "input"
        assert ("not listed: dataloader" in out and "handing a batch over" in out) is gated
        assert bool(doc["not_listed"]) is gated and ("dataloader" in doc["recipes"]) is not gated
