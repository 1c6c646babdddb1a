"""The fastest config that fits a memory limit: each memory-saving knob measured alone, then
combinations ranked by a product model of those readings (corrected by each measured one) and
measured fastest-predicted first, until the next is predicted slower than the best fit.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Callable

from . import probe
from .context import Context, State, key
from .ladder import ints
from .record import TrialState
from .search import RecipeSearch, best_of, normalized, stored_summary

# What a size knob's null means, in its own unit, given the batch (the whole batch in one pass).
WHOLE = {"memory.micro_batch_size": lambda batch: batch}

Factors = dict[tuple[str, Any], tuple[float, float]]


def _is_size(values: list[Any]) -> bool:
    return bool(values) and len(ints(values)) == len(values)


def singles(space: dict[str, list[Any]], state: State, lowp: dict[str, float]) -> dict[str, list[Any]]:
    """Each knob's values to try alone, in order (the incumbent's own value left out)."""
    out = {}
    for k, values in space.items():
        vals = [v for v in values if v != state.config.get(k)]
        if _is_size(vals):
            vals = sorted(vals, reverse=True)
        elif k == probe.KEY and len(vals) > 1:  # one precision speaks for the memory of all
            vals = [max(vals, key=lambda v: (lowp.get(v, 0.0), -vals.index(v)))]
        out[k] = vals
    return out


def sizes(k: str, values: list[Any], measured: Any, factor: tuple[float, float], whole: int | None) -> Factors:
    """Predicted (peak, speed) factors of a size knob's values below `measured`, from the
    reading there and the incumbent's (factors 1, 1) at `whole`: peak linear in the size,
    a sample's time `c + d / size`; never predicted faster or larger than the reading."""
    if not whole or whole <= measured:
        return {}
    peak0, speed0 = factor
    slope = (1.0 - peak0) / (whole - measured)  # peak factor per unit of size
    d = max(0.0, (1.0 / speed0 - 1.0) / (1.0 / measured - 1.0 / whole))  # per-micro-step time, in sample times
    c = 1.0 - d / whole
    out = {}
    for v in values:
        if v < measured:
            speed = 1.0 / (c + d / v) if c + d / v > 0 else 0.0
            out[(k, v)] = (min(peak0, max(0.0, peak0 + slope * (v - measured))), min(speed0, speed))
    return out


def predict(factors: Factors, combo: dict[str, Any]) -> tuple[float, float]:
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
    batch = ctx.runner.workload.rank_batch
    searches: list[RecipeSearch] = []
    ran = skipped = 0
    factors: Factors = {}
    measured: set[str] = set()

    def left() -> int:
        return n - sum(len(s.finished()) for s in searches)

    def measure(suffix: str, changes: dict[str, Any]):
        nonlocal ran, skipped
        measured.add(key(changes))
        s = RecipeSearch(ctx.storage, f"{name}-{suffix}", {}, normalized(state.config, changes), ctx.runner,
                         ctx.constraints, ctx.seed, pool=ctx.pool, changes_from=state.config, earlier=ctx.earlier)
        searches.append(s)
        ctx.live.append(s)
        ran += s.run(1, deadline, on_trial=on_trial, cost_s=ctx.trial_cost())
        skipped += s.skipped
        done = s.finished()
        return done[-1] if done else None

    predicted: Factors = {}
    for k, values in singles(space, state, ctx.lowp).items():
        for v in values:
            if left() <= 0 or skipped:
                break
            t = measure(f"alone-{len(searches)}", {k: v})
            summary = stored_summary(t) if t is not None else None
            if summary is None or not summary.peak_memory_bytes or not summary.samples_per_s:
                continue  # failed or out of memory: nothing to predict from; a size knob tries its next
            factors[(k, v)] = (summary.peak_memory_bytes / base_peak, summary.samples_per_s / base_speed)
            if _is_size(values):  # the rest of its values from this reading
                whole = state.config.get(k) or (WHOLE[k](batch) if k in WHOLE else None)
                more = sizes(k, values, v, factors[(k, v)], whole) if whole else {}
                predicted |= more
                if more or t.user_attrs.get("state") == TrialState.OK.value:
                    break  # predicted, or the largest fits: smaller ones only cost more steps
    known = {**predicted, **factors}
    sized = {k for k, values in space.items() if _is_size([v for v in values if v is not None])}
    tried = {k: [v for (kk, v) in known if kk == k] for k in space}
    combos = {}
    for pick in itertools.product(*([None, *vs] for vs in tried.values())):
        combo = {k: v for k, v in zip(tried, pick) if v is not None}
        if combo and key(combo) not in measured:
            combos[key(combo)] = combo
    adjust: dict[frozenset, tuple[float, float]] = {}  # measured over predicted, per set of knobs combined

    def forecast(combo: dict[str, Any]) -> tuple[float, float]:
        """The product model, times what each measured set of these knobs read against it."""
        peak, speed = predict(known, combo)
        for knobs, (by_peak, by_speed) in adjust.items():
            if knobs <= combo.keys():
                peak, speed = peak * by_peak, speed * by_speed
        return peak, speed

    past = False  # the one combination measured past the stop rule, predicted within the noise of the best fit
    while combos and left() > 0 and not skipped:
        scored = [(c, *forecast(c)) for c in combos.values()]
        fitting = [x for x in scored if x[1] * base_peak <= limit]
        best = best_of(searches)
        if fitting:
            combo, _, speed = max(fitting, key=lambda x: x[2])
            if best is not None and speed * base_speed < best.value:
                if past or speed * base_speed < best.value / ctx.band ** len(combo):
                    break  # the fastest fit measured beats every prediction left, by more than its readings stray
                past = True  # a product of two single readings, each off by the noise: one more look
        elif best is None:  # nothing predicted to fit, nothing fits yet: the one predicted smallest
            combo = min(scored, key=lambda x: x[1])[0]
        else:
            break
        del combos[key(combo)]
        t = measure(f"joint-{len(searches)}", combo)
        summary = stored_summary(t) if t is not None else None
        peak0, speed0 = forecast(combo)
        if summary and summary.peak_memory_bytes and summary.samples_per_s and peak0 > 0 and speed0 > 0 \
                and len(combo) > 1:  # how these knobs interact (bf16 with a micro-batch), at their other values too
            was = adjust.get(frozenset(combo), (1.0, 1.0))  # the forecast held it: the new reading corrects on top
            adjust[frozenset(combo)] = (was[0] * summary.peak_memory_bytes / base_peak / peak0,
                                        was[1] * summary.samples_per_s / base_speed / speed0)
        if t is not None and t.user_attrs.get("state") == TrialState.OK.value:
            for k in [k for k, c in combos.items() if _dominated(c, combo, sized, known)]:
                del combos[k]  # it fits: a smaller micro-batch, or a knob that alone cost speed, only costs more
    return searches, ran, skipped


def _dominated(combo: dict[str, Any], fit: dict[str, Any], sized: set[str], known: Factors) -> bool:
    """Whether `combo` is `fit` (which fits) with smaller size-knob values, plus knobs that each read
    slower alone, or minus knobs that each read faster alone: it could only save memory no longer
    needed. A size knob `combo` leaves out (the whole batch) never makes it dominated."""
    if combo == fit:
        return False
    faster = all(k not in sized and known.get((k, fit[k]), (1.0, 0.0))[1] > 1.0 for k in fit.keys() - combo.keys())
    same = all(combo[k] <= fit[k] if k in sized else combo[k] == fit[k] for k in fit.keys() & combo.keys())
    return faster and same and all(known.get((k, combo[k]), (1.0, 1.0))[1] < 1.0 for k in combo.keys() - fit.keys())


def applies(space: dict[str, list[Any]], state: State, limit: int | None) -> bool:
    """A multi-knob search for a fit: the incumbent is over the limit, with its peak and speed measured."""
    return bool(limit and len(space) > 1 and not state.feasible and state.summary.peak_memory_bytes
                and state.summary.samples_per_s)
