"""A numeric knob climbed as an engineer does (`staged`): a geometric ladder from the current
value (down when up does not help), stopped past the peak beyond the noise, then the values
between the best rung's neighbours, then the recipe's other knobs from the best found.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna

from .config import TrainConfig
from .context import key
from .decide import worth_a_duel
from .record import Summary, TrialState
from .search import RecipeSearch, best_of, normalized, reading, stored_summary


RIVALS = 2  # most rungs compared side by side with the best one before the other knobs are tried


@dataclass
class Rungs:
    """What the side-by-side comparison of the best rung with the rungs that read within
    the noise of it settled: the configs that lost (no longer candidates of the round)
    and the words that say so ("" when no comparison was measured)."""

    beaten: set[str] = field(default_factory=set)
    note: str = ""
    close: list[tuple[Any, float]] = field(default_factory=list)  # each loser's rung and its ratio to its rival


def ladder(values: list[int], start: float | None, down: bool = False) -> list[int]:
    """A geometric subset of a numeric range, moving away from `start`: each rung at least
    twice (or at most half) the one before, ending at the range's end (from 0: 1, 2, 3, 4,
    6, 8 -> 1, 2, 4, 8; down from 25: 10, 5, 2, 1 -> 10, 5, 2, 1)."""
    out: list[int] = []
    last = start
    for v in sorted(values, reverse=down):
        if last is None or last <= 0 or (v <= last / 2 if down else v >= 2 * last):
            out.append(v)
            last = v
    end = (min if down else max)(values, default=None)
    if end is not None and end not in out:
        out.append(end)
    return out


def staged(ctx: Any, name: str, space: dict[str, list[Any]], state: Any, est: float, n: int,
           deadline: float | None, on_trial: Callable,
           climb_with: tuple[str, Callable[[Summary], list[Any]]] | None = None,
           duel: Callable[[Any, Any], tuple | None] | None = None,
           bound: float | None = None) -> tuple[list[RecipeSearch], int, int, Rungs]:
    """Search a large space whose first knob is numeric in stages, none measuring the incumbent again:
    the ladder, the values between, each other knob alone from the best rung, the kept ones together
    and `_nearest`. Returns the searches, the trials run and skipped, and the `Rungs` duels settled.

    `climb_with`: a deciding knob and its values' order from a measured step; the ladder is climbed
    at each value until a climb reads within the noise of the incumbent; not at the other values
    where a climb's best rung, times `bound` (the lever's Amdahl gain), stays below the noise band.
    `duel` (`decide.duel`) settles which rung within the noise of the best the other knobs start from."""
    lead = next(iter(space))
    inc = state.config.get(lead)
    here = inc if isinstance(inc, (int, float)) and not isinstance(inc, bool) else None
    values = [v for v in ints(space[lead]) if v != inc]
    up = ladder([v for v in values if here is None or v > here], here)
    down = ladder([v for v in values if here is not None and v < here], here, down=True)
    searches: list[RecipeSearch] = []
    ran = skipped = 0

    def stage(suffix: str, sub: dict[str, list[Any]], start: TrainConfig, k: int, one_by_one: bool = False) -> None:
        """A study of `sub` from `start`; with an empty `sub`, `start` itself is measured."""
        nonlocal ran, skipped
        s = RecipeSearch(ctx.storage, f"{name}-{suffix}", sub, start, ctx.runner, ctx.constraints, ctx.seed,
                         pool=ctx.pool, incumbent_known=bool(sub), changes_from=state.config, earlier=ctx.earlier)
        searches.append(s)
        ctx.live.append(s)
        if one_by_one:
            before = best_of(searches[:-1])
            peak = max(est, before.value) if before is not None else est
            for i in range(min(k, s.grid)):
                ran += s.run(i + 1, deadline, on_trial=on_trial, cost_s=ctx.trial_cost())
                skipped += s.skipped
                last = s.finished()[-1] if s.finished() else None
                if last is None or s.skipped or last.user_attrs.get("state") == TrialState.INFEASIBLE.value:
                    break  # out of time, or past the range's end (out of memory, over the limit)
                if last.user_attrs.get("state") == TrialState.SLOW.value and i > 0:
                    break  # stopped far below the incumbent: past the peak
                first = reading(last) if i == 0 else None
                if first is not None and first * _reach(sub[lead], (last.user_attrs.get("config") or {}).get(lead)) \
                        < peak / ctx.band:
                    break  # a dip the next rung could not make up even in proportion to it
                if last.state != optuna.trial.TrialState.COMPLETE:
                    continue  # this rung failed (a crash), or the first dipped: the next may not
                if last.value < peak / ctx.band and i > 0:
                    break  # slower than the best rung beyond the noise: past the peak (the first
                    # rung may dip: one loader worker is often slower than loading in the step,
                    # but the next rung reads at most in proportion to it, twice with 2 workers
                    # of 1)
                peak = max(peak, last.value)
        else:
            ran += s.run(k, deadline, on_trial=on_trial, cost_s=ctx.trial_cost())
            skipped += s.skipped

    def left() -> int:
        return n - sum(len(s.finished()) for s in searches)

    def measured(config: TrainConfig, feasible: bool = False) -> optuna.trial.FrozenTrial | None:
        """A trial of `config` some stage of this round finished (`feasible`: the fastest
        feasible one), if any."""
        want = key(config.flat())
        same = [t for s in searches for t in (s.ranked() if feasible else s.finished())
                if key(t.user_attrs.get("config") or {}) == want]
        return max(same, key=lambda t: t.value or 0.0, default=None)

    def best(within_noise: bool = False) -> tuple[TrainConfig, float]:
        """The best config found and its reading: the incumbent unless a trial read above its
        estimate, or (`within_noise`, where to search on from) came within the noise band of it."""
        top = best_of(searches)
        if top is None or top.value < (est / ctx.band if within_noise else est):
            return state.config, est
        return TrainConfig().with_changes(top.user_attrs["config"]), top.value

    def settle(start: TrainConfig, top: float, rungs: Rungs) -> tuple[TrainConfig, float]:
        """The best rung against the rungs of its line (its other knobs as they are) that
        read within the noise of it, in turn, the faster staying on: the winner and its
        readings pooled (the trial's, and each side-by-side comparison's mean)."""
        champion = measured(start, feasible=True)
        if champion is None:
            return start, top
        line = (measured(normalized(start, {lead: v}), feasible=True) for v in values if v != start.get(lead))
        rivals = sorted((t for t in line if t is not None and t.value >= top / ctx.band), key=lambda t: -t.value)
        words = []
        for rival in rivals[:RIVALS]:
            out = duel(champion, rival)
            if out is None:
                continue
            winner, ratio, looks, note = out
            loser = rival if winner is champion else champion
            rungs.beaten.add(key(loser.user_attrs["config"]))
            rungs.close.append((loser.user_attrs["config"][lead], ratio))
            over = f" over {looks} looks" if looks > 1 else ""
            words.append(f"{lead}={loser.user_attrs['config'][lead]} read within the noise of "
                         f"{lead}={winner.user_attrs['config'][lead]} and measured {ratio:.2f}x of it side by "
                         f"side{over}{note}")
            champion = winner
        if not words:
            return start, top
        won = TrainConfig().with_changes(champion.user_attrs["config"])
        rungs.note += f"; the other knobs were tried from {lead}={won.get(lead)}: " + "; ".join(words)
        pooled = ([] if "reused_from" in champion.user_attrs else [champion.value]) + \
            ctx.readings.get(key(won.flat()), [])
        return won, statistics.fmean(pooled)

    with_key, order = climb_with if climb_with else (None, None)
    with_values = order(state.summary) if order is not None else [state.config.get(lead)]
    mine = state.config.get(with_key) if with_key else None
    if mine is not None and mine in with_values:  # a value a kept change set: climbed at first, not reverted
        with_values = [mine, *(v for v in with_values if v != mine)]
    held: tuple[Any] | None = None  # (the deciding knob's value whose climb held its own,)
    said = ""  # why the knob's other values were not climbed, if they were not
    for cv in with_values:  # the ladder, at each value of the deciding knob until one holds its own
        start = state.config if with_key is None else state.config.with_changes({with_key: cv})
        climb = None
        if up and left() > 0:
            stage(lead if with_key is None else f"{lead}-{cv}", {lead: up}, start, left(), one_by_one=True)
            climb = searches[-1]
        if best(within_noise=True)[0] is not state.config:
            held = (cv,)  # a rung read within the noise of the incumbent: the side-by-side comparison decides,
            break  # and the knob's other values are tried once from that rung, after the other knobs
        lost = _lost(climb, est, ctx.band, bound)
        if lost and cv != with_values[-1]:
            spared = ", ".join(f"{with_key}={v}" for v in with_values[with_values.index(cv) + 1:])
            said = (f"; {lead} was not climbed at {spared}: at {with_key}={cv} its best rung read {lost:.2f}x of the "
                    f"current config, and removing the whole waste it targets gains at most {bound:.2f}x")
            break
    if down and best()[0].get(lead) == inc and left() > 0:  # up did not help: the other way
        stage(f"{lead}-down", {lead: down}, state.config, left(), one_by_one=True)
    start, _ = best(within_noise=True)
    at = start.get(lead)
    rungs = sorted({*up, *down, *([here] if here is not None else [])})
    if at in rungs:
        i = rungs.index(at)
        lo, hi = rungs[max(i - 1, 0)], rungs[min(i + 1, len(rungs) - 1)]
        between = [v for v in values if lo < v < hi and v not in rungs]
        if between and left() > 0:
            stage(f"{lead}-between", {lead: between}, start, left())
    start, top = best(within_noise=True)
    rungs = Rungs(note=said)
    if duel is not None and start is not state.config and worth_a_duel(top, est, state.feasible):
        start, top = settle(start, top, rungs)
    # Not the deciding knob alone where its climb lost past what the waste could give: that knob
    # is in this round's space for the lever's sake, and alone it is another recipe's question.
    alone = [(k, v) for k, vs in space.items() if k != lead and not (said and k == with_key)
             for v in vs if v != start.get(k)]
    # The deciding knob's other values, where its climb held its own at the best rung's value,
    # come after the other knobs, what they make together and the nearest alternative, and only
    # where the knob's order no longer puts the held value first on the best rung's own step.
    later = {i for i, (k, _) in enumerate(alone) if held is not None and k == with_key and start.get(k) == held[0]}

    def each_alone(which: set[int]) -> None:
        for j, (k, v) in enumerate(alone):
            # Each other knob alone, from the best found; not again where a climb measured it (the
            # deciding knob's other value at a rung both climbs reached).
            if j in which and measured(normalized(start, {k: v})) is None and left() > 0:
                stage(f"rest-{j}", {k: [v]}, start, 1)

    def kept() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in alone:
            b = measured(normalized(start, {k: v}), feasible=True)
            if b is not None and b.value >= top / math.sqrt(ctx.band):  # lost less than half the noise band
                out[k] = v
        return out

    each_alone(set(range(len(alone))) - later)
    first = kept()
    joint = normalized(start, first)
    if len(first) > 1 and left() > 0 and measured(joint) is None:
        stage("rest-together", {}, joint, 1)
    # The trial no together config took, or one spare after it: the nearest alternative of the
    # best found. After a together config, a rung compared side by side with the best one whose
    # loss there is smaller than what the kept knobs gained together: how they act on each rung
    # decides, and the knobs may help at a neighbouring rung more than at the best one.
    together = measured(joint, feasible=True) if len(first) > 1 else None
    reach = max(ctx.margin, together.value / top) if together is not None else ctx.margin
    close = rungs.close
    if not close and together is not None:  # no rung compared side by side: their single readings, where
        # one lost less than half what the kept knobs gained together (in log terms)
        reach = max(ctx.margin, math.sqrt(together.value / top))
        close = [(v, t.value / top) for v in values if v != start.get(lead)
                 and (t := measured(normalized(start, {lead: v}), feasible=True)) is not None]
    close = sorted(close, key=lambda p: (abs(p[0] - start.get(lead)), -p[1]))  # the neighbouring rung first
    near = _nearest(start, joint, lead, close, reach,
                    [] if len(first) > 1 else
                    [(b.value, k, v) for k, v in alone if k not in first
                     and (b := measured(normalized(start, {k: v}), feasible=True)) is not None])
    if near is not None and left() > 0 and measured(near) is None and key(near.flat()) != key(state.config.flat()):
        stage("rest-nearest", {}, near, 1)
    rung = measured(start, feasible=True)
    summary = stored_summary(rung) if later and order is not None and rung is not None else None
    if summary is None or order(summary)[0] != held[0]:  # the held value no longer first where the round ended
        each_alone(later)
    every = kept()
    if len(every) > len(first) > 0 and left() > 0 and measured(normalized(start, every)) is None:
        stage("rest-together-all", {}, normalized(start, every), 1)
    return searches, ran, skipped, rungs


def _nearest(start: TrainConfig, found: TrainConfig, lead: str, close: list[tuple[Any, float]], margin: float,
             left_out: list[tuple[float, str, Any]]) -> TrainConfig | None:
    """The one config measured after the kept knobs for the side-by-side decision: `found` at the
    first rung of `close` (neighbouring rung first) that read within `margin` of the best one; else
    the best found with the left-out change whose single reading was highest; else None."""
    near = [v for v, r in close if r >= 1 / margin and v != start.get(lead)]
    if near:
        return normalized(found, {lead: near[0]})
    if left_out:
        _, k, v = max(left_out, key=lambda p: p[0])
        return normalized(found, {k: v})
    return None


def _lost(climb: RecipeSearch | None, est: float, band: float, bound: float | None) -> float | None:
    """The best rung's ratio to the incumbent (`est`) where even `bound` (the most removing
    the lever's waste could gain) would leave the climb's best reading below the noise
    band; else None. (A climb that stopped at its first rung did so because the next could
    not make up its dip.)"""
    read = [r for t in (climb.finished() if climb is not None else []) if (r := reading(t)) is not None]
    if bound is None or not math.isfinite(bound) or not read or max(read) * bound >= est / band:
        return None
    return max(read) / est


def _reach(rungs: list[Any], at: Any) -> float:
    """How many times `at` the rung after it on the ladder is: the most that rung can read
    over this one (parallel loading scales at most with the workers); unbounded where
    either is not a positive number."""
    i = rungs.index(at) if at in rungs else -1
    if i < 0 or i + 1 >= len(rungs) or not all(isinstance(v, (int, float)) and v > 0 for v in (at, rungs[i + 1])) \
            or rungs[i + 1] <= at:  # a ladder down (DDP's buckets): no such bound
        return math.inf
    return rungs[i + 1] / at


def ints(values: list[Any]) -> list[int]:
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
