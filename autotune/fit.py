"""The fastest config that fits a memory limit, searched as an engineer does by hand.

Over the limit, each memory-saving knob is measured alone first: what it saves and what
it costs. A numeric knob (the micro-batch size) saves more the smaller it gets and costs
speed as it does, so its values are tried from the largest down and the first that fits
ends them; precisions save alike (16 bits a value), so the one this machine runs fastest
stands for them all. Then the combinations of what was measured are predicted, each
knob's peak and speed taken as a factor of the incumbent's (a product model: rough, but
it ranks), and tried fastest predicted first among those predicted to fit, until the next
one is predicted slower than the fastest fit measured: the model's ranking decides, and a
near tie is settled side by side (the two fastest fits are dueled). Not within the noise
band or the margin: on a noisy machine (a band of 1.5, a cross-process A/A of 1.2) either
let it try 10-11 of the memory grid's 20 configs to take the fit it had predicted first.

On the benchmark's memory case (20 configs) the first fit the old walk took was the slowest
micro-batch; the fastest fit (bf16 with half the batch) lies in no single knob's range.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable

from . import probe
from .context import Context, State
from .record import TrialState
from .search import RecipeSearch, best_of, normalized, stored_summary


def singles(space: dict[str, list[Any]], state: State, lowp: dict[str, float]) -> dict[str, list[Any]]:
    """Each knob's values to try alone, in order (the incumbent's own value left out)."""
    out = {}
    for k, values in space.items():
        vals = [v for v in values if v != state.config.get(k)]
        ints = [v for v in vals if isinstance(v, int) and not isinstance(v, bool)]
        if ints and len(ints) == len(vals):
            vals = sorted(ints, reverse=True)
        elif k == probe.KEY and len(vals) > 1:  # one precision speaks for the memory of all
            vals = [max(vals, key=lambda v: (lowp.get(v, 0.0), -vals.index(v)))]
        out[k] = vals
    return out


def predict(factors: dict[tuple[str, Any], tuple[float, float]], combo: dict[str, Any]) -> tuple[float, float]:
    """(peak, speed) of `combo` as factors of the incumbent's: the product of each knob's alone."""
    peak = math.prod(factors[(k, v)][0] for k, v in combo.items())
    speed = math.prod(factors[(k, v)][1] for k, v in combo.items())
    return peak, speed


def search(ctx: Context, name: str, space: dict[str, list[Any]], state: State, n: int, deadline: float | None,
           on_trial: Callable) -> tuple[list[RecipeSearch], int, int]:
    """Measure each knob alone, then the predicted-fastest fitting combinations; returns the
    searches (one config each), how many trials ran, how many were skipped for time."""
    base_peak, base_speed = state.summary.peak_memory_bytes, state.summary.samples_per_s
    limit = ctx.constraints.memory_limit
    searches: list[RecipeSearch] = []
    ran = skipped = 0
    factors: dict[tuple[str, Any], tuple[float, float]] = {}

    def left() -> int:
        return n - sum(len(s.finished()) for s in searches)

    def measure(suffix: str, changes: dict[str, Any]):
        nonlocal ran, skipped
        s = RecipeSearch(ctx.storage, f"{name}-{suffix}", {}, normalized(state.config, changes), ctx.runner,
                         ctx.constraints, ctx.seed, pool=ctx.pool, changes_from=state.config)
        searches.append(s)
        ctx.live.append(s)
        ran += s.run(1, deadline, on_trial=on_trial, cost_s=ctx.trial_cost())
        skipped += s.skipped
        done = s.finished()
        return done[-1] if done else None

    for k, values in singles(space, state, ctx.lowp).items():
        for v in values:
            if left() <= 0 or skipped:
                break
            t = measure(f"alone-{len(searches)}", {k: v})
            summary = stored_summary(t) if t is not None else None
            if summary is None or not summary.peak_memory_bytes or not summary.samples_per_s:
                continue  # failed or out of memory: nothing to predict from
            factors[(k, v)] = (summary.peak_memory_bytes / base_peak, summary.samples_per_s / base_speed)
            if t.user_attrs.get("state") == TrialState.OK.value and isinstance(v, int) and not isinstance(v, bool):
                break  # the largest that fits: smaller ones only cost more steps
    tried = {k: [v for (kk, v) in factors if kk == k] for k in space}
    combos = []
    for pick in itertools.product(*([None, *vs] for vs in tried.values())):
        combo = {k: v for k, v in zip(tried, pick) if v is not None}
        if len(combo) >= 2:
            combos.append((combo, *predict(factors, combo)))
    fitting = sorted((c for c in combos if c[1] * base_peak <= limit), key=lambda c: -c[2])
    if not fitting and combos:  # nothing predicted to fit: the one predicted smallest
        fitting = [min(combos, key=lambda c: c[1])]
    for i, (combo, _, speed) in enumerate(fitting):
        best = best_of(searches)
        if left() <= 0 or skipped or (best is not None and speed * base_speed < best.value):
            break
        measure(f"joint-{i}", combo)
    return searches, ran, skipped


def applies(space: dict[str, list[Any]], state: State, limit: int | None) -> bool:
    """A multi-knob search for a fit: the incumbent is over the limit, with its peak and speed measured."""
    return bool(limit and len(space) > 1 and not state.feasible and state.summary.peak_memory_bytes
                and state.summary.samples_per_s)
