"""False acceptances: the agent on a search where, by construction, nothing helps.

The workload is an MLP (the compute-bound example) and the only recipe is a placebo whose
knobs change nothing that runs:

- `layout.channels_last`: `Module.to(memory_format=...)` converts only 4-D and 5-D
  parameters and the loop converts only 4-D inputs; an MLP has neither, so the model, the
  inputs and every kernel are the same.
- `data.non_blocking` (CPU only): `tensor.to("cpu", non_blocking=True)` returns the very
  tensor it was given, as it does without the flag.

So every candidate is the baseline under another name, its true ratio is exactly 1, and
every change the agent accepts is a false acceptance: the search picks the candidate that
was luckiest in its noisy windows (the winner's curse) and only the interleaved acceptance
test stands between that luck and the user. The placebo targets every bottleneck class,
so it is searched whatever the diagnosis. Each accepted change is then re-measured
independently (interleaved, as many pairs as the protocol has windows); a gain that
re-measurement does not reproduce (its 95% interval does not clear 1) is counted.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch

from autotune.agent import Settings
from autotune.config import TrainConfig
from autotune.measure import Protocol
from autotune.recipes import Knob, Recipe
from autotune.record import Bottleneck, Step
from autotune.runner import Runner
from autotune.workload import facts

from benchmarks.cases import Case
from benchmarks.methods import remeasure, run_agent

WHY = ("every candidate runs exactly the baseline's code: channels_last converts only 4-D/5-D tensors and an MLP "
       "has none; non_blocking copies on CPU return the same tensor; so the true ratio of every candidate is 1.")


def placebo_recipe(device: torch.device) -> Recipe:
    knobs = [Knob("layout.channels_last", (True,))]
    if device.type == "cpu":
        knobs.append(Knob("data.non_blocking", (True,)))
    return Recipe(
        name="placebo", summary="knobs that change nothing this workload runs", targets=tuple(Bottleneck),
        cost=0, devices=("cpu", "cuda"), requires=(), knobs=tuple(knobs), trials=4,
        tradeoffs="none: channels_last has no 4-D tensor to convert in an MLP; non_blocking is a no-op for CPU tensors",
    )


def _before(step: Step) -> TrainConfig:
    """The config the step's candidate was compared against: its `after_config` with the
    changed keys put back."""
    return TrainConfig().with_changes({**step.after_config, **{k: v[0] for k, v in step.changes.items()}})


def _dump(model: Any) -> dict[str, Any] | None:
    return None if model is None else model.model_dump(mode="json")


def false_acceptances(case: Case, runs: int, device: torch.device, protocol: Protocol, log: Callable[[str], None],
                      seed0: int = 0) -> dict[str, Any]:
    """`runs` agent runs (sampler seeds seed0, seed0+1, ...) with only the placebo recipe."""
    t0 = time.perf_counter()
    wl = case.workload()
    runner = Runner(wl, None, device, protocol, isolate=False)
    recipe = placebo_recipe(device)
    wl_facts = facts(wl)
    out_runs = []
    for i in range(runs):
        seed = seed0 + i
        log(f"false acceptances: run {i + 1}/{runs} (seed {seed})")
        rep, wall_s = run_agent(runner, [recipe], wl_facts, Settings(trials=40, seed=seed, only=(recipe.name,)), log,
                                study=f"placebo-{seed}")
        checks = []
        for st in rep.steps:
            if not st.accepted:
                continue
            again = remeasure(runner, _before(st), TrainConfig().with_changes(st.after_config))
            reproduced = again.low is not None and again.low > 1.0
            checks.append({"changes": st.changes, "agent_speedup": _dump(st.speedup),
                           "remeasured": again.model_dump(mode="json", exclude={"a", "b"}), "reproduced": reproduced})
            log(f"  accepted {st.changes}: re-measured {again.ratio} -> {'reproduced' if reproduced else 'NOT reproduced'}")
        out_runs.append({
            "seed": seed, "wall_s": wall_s, "noise": _dump(rep.noise),
            "trials_used": rep.budget.trials_used if rep.budget else 0,
            "decisions": [{"recipe": st.recipe, "accepted": st.accepted, "changes": st.changes,
                           "speedup": _dump(st.speedup), "reason": st.reason} for st in rep.steps],
            "accepted": len(checks), "checks": checks,
        })
    accepted = sum(r["accepted"] for r in out_runs)
    not_reproduced = sum(1 for r in out_runs for c in r["checks"] if not c["reproduced"])
    return {
        "workload": case.target, "recipe": {"name": recipe.name, "knobs": [k.key for k in recipe.knobs]},
        "why_nothing_helps": WHY,
        "runs": out_runs, "accepted": accepted, "not_reproduced": not_reproduced,
        "target": "no accepted change that an independent re-measurement does not reproduce",
        "met": not_reproduced == 0, "wall_s": time.perf_counter() - t0,
    }
