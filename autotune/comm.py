"""How much of a DDP step is communication, measured without synchronising inside the step.

DDP all-reduces gradient buckets from autograd hooks while backward still runs, and waits
for the last bucket before `backward()` returns, so on the stage clock communication hides
inside `backward`. The profiler's collective events do not settle it either: the all-reduce
runs on the backend's threads while autograd goes on, so their durations say how long
collectives ran, not what the step lost to them (they stay in the evidence as `comm_share`).
What can be measured is what communication adds to the step. After the windows (the measured steps are
untouched), every rank runs forward+backward passes in pairs, one with DDP's reducer (bucket
copies, all-reduce, the wait for the slowest rank) and one under `no_sync()` (none of it),
in alternating order, and drops the gradients. The exposed fraction of backward is

    (median synced backward - median local backward) / median synced backward

and each measured step's backward is split by it into `backward` and `communication`.
Time spent waiting for a slower rank counts as communication: it is lost at the collective.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable


def reference(backward_s: Callable[[bool], float], pairs: int) -> dict[str, Any]:
    """`backward_s(sync)` times one pass; `pairs` pairs in alternating order (A B B A ...)."""
    synced: list[float] = []
    local: list[float] = []
    for i in range(max(1, pairs)):
        for sync in ((True, False) if i % 2 == 0 else (False, True)):
            (synced if sync else local).append(backward_s(sync))
    s, n = statistics.median(synced), statistics.median(local)
    return {"fraction": max(0.0, s - n) / s if s > 0 else 0.0, "synced_backward_s": s, "local_backward_s": n,
            "pairs": max(1, pairs)}


def split(steps: list[dict[str, float]], fraction: float) -> list[dict[str, float]]:
    """Steps with `fraction` of their backward moved to `communication` (they still sum to the step)."""
    out = []
    for step in steps:
        d = dict(step)
        d["communication"] = d.get("backward", 0.0) * fraction
        d["backward"] = d.get("backward", 0.0) - d["communication"]
        out.append(d)
    return out
