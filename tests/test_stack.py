"""Near-misses stacked: changes that side by side could be neither shown nor ruled out
alone are measured together, once, under the same decision (`plan.stacked_recipe`)."""

from __future__ import annotations

import optuna

from autotune import machine
from autotune.agent import Agent, Settings
from autotune.config import TrainConfig
from autotune.plan import STACK, stacked_recipe
from autotune.recipes import load_recipes
from autotune.record import Bottleneck, Brief, Ratio, Step
from autotune.testing import FakeRunner

BRIEF = Brief(samples_per_s=100.0, peak_memory_bytes=None, step_time_s=0.01, one_time_s=0.0)
COMPUTE_ONLY = {"data": 0.0, "forward": 0.4, "backward": 0.4, "optimizer": 0.2}
MARGIN = 1.03


def step(recipe: str, changes: dict, ratio: float | None, accepted: bool = False, n: int = 1) -> Step:
    return Step(round=n, recipe=recipe, bottleneck=Bottleneck.COMPUTE, before=BRIEF, accepted=accepted,
                changes={k: [None, v] for k, v in changes.items()},
                speedup=None if ratio is None else Ratio(ratio=ratio, low=ratio - 0.1, high=ratio + 0.1, pairs=10))


def by_name() -> dict:
    return {r.name: r for r in load_recipes()}


def test_the_rejected_changes_that_pointed_up_are_stacked_most_gain_first():
    steps = [step("threads", {"backend.num_threads": 1}, 1.02, n=1),
             step("optimizer-impl", {"optimizer.impl": "fused"}, 1.06, n=2),
             step("compile", {"compile.mode": "default"}, 0.93, n=3),  # pointed down beyond the margin: left out
             step("amp", {"precision.amp": "bf16"}, 1.30, accepted=True, n=4),  # kept already
             step("layout", {"layout.channels_last": True}, None, n=5)]  # never compared
    r = stacked_recipe(steps, TrainConfig(), by_name(), MARGIN)
    assert r is not None and r.name == STACK and r.together
    assert {k.key: k.choices for k in r.knobs} == {"optimizer.impl": ("fused",), "backend.num_threads": (1,)}
    assert r.summary.index("optimizer-impl") < r.summary.index("threads")


def test_a_recipes_latest_round_speaks_for_it_and_one_part_alone_is_not_stacked():
    """threads pointed up in its first round and down when revisited: only the compile
    candidate is left, and one candidate alone was decided already."""
    steps = [step("threads", {"backend.num_threads": 1}, 1.04, n=1),
             step("compile", {"compile.mode": "default"}, 1.02, n=2),
             step("threads", {"backend.num_threads": 1}, 0.92, n=3)]
    assert stacked_recipe(steps, TrainConfig(), by_name(), MARGIN) is None


def test_one_near_miss_is_measured_again_when_a_change_was_kept_after_its_round():
    """overhead_bound: 1 thread read 1.00x [0.90, 1.10] before compile was kept (its grid's
    best is 1 thread with compile); that comparison was against a config that is gone, so
    the near-miss alone is measured once more from the current one. Kept before it, or
    nothing kept since: decided already."""
    threads = step("threads", {"backend.num_threads": 1}, 1.00, n=1)
    kept_after = [threads, step("compile", {"compile.mode": "default"}, 1.07, accepted=True, n=2)]
    r = stacked_recipe(kept_after, TrainConfig(), by_name(), MARGIN)
    assert r is not None and r.together and {k.key: k.choices for k in r.knobs} == {"backend.num_threads": (1,)}
    assert "after a later change was kept: threads (1.00x)" in r.summary
    kept_before = [step("compile", {"compile.mode": "default"}, 1.07, accepted=True, n=1),
                   step("threads", {"backend.num_threads": 1}, 1.00, n=2)]
    assert stacked_recipe(kept_before, TrainConfig(), by_name(), MARGIN) is None
    assert stacked_recipe([threads], TrainConfig(), by_name(), MARGIN) is None


def test_a_part_that_read_just_under_one_with_an_interval_past_the_margin_is_stacked_one_ruled_out_is_not():
    """transformer_encoder: bf16 read 0.99x [0.89, 1.11] and fused 1.05x, each rejected;
    the two together are its grid's best. A part whose interval stays under the margin
    (0.99x [0.97, 1.01]: it has been ruled out as a gain) is not a part."""
    bf16 = step("amp", {"precision.amp": "bf16"}, 0.99, n=1)
    fused = step("optimizer-impl", {"optimizer.impl": "fused"}, 1.05, n=2)
    r = stacked_recipe([bf16, fused], TrainConfig(), by_name(), MARGIN)
    assert r is not None and {k.key for k in r.knobs} == {"precision.amp", "optimizer.impl"}
    bf16.speedup = Ratio(ratio=0.99, low=0.97, high=1.01, pairs=25)
    assert stacked_recipe([bf16, fused], TrainConfig(), by_name(), MARGIN) is None


def test_a_key_is_stacked_from_the_part_that_gained_most_and_settings_already_in_place_are_not_parts():
    steps = [step("compile", {"compile.mode": "default"}, 1.02, n=1),
             step("compile-2", {"compile.mode": "max-autotune-no-cudagraphs"}, 1.05, n=2),
             step("threads", {"backend.num_threads": 1}, 1.03, n=3)]
    r = stacked_recipe(steps, TrainConfig(), by_name(), MARGIN)
    assert {k.key: k.choices for k in r.knobs} == {"compile.mode": ("max-autotune-no-cudagraphs",),
                                                   "backend.num_threads": (1,)}
    already = TrainConfig().with_changes({"backend.num_threads": 1})
    assert stacked_recipe(steps, already, by_name(), MARGIN) is None


def test_three_small_gains_rejected_one_by_one_are_kept_together(tmp_path, monkeypatch):
    """Each of fused, 1 thread and compile gains 2.5%, under the 3% least gain: each is
    rejected alone; stacked they gain 7.7% and are kept, the report saying what was stacked."""
    monkeypatch.setattr(machine, "cores", lambda: 2)

    def speed(c):
        gains = (c.optimizer.impl != "default", c.backend.num_threads == 1, c.compile.mode != "none")
        return 100.0 * 1.025 ** sum(gains)

    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'study.db'}")
    runner = FakeRunner(speed, noise=0.01, seed=1, stages=lambda c: COMPUTE_ONLY)
    r = Agent(runner, load_recipes(), storage, "s", Settings(seed=1, only=("optimizer-impl", "threads", "compile")),
              {"conv": False, "checkpoint_blocks": False}).run()
    assert [s.accepted for s in r.steps[:-1]] == [False] * (len(r.steps) - 1), [(s.recipe, s.reason) for s in r.steps]
    last = r.steps[-1]
    assert last.recipe == STACK and last.accepted and len(last.trials) == 1, last.reason
    assert r.final_config["optimizer.impl"] != "default" and r.final_config["backend.num_threads"] == 1
    assert r.final_config["compile.mode"] != "none"
    assert any(rec.recipe == STACK and rec.accepted for rec in r.recommendations)
