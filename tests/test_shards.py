"""An iterable dataset that does not split its stream between loader workers yields it all
in each of them: N workers would train on each sample N times, and the duplication reads
as a speed-up. Loader workers are not searched for such a dataset, and autotune says why."""

from __future__ import annotations

import optuna
import torch

from autotune import machine
from autotune.agent import Agent, Settings
from autotune.recipes import load_recipes
from autotune.shards import repeats_in_workers, same
from autotune.testing import FakeRunner
from workloads import Empty, Stream, Vectors


def test_a_stream_read_whole_in_each_worker_is_told():
    assert repeats_in_workers(Stream(64), 8) is True
    assert repeats_in_workers(Stream(64, split=True), 8) is False  # split with get_worker_info
    assert repeats_in_workers(Vectors(64), 8) is False  # map-style: the sampler splits it
    assert repeats_in_workers(Empty(), 8) is False  # nothing to read: nothing told


def test_batches_compare_by_value_through_their_structure():
    t = torch.arange(6).reshape(2, 3)
    assert same({"x": t, "y": [1, "a"]}, {"x": t.clone(), "y": [1, "a"]})
    assert not same({"x": t}, {"x": t + 1})
    assert not same((t, t), (t, t.float()))  # a dtype apart
    assert not same([t], [t, t])


def _run(tmp_path, facts):
    """A CPU-bound data wait of 40% that loader workers would take away (2x the speed)."""
    runner = FakeRunner(lambda c: 200.0 if c.data.num_workers else 100.0, noise=0.005,
                        stages=lambda c: {"data": 0.0 if c.data.num_workers else 0.4, "forward": 0.3, "backward": 0.3})
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    return Agent(runner, load_recipes(), storage, "s", Settings(only=("dataloader",)), facts).run()


def test_workers_are_not_searched_for_a_stream_each_would_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "cores", lambda: 2)
    report = _run(tmp_path, {"conv": False, "repeats_in_workers": True})
    assert report.budget.trials_used == 0 and not report.steps
    assert "dataloader does not apply" in report.stop_reason and "each sample N times" in report.stop_reason


def test_the_same_wait_on_a_split_dataset_gets_its_workers(tmp_path, monkeypatch):
    monkeypatch.setattr(machine, "cores", lambda: 2)
    report = _run(tmp_path, {"conv": False, "repeats_in_workers": False})
    assert report.budget.trials_used > 0 and any(s.accepted and "data.num_workers" in s.changes for s in report.steps)


def test_profile_says_the_loader_does_not_apply_to_such_a_stream(tiny_target, capsys):
    from autotune.cli import main

    path = tiny_target("stream.py", """
        def workload():
            return make(dataset=lambda: Stream(256, latency_s=0.002), batch_size=8)
    """)
    assert main(["profile", str(path), "--windows", "2", "--steps", "4", "--warmup", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Bottleneck: input" in out
    assert "not listed: dataloader does not apply" in out and "each sample N times" in out
