"""`autotune profile`'s diagnosis names every planted bottleneck, on small versions."""

from __future__ import annotations

import pytest
import torch

from autotune import Protocol, TrainConfig, diagnose, load_workload, measure

CASES = [
    ("input_bound", "input", None),
    ("decode_bound", "input", None),
    ("overhead_bound", "launch", None),
    ("compute_bound", "compute", None),
    ("memory_bound", "memory", 16 * 2**20),
    ("sync_bound", "compute", None),  # on CPU a sync costs little: a waste beside compute, not the bottleneck
]
WASTE = {"sync_bound": "sync"}


@pytest.mark.parametrize("name,expected,limit", CASES)
def test_planted_bottleneck_is_diagnosed(example, name, expected, limit):
    wl = load_workload(example(name))
    # One intra-op thread: the plants do not depend on threads, and with two, any other
    # process on these 2 cores can stall OpenMP barriers 50-100x, turning
    # microsecond ops into milliseconds and the launch-bound example into "compute".
    config = TrainConfig().with_changes({"backend.num_threads": 1})
    m = measure(wl, config, torch.device("cpu"), Protocol(windows=3, steps=16, warmup_steps=2))
    s = m.summary()
    v = diagnose(s, "cpu", limit)
    assert v.bottleneck.value == expected, (v.reason, v.evidence)
    assert WASTE.get(name, expected) in [w.cls.value for w in v.wastes]
    assert s.measured_steps == 48 and s.peak_memory_bytes > 0
