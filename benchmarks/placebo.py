"""False acceptances: the agent on searches where, by construction, nothing helps.

Three workloads, one per shape (input-bound, compute-bound, memory-bound; `WORKLOADS`), each
an MLP, and one recipe, a placebo whose two knobs change nothing that runs:

- `layout.channels_last`: `Module.to(memory_format=...)` converts only 4-D and 5-D
  parameters and the loop converts only 4-D inputs; an MLP has neither, so the model, the
  inputs and every kernel are the same.
- `data.non_blocking` (CPU): `tensor.to("cpu", non_blocking=True)` returns the very tensor it
  was given; `backend.cudnn_benchmark` (CUDA): cuDNN's autotuner picks convolution kernels,
  and an MLP has no convolution.

So every candidate is the baseline under another name, its true ratio is 1, and every change
the agent accepts is a false acceptance: the search picks the candidate that was luckiest in
its noisy windows (the winner's curse) and only the acceptance rule stands between that luck
and the user. Every acceptance is counted, as a rate of the decisions with a Wilson interval.

What the rule keeps of a true gain cannot be planted in a real workload's code, so power is
measured on `FakeRunner` with this machine's noise model (`MODEL`: heavy-tailed windows,
sessions, drift, carry-over, a candidate noisier than the baseline), the same recipe and the
same agent, with channels_last made `gain` times faster (`simulate`).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import optuna
import torch

from autotune.agent import Agent, Settings
from autotune.config import TrainConfig
from autotune.measure import Protocol
from autotune.recipes import Knob, Recipe
from autotune.record import Bottleneck, Report
from autotune.runner import Runner
from autotune.search import quiet_optuna
from autotune.testing import DEFAULT_STAGES, FakeRunner
from autotune.workload import facts

from benchmarks.cases import Case
from benchmarks.methods import run_agent

Log = Callable[[str], None]
ALPHA = 0.05  # the false-acceptance rate the target allows
GAINS = (1.05, 1.10, 1.20)  # true gains the power is reported at

WHY = ("every candidate runs exactly the baseline's code: channels_last converts only 4-D/5-D tensors and an MLP "
       "has none; non_blocking copies on CPU return the same tensor (cudnn_benchmark on CUDA tunes convolutions, and "
       "an MLP has none); so the true ratio of every candidate is 1.")

# One MLP per shape, sized so that a placebo run takes seconds to a minute on two cores.
WORKLOADS = {
    "input": Case("input_bound", "input", fn="workload", kwargs={"n": 1024, "batch_size": 8}),
    "compute": Case("compute_bound", "compute", fn="workload", kwargs={"width": 1024, "batch_size": 16}),
    "memory": Case("memory_bound", "memory", fn="workload", kwargs={"width": 128, "depth": 8, "batch_size": 256}),
}
QUICK_WORKLOADS = {
    "input": Case("input_bound", "input", fn="workload", kwargs={"n": 256, "batch_size": 8}, quick=True),
    "compute": Case("compute_bound", "compute", fn="workload", kwargs={"width": 128, "batch_size": 32}, quick=True),
    "memory": Case("memory_bound", "memory", fn="workload", kwargs={"width": 64, "depth": 4, "batch_size": 256},
                   quick=True),
}

# The noise model of `simulate`: 5% window noise with bursts (FakeRunner's fitted heavy tails),
# 4% session offsets, drift, 5% of a window carried over from the previous config, and a
# candidate whose windows vary 1.25x as much as the baseline's (the A/A understates it).
MODEL = {"noise": 0.05, "tails": "burst", "session": 0.04, "drift": 0.002, "carry": 0.05, "noisier": 1.25}
SHAPES = {
    "input": {"stages": {"data": 0.6, "forward": 0.15, "backward": 0.15, "optimizer": 0.1}, "memory": 10**6},
    "compute": {"stages": DEFAULT_STAGES, "memory": 10**6},
    "memory": {"stages": {"data": 0.0, "forward": 0.4, "backward": 0.5, "optimizer": 0.1}, "memory": 14 * 2**20},
}


def placebo_recipe(device: torch.device) -> Recipe:
    """Two knobs that change nothing an MLP runs on `device`."""
    second = Knob("data.non_blocking", (True,)) if device.type == "cpu" else Knob("backend.cudnn_benchmark", (True,))
    return Recipe(
        name="placebo", summary="knobs that change nothing this workload runs", targets=tuple(Bottleneck),
        cost=0, devices=("cpu", "cuda"), requires=(), knobs=(Knob("layout.channels_last", (True,)), second), trials=4,
        tradeoffs="none: channels_last has no 4-D tensor to convert in an MLP; non_blocking is a no-op for CPU "
                  "tensors; cudnn_benchmark tunes convolutions only",
    )


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float | None, float | None]:
    """The Wilson score interval (95% by default) of a rate of `k` in `n`."""
    if n == 0:
        return None, None
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson(k, n)
    return {"count": k, "of": n, "rate": k / n if n else None, "interval": [lo, hi]}


def _decisions(rep: Report) -> list[dict[str, Any]]:
    """The rounds that compared a candidate with the incumbent, each with its verdict."""
    return [{"recipe": st.recipe, "accepted": st.accepted, "changes": st.changes, "reason": st.reason,
             "speedup": None if st.speedup is None else st.speedup.model_dump(mode="json")}
            for st in rep.steps if st.speedup is not None or st.accepted]


def false_acceptances(workloads: dict[str, Case], runs: int, device: torch.device, protocol: Protocol, log: Log,
                      seed0: int = 0, model_runs: int = 100) -> dict[str, Any]:
    """`runs` agent runs with only the placebo recipe, in turn over `workloads` (sampler seeds
    seed0, seed0+1, ...); every acceptance counted. Power from `model_runs` runs per gain of `simulate`."""
    t0 = time.perf_counter()
    recipe = placebo_recipe(device)
    names = list(workloads)
    built = {n: workloads[n].workload() for n in names}
    runners = {n: Runner(built[n], None, device, protocol, isolate=False) for n in names}
    out_runs = []
    for i in range(runs):
        seed, shape = seed0 + i, names[i % len(names)]
        log(f"false acceptances: run {i + 1}/{runs} ({shape}, seed {seed})")
        settings = Settings(trials=40, seed=seed, only=(recipe.name,))
        rep, wall_s = run_agent(runners[shape], [recipe], facts(built[shape]), settings, log,
                                study=f"placebo-{shape}-{seed}")
        decisions = _decisions(rep)
        out_runs.append({"workload": shape, "seed": seed, "wall_s": wall_s,
                         "noise": None if rep.noise is None else rep.noise.model_dump(mode="json"),
                         "trials_used": rep.budget.trials_used if rep.budget else 0, "decisions": decisions,
                         "decided": len(decisions), "accepted": sum(d["accepted"] for d in decisions)})
    accepted, decided = sum(r["accepted"] for r in out_runs), sum(r["decided"] for r in out_runs)
    found = rate(accepted, decided)
    log(f"false acceptances: simulating power on FakeRunner ({model_runs} runs per gain)")
    return {
        "workloads": {n: workloads[n].target for n in names},
        "recipe": {"name": recipe.name, "knobs": [k.key for k in recipe.knobs]}, "why_nothing_helps": WHY,
        "runs": out_runs, "accepted": accepted, "decided": decided, "rate": found["rate"],
        "interval": found["interval"],
        "target": f"false acceptances <= {ALPHA:.0%} of the placebo decisions", "met": accepted <= ALPHA * decided,
        "model": power(model_runs, seed0),
        "wall_s": time.perf_counter() - t0,
    }


def simulate(runs: int, gain: float = 1.0, seed0: int = 0, model: dict[str, Any] | None = None,
             shapes: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """`runs` agent runs on `FakeRunner` under `model` (default `MODEL`), in turn over `shapes`,
    with the placebo recipe and channels_last `gain` times faster: how often the gain was
    kept and how often a change without it (a false acceptance) was."""
    model = {**MODEL, **(model or {})}
    shapes = shapes or SHAPES
    names = list(shapes)
    recipe = placebo_recipe(torch.device("cpu"))
    noisier, base = model.pop("noisier"), model.pop("noise")
    kept = false = decided = 0
    for i in range(runs):
        seed, shape = seed0 + i, shapes[names[i % len(names)]]
        runner = FakeRunner(lambda c: 100.0 * (gain if c.layout.channels_last else 1.0),
                            noise=lambda c: base * (1.0 if c == TrainConfig() else noisier), seed=seed,
                            stages=lambda c, s=shape["stages"]: s, memory=lambda c, m=shape["memory"]: m, **model)
        with quiet_optuna():
            rep = Agent(runner, [recipe], optuna.storages.InMemoryStorage(), "placebo",
                        Settings(seed=seed, only=(recipe.name,)), {"conv": False, "checkpoint_blocks": False}).run()
        for d in _decisions(rep):
            decided += 1
            if d["accepted"]:
                real = gain != 1.0 and d["changes"].get("layout.channels_last", [None, None])[1] is True
                kept, false = kept + real, false + (not real)
    return {"gain": gain, "runs": runs, "decided": decided, "kept": rate(kept, runs), "false": rate(false, decided)}


def power(runs: int, seed0: int = 0) -> dict[str, Any]:
    """`simulate` at no gain (false acceptances) and at each of `GAINS` (power)."""
    return {"parameters": dict(MODEL), "shapes": list(SHAPES), "placebo": simulate(runs, 1.0, seed0),
            "power": {f"{g:.2f}": simulate(runs, g, seed0) for g in GAINS}}
