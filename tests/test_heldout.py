"""The held-out workloads (`benchmarks/heldout/`) build and train, and their cases are
well formed: tiny sizes, a few steps each, on CPU."""

from __future__ import annotations

import math

import pytest
import torch

import autotune
from autotune.loop import Trainer
from autotune.workload import facts, load_workload

from benchmarks import cases
from benchmarks.cases import CASES, HELDOUT, QUICK_HELDOUT, of_set, select

CPU = torch.device("cpu")
CONV = {"kws": True, "char_lstm": False, "ctr": False, "vit_small": True, "segnet": True}


def train(wl: autotune.Workload, steps: int, **changes) -> list[float]:
    torch.manual_seed(0)
    losses = [float(x) for x in Trainer(wl, autotune.TrainConfig().with_changes(changes), CPU).train(steps)]
    assert len(losses) == steps and all(math.isfinite(x) for x in losses), losses
    return losses


@pytest.mark.parametrize("case", QUICK_HELDOUT, ids=lambda c: c.name)
def test_a_tiny_version_trains_and_its_loss_moves(case):
    wl = case.workload()
    assert facts(wl)["conv"] is CONV[case.name]
    losses = train(wl, 3)
    assert len({round(x, 6) for x in losses}) > 1, losses


@pytest.mark.parametrize("case", HELDOUT, ids=lambda c: c.name)
def test_every_knob_of_its_grid_applies_at_once(case):
    """The grid's last combination (every knob off its default; compile left out: it takes
    seconds to compile) trains on the tiny version."""
    tiny = next(c for c in QUICK_HELDOUT if c.name == case.name)
    changes = {k: v[-1] for k, v in case.grid.items() if k != "compile.mode"}
    train(tiny.workload(), 2, **changes)


@pytest.mark.parametrize("case", HELDOUT, ids=lambda c: c.name)
def test_the_full_size_builds_from_its_target_string(case):
    wl = load_workload(str(case.path) + ":workload")
    assert wl.name and wl.batch_size >= 16
    model = wl.model()
    assert sum(p.numel() for p in model.parameters()) > 10_000
    assert case.target == f"benchmarks/heldout/{case.name}.py:workload()"


def test_the_held_out_cases_are_apart_from_the_bundled_ones():
    names = [c.name for c in CASES + HELDOUT]
    assert len(names) == len(set(names)) and len(HELDOUT) >= 5  # one grid file name each
    assert of_set("heldout") == HELDOUT and of_set("bundled") == CASES and of_set("all") == CASES + HELDOUT
    assert [c.name for c in select(of_set("heldout"), "ctr,kws")] == ["kws", "ctr"]
    for c in HELDOUT:
        assert c.heldout and c.set == "heldout" and c.describe()["set"] == "heldout"
        configs = c.configs()
        assert 6 <= len(configs) <= 32, (c.name, len(configs))
        assert configs[0] == autotune.TrainConfig()  # the default, first
        assert ("layout.channels_last" in c.grid) <= CONV[c.name]  # channels_last only where there are convolutions
        assert cases.__getattr__(c.name) == c.workload  # a worker loads it by `c.spec`
    with pytest.raises(autotune.errors.UserError, match="--set 'nine'"):
        of_set("nine")
