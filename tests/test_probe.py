"""The low-precision probe: the amp recipe's prior measured on this machine's matmuls, so
autocast is not tried for speed where bf16/fp16 are emulated (an EPYC without AMX: bf16
~20x slower) and only the fast dtype is tried where one is (a Xeon with AMX: bf16 only)."""

from __future__ import annotations

import optuna
import torch

from autotune import probe
from autotune.agent import Agent, Settings
from autotune.recipes import load_recipes
from autotune.record import Bottleneck
from autotune.testing import FakeRunner

from test_decisions import FACTS, run_agent

COMPUTE = {"forward": 0.45, "backward": 0.45, "optimizer": 0.1}


def test_the_probe_measures_each_lower_precision_against_fp32_on_cpu():
    lowp = probe.lowp_matmul(torch.device("cpu"))
    assert set(lowp) == {"bf16", "fp16"}
    assert all(isinstance(v, float) and v >= 0 for v in lowp.values())
    assert probe.lowp_matmul(torch.device("meta")) == {}  # not a CPU: not measured


def test_the_prior_follows_the_fast_units():
    assert probe.fast({}) == {"bf16", "fp16"}  # not measured: every dtype may be tried
    assert probe.fast({"bf16": 24.0, "fp16": 1.0}) == {"bf16"}
    assert probe.fast({"bf16": 0.05, "fp16": 0.9}) == set()
    assert probe.amp_prior({}, 1.4) == 1.4
    assert probe.amp_prior({"bf16": 24.0, "fp16": 1.0}, 1.4) == probe.PRIOR_CAP
    assert probe.amp_prior({"bf16": 1.5, "fp16": 1.0}, 1.4) == 1.5
    assert probe.amp_prior({"bf16": 0.05, "fp16": 0.9}, 1.4) == 1.0


def _speed(c):
    return 100.0 * {"none": 1.0, "bf16": 1.5, "fp16": 0.05}[c.precision.amp]


def test_autocast_is_not_tried_for_speed_where_no_precision_is_fast(tmp_path):
    runner = FakeRunner(_speed, noise=0.01, stages=lambda c: COMPUTE, lowp={"bf16": 0.05, "fp16": 0.9})
    r = run_agent(runner, tmp_path, only=("amp",))
    assert r.steps == [] and all(c["precision.amp"] == "none" for c in runner.measured)
    assert r.machine.lowp_matmul == {"bf16": 0.05, "fp16": 0.9}
    assert "autocast does not apply for speed here" in r.stop_reason and "bf16 0.05x" in r.stop_reason


def test_only_the_fast_precision_is_searched_for_speed(tmp_path):
    runner = FakeRunner(_speed, noise=0.01, stages=lambda c: COMPUTE, lowp={"bf16": 24.0, "fp16": 1.0})
    r = run_agent(runner, tmp_path, only=("amp",))
    tried = [t.config["precision.amp"] for s in r.steps for t in s.trials]
    assert tried == ["bf16"], tried
    assert r.final_config["precision.amp"] == "bf16"


def test_a_memory_search_keeps_the_slow_precisions(tmp_path):
    """Over the limit, a slow precision still saves memory: the joint search keeps it."""

    def memory(c):
        return 60 if c.precision.amp != "none" else 190

    runner = FakeRunner(lambda c: 100.0 * (0.5 if c.precision.amp != "none" else 1.0), memory=memory, noise=0.01,
                        stages=lambda c: COMPUTE, lowp={"bf16": 0.05, "fp16": 0.9})
    r = run_agent(runner, tmp_path, memory_limit=100)
    assert r.steps[0].bottleneck is Bottleneck.MEMORY
    assert any(t.config["precision.amp"] != "none" for t in r.steps[0].trials)
    assert r.final.peak_memory_bytes <= 100


def test_a_resumed_run_reads_the_stored_probe(tmp_path):
    class Counting(FakeRunner):
        probes = 0

        def lowp_matmul(self):
            Counting.probes += 1
            return {"bf16": 3.0, "fp16": 1.0}

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    for _ in range(2):
        runner = Counting(_speed, noise=0.01, stages=lambda c: COMPUTE)
        r = Agent(runner, load_recipes(), storage, "s", Settings(only=("amp",)), FACTS).run()
    assert Counting.probes == 1
    assert r.machine.lowp_matmul == {"bf16": 3.0, "fp16": 1.0}
