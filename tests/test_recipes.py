"""Every shipped recipe is valid; user recipes add or override by name; errors name the field."""

from __future__ import annotations

import optuna
import pytest

from autotune.agent import Agent, Settings
from autotune.config import KEYS, TrainConfig
from autotune.diagnose import Bottleneck
from autotune.errors import UserError
from autotune.recipes import load_recipes, matching
from autotune.search import normalized
from autotune.testing import FakeRunner

SHIPPED = load_recipes()


def test_the_ladder_is_in_design_order():
    names = [r.name for r in SHIPPED]
    # ddp (DDP workloads only) changes no number computed, only how gradients are sent:
    # cheap, beside the transfer settings; the design's ladder keeps its order around it.
    assert names == ["dataloader", "threads", "transfer", "ddp", "optimizer-impl", "attention", "tf32-cudnn", "amp",
                     "channels-last", "compile", "micro-batch", "activation-checkpointing"]


@pytest.mark.parametrize("recipe", SHIPPED, ids=lambda r: r.name)
def test_every_shipped_recipe_builds_valid_configs(recipe):
    assert recipe.targets and recipe.tradeoffs and recipe.summary
    for device in recipe.devices:
        space = recipe.space(device, cores=2, batch=64)
        assert space and all(k in KEYS for k in space)
        # the defaults of a workload the recipe applies to (a distributed one for ddp)
        base = TrainConfig().with_changes({"distributed.world_size": 2} if "distributed" in recipe.requires else {})
        for key, values in space.items():
            for v in values:  # each value alone, from the defaults, must give a valid config
                normalized(base, {key: v, **({"data.num_workers": 1} if key.startswith("data.p") else {})})


def test_ranges_adapt_to_the_machine():
    loader = next(r for r in SHIPPED if r.name == "dataloader")
    assert max(loader.space("cpu", cores=2, batch=32)["data.num_workers"]) == 8
    assert max(loader.space("cpu", cores=4, batch=32)["data.num_workers"]) == 16
    assert "backend.num_threads" not in loader.space("cuda", cores=2, batch=32)
    threads = next(r for r in SHIPPED if r.name == "threads")
    assert threads.space("cpu", cores=2, batch=32) == {"backend.num_threads": [1]}
    assert threads.space("cpu", cores=16, batch=32) == {"backend.num_threads": [8, 4, 2, 1]}  # half the cores first
    assert threads.space("cpu", cores=1, batch=32) == {}  # nothing fewer than one core
    compile_ = next(r for r in SHIPPED if r.name == "compile")
    assert "reduce-overhead" in compile_.space("cuda", 2, 32)["compile.mode"]
    assert compile_.space("cpu", 2, 32)["compile.mode"] == ["default", "max-autotune-no-cudagraphs"]  # no CUDA graphs
    micro = next(r for r in SHIPPED if r.name == "micro-batch")
    assert micro.space("cpu", 2, 96)["memory.micro_batch_size"] == [6, 8, 12, 16, 24, 32, 48]


def test_matching_respects_device_and_model_facts():
    none = {"conv": False, "checkpoint_blocks": False}
    assert [r.name for r in matching(SHIPPED, Bottleneck.INPUT, "cpu", none)] == ["dataloader", "threads"]
    assert "transfer" in [r.name for r in matching(SHIPPED, Bottleneck.INPUT, "cuda", none)]
    assert [r.name for r in matching(SHIPPED, Bottleneck.MEMORY, "cpu", none)] == ["amp", "micro-batch"]
    both = {"conv": True, "checkpoint_blocks": True}
    assert "channels-last" in [r.name for r in matching(SHIPPED, Bottleneck.COMPUTE, "cpu", both)]
    assert "activation-checkpointing" in [r.name for r in matching(SHIPPED, Bottleneck.MEMORY, "cpu", both)]


@pytest.mark.parametrize("text,field", [
    ("name: x\ntargets: [speed]\ncost: 1\nknobs: {data.num_workers: {choices: [1]}}\ntradeoffs: t\n", "targets"),
    ("name: x\ntargets: [input]\ncost: 1\nknobs: {data.workers: {choices: [1]}}\ntradeoffs: t\n", "knobs.data.workers"),
    ("name: x\ntargets: [input]\ncost: 1\nknobs: {data.num_workers: {choices: []}}\ntradeoffs: t\n", "choices"),
    ("name: x\ntargets: [input]\ncost: cheap\nknobs: {data.num_workers: {choices: [1]}}\ntradeoffs: t\n", "cost"),
    ("name: x\ntargets: [input]\ncost: 1\nknobs: {data.num_workers: {choices: [1], max: 'import os'}}\ntradeoffs: t\n", "max"),
    ("targets: [input]\ncost: 1\nknobs: {data.num_workers: {choices: [1]}}\n", "name"),
    ("name: [unclosed\n", "not valid YAML"),
    ("name: x\ntargets: [input]\ncost: 1\nknobs: {data.num_workers: {choices: [1]}}\ntradeoffs: t\nfallbacks: 'yes'\n",
     "fallbacks"),
    ("name: x\ntargets: [input]\ncost: 1\nknobs: {data.num_workers: {choices: [1], skip_on: {tpu: [1]}}}\n"
     "tradeoffs: t\n", "skip_on"),
])
def test_a_malformed_recipe_names_the_file_and_field(tmp_path, text, field):
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(UserError) as err:
        load_recipes(tmp_path)
    assert "bad.yaml" in str(err.value) and field in str(err.value)


def test_a_user_recipe_is_used_without_code_changes(tmp_path):
    """A file alone overrides the shipped dataloader recipe: only its knob values are tried."""
    (tmp_path / "mine.yaml").write_text(
        "name: dataloader\ntargets: [input]\ncost: 1\nknobs:\n  data.num_workers: {choices: [3]}\n"
        "trials: 2\ntradeoffs: three workers, always\n")
    recipes = load_recipes(tmp_path)
    assert next(r for r in recipes if r.name == "dataloader").tradeoffs == "three workers, always"
    runner = FakeRunner(lambda c: 100.0 * (1 + c.data.num_workers),
                        stages=lambda c: {"data": 0.9, "forward": 0.1} if c.data.num_workers == 0 else {"forward": 1.0})
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'db.sqlite'}")
    r = Agent(runner, recipes, storage, "s", Settings(), {"conv": False, "checkpoint_blocks": False}).run()
    assert r.final_config["data.num_workers"] == 3
    assert {m["data.num_workers"] for m in runner.measured} == {0, 3}


def test_a_source_checkout_reads_its_own_recipes_folder(monkeypatch):
    """Run from a checkout that was never installed (`PYTHONPATH=. python -m autotune`),
    the package the wheel maps `recipes/` to does not exist: the folder itself is read."""
    import autotune.recipes as recipes

    monkeypatch.setattr(recipes, "SHIPPED_PACKAGE", "autotune_not_installed_recipe_files")
    assert [f.name for f in recipes.shipped_files()] == sorted(f.name for f in recipes.Path(recipes.__file__)
                                                                .resolve().parents[1].joinpath("recipes").glob("*.yaml"))
    assert [r.name for r in load_recipes()] == [r.name for r in SHIPPED]


def test_missing_recipes_folder_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="--recipes"):
        load_recipes(tmp_path / "nope")


def test_recipes_command_prints_the_ladder(capsys):
    from autotune.cli import main

    assert main(["recipes"]) == 0
    out = capsys.readouterr().out
    assert "dataloader" in out and "activation-checkpointing" in out and "trade-offs" in out
