"""One recipe's round (`play`): search its knobs from the incumbent, grow a range whose best
trial sits at its top while the waste it targets remains, then compare the candidates the search
cannot tell from the incumbent side by side and keep at most one (`decide`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import optuna

from . import fit, machine, probe
from .config import TrainConfig
from .context import Context, State, changes_text, digest, key
from .decide import decide, duel, recheck
from .diagnose import COMPUTE_STAGES, clear_gain, diagnose, material
from .errors import ConfigError
from .ladder import Rungs, ints, staged
from .recipes import Recipe
from .record import Bottleneck, Brief, Step, Summary
from .search import (GRID_LIMIT, SLOW_CUT, RecipeSearch, best_of, normalized, reading, remember, stored_summary,
                     trial_record)

REVISIT_TRIALS = 3  # fewest trials of a recipe's second round
GROW_STEPS = 3  # most times a range grows in one round
MOVED = 0.05  # a waste share this far below the incumbent's: the range's knob acts on it
# Trials of a round whose prior gain is under twice the margin's gain: a gain that small
# the comparisons could barely confirm.
SHORT_LOOK = 2


@dataclass
class Outcome:
    step: Step
    state: State
    ran: int
    skipped: int


def play(ctx: Context, round_no: int, recipe: Recipe, target: Bottleneck, expected: float, state: State,
         trials_left: int, deadline: float | None, revisit: bool = False,
         near: dict[str, Any] | None = None) -> Outcome:
    """Search `recipe` from `state`, compare its candidates, accept at most one. A revisit gets half
    the recipe's trials (at least `REVISIT_TRIALS`), or one trial of its near-miss (`near`); a recipe
    whose prior gain is under `clear_gain` gets `SHORT_LOOK` trials unless one reads past the band."""
    runner = ctx.runner
    # The incumbent is part of the round's identity: a resumed run that reaches this round
    # from another config searches a study of its own (Optuna's spaces cannot change).
    name = f"{ctx.study}/{round_no:02d}-{recipe.name}-{digest(state.config.flat())}"
    space = _within_host(recipe, recipe.space(runner.device.type, machine.cores(), runner.workload.rank_batch),
                         state)  # one rank's batch
    if target is not Bottleneck.MEMORY and probe.KEY in space:  # for speed: the precisions this machine has units for
        units = probe.fast(ctx.lowp)
        space[probe.KEY] = [v for v in space[probe.KEY] if v in units or v == state.config.get(probe.KEY)] or \
            space[probe.KEY]
    est = ctx.estimate(state.config) if state.feasible else None  # the run's pooled readings of the incumbent
    # A trial far slower than a config that fits is stopped after its first window (under a
    # limit the incumbent does not fit, and a slow config that fits may be the answer).
    ctx = dataclasses.replace(ctx, constraints=dataclasses.replace(ctx.constraints, floor=est / SLOW_CUT if est else None))
    n = min(max(REVISIT_TRIALS, recipe.trials // 2) if revisit else recipe.trials, trials_left)
    # At best a gain the comparisons can barely confirm: a short look, unless it reads a clear gain.
    look = min(n, SHORT_LOOK) if expected < clear_gain(ctx.margin) else n
    on_trial = lambda t: ctx.events.trial(trial_record(t))  # noqa: E731
    lead = next(iter(space), None)
    probed, rechecked, rungs, said = None, {}, Rungs(), ""
    again = _again(state, near, space, n) if revisit and near and est is not None else None
    if again is not None:
        ctx.events.recipe(round_no, recipe.name, 1)
        searches, ran, skipped = _one(ctx, name, again, state, deadline, on_trial)
        said = (f"; a revisit after a later change was kept: its near-miss "
                f"({', '.join(f'{k}={v}' for k, v in near.items())}) measured again from the current config, "
                f"not its whole space")
    elif est is not None and not recipe.each_knob_first and len(space) > 1 and len(ints(space[lead])) > 2 and \
            math.prod(len(v) for v in space.values()) > GRID_LIMIT:
        ctx.events.recipe(round_no, recipe.name, look)
        climb = next(((k.key, functools.partial(_climb_order, k.key, [v for v in k.choices if v in space[k.key]]))
                      for k in recipe.knobs if k.climb_with and k.key in space and not isinstance(k.choices, str)),
                     None)
        rivals = lambda one, other: duel(ctx, name, recipe, one, other, deadline)  # noqa: E731
        searches, ran, skipped, rungs = staged(ctx, name, space, state, est, look, deadline, on_trial, climb, rivals,
                                               expected)
    elif recipe.together:  # one config: the incumbent with every knob's value
        ctx.events.recipe(round_no, recipe.name, 1)
        searches, ran, skipped = _one(ctx, name, normalized(state.config, {k: v[0] for k, v in space.items()}),
                                      state, deadline, on_trial)
    elif target is Bottleneck.MEMORY and fit.applies(space, state, ctx.constraints.memory_limit):
        ctx.events.recipe(round_no, recipe.name, n)
        searches, ran, skipped = fit.search(ctx, name, space, state, n, deadline, on_trial)
    else:
        search = RecipeSearch(ctx.storage, name, space, state.config, runner, ctx.constraints, ctx.seed,
                              each_knob_first=recipe.each_knob_first, pool=ctx.pool,
                              incumbent_known=est is not None or not state.feasible,  # over the limit: known not to fit
                              earlier=ctx.earlier)
        ctx.events.recipe(round_no, recipe.name, min(n, search.grid))
        searches, ran = [search], 0
        ctx.live.append(search)
        if recipe.fallbacks and search.walked and est is not None:  # the first config that runs is the round's
            while len(search.finished()) < min(n, search.grid) and not search.ranked() and not search.skipped:
                ran += search.run(len(search.finished()) + 1, deadline, on_trial=on_trial, cost_s=ctx.trial_cost())
            if target is not Bottleneck.MEMORY:  # the round's one candidate: not dropped on one reading
                probed, rechecked = _probe(ctx, name, recipe, state, search.ranked()[:1], est, deadline)
        else:
            if est is not None and search.walked and target is not Bottleneck.MEMORY and n > 1 and ctx.pool is None:
                # The recipe's most promising config first: when it is slower than the incumbent
                # beyond the noise, the rest of its space (the same lever, less likely) is not
                # tried. (With parallel workers the space is measured at once instead.)
                ran = search.run(1, deadline, on_trial=on_trial, cost_s=ctx.trial_cost())
                probed, rechecked = _probe(ctx, name, recipe, state, search.finished()[:1], est, deadline)
            if probed is None:
                ran += search.run(look, deadline, on_trial=on_trial, cost_s=ctx.trial_cost())
                top = search.ranked()
                if look < n and est is not None and top and top[0].value > est * ctx.band:  # the prior was wrong
                    ran += search.run(n, deadline, on_trial=on_trial, cost_s=ctx.trial_cost())
        skipped = search.skipped
    used = sum(len(s.finished()) for s in searches)
    grown = _grow(ctx, name, recipe, target, state, est, searches, trials_left - used, deadline)
    ran += sum(s_ran for s_ran, _ in grown)
    trials = []
    for s in searches:  # each stage's trials read once; a later round that tries one of these configs takes its reading
        done = s.finished()
        remember(ctx.earlier, s.study.study_name, done)
        trials += done
    for t in trials:
        if "reused_from" in t.user_attrs:
            continue  # the same measurement again: one reading
        summary = stored_summary(t)
        ctx.note(t.user_attrs.get("config") or {}, t.value if t.state == optuna.trial.TrialState.COMPLETE else None,
                 summary.wall_s if summary else None)
    step = Step(round=round_no, recipe=recipe.name, bottleneck=target,
                expected_gain=None if math.isinf(expected) else expected,
                trials=[trial_record(t) for t in trials], before=Brief.of(state.summary),
                grown=[note for _, note in grown if note])
    ranked, seen = [], set()
    for t in sorted((t for s in searches for t in s.ranked()), key=lambda t: (-t.value, t.number)):
        k = key(t.user_attrs.get("config") or {})
        if k not in seen:  # one candidate per config
            seen.add(k)
            ranked.append(t)
    if probed is not None:  # ruled out by its look; the band may have widened with that look's readings
        ranked = [t for t in ranked if key(t.user_attrs.get("config") or {}) != key(probed[0].user_attrs["config"])]
    ranked = [t for t in ranked if key(t.user_attrs.get("config") or {}) not in rungs.beaten]  # lost side by side
    state = decide(ctx, name, recipe, step, state, ranked, deadline, rechecked, rungs.note + said)
    if probed is not None and not step.accepted:
        trial, look = probed
        side = (f" and {look.ratio:.2f}x [{look.low:.2f}, {look.high:.2f}] of it side by side" if look is not None and
                look.measured else "")
        step.reason = (f"its most promising config ({changes_text(trial)}) measured {reading(trial) / est:.2f}x the "
                       f"current config's pooled estimate, below the noise band (1/{ctx.band:.2f}){side}: the rest of "
                       f"its space was not searched")
    if step.after_config is None and step.trials:  # no candidate was offered, so none was announced: say how
        # the round ended (a round that measured nothing is listed as not tried at the end)
        ctx.events.decision(recipe.name, False, step.reason or "")
    return Outcome(step, state, ran, skipped)


def _again(state: State, near: dict[str, Any], space: dict[str, list], n: int) -> TrainConfig | None:
    """The near-miss's changes from the current config; None where nothing of it is left to
    try, it no longer fits the config, or the revisit's trials cover the space anyway."""
    if math.prod(len(v) for v in space.values()) <= n:
        return None
    try:
        again = normalized(state.config, near)
    except ConfigError:
        return None
    return None if key(again.flat()) == key(state.config.flat()) else again


def _one(ctx: Context, name: str, config: TrainConfig, state: State, deadline: float | None,
         on_trial: Any) -> tuple[list[RecipeSearch], int, int]:
    """One config measured as the round's only trial (its changes counted from `state`'s)."""
    search = RecipeSearch(ctx.storage, name, {}, config, ctx.runner, ctx.constraints, ctx.seed, pool=ctx.pool,
                          changes_from=state.config, earlier=ctx.earlier)
    ctx.live.append(search)
    ran = search.run(1, deadline, on_trial=on_trial, cost_s=ctx.trial_cost())
    return [search], ran, search.skipped


def _probe(ctx: Context, name: str, recipe: Recipe, state: State, first: list, est: float,
           deadline: float | None) -> tuple[tuple | None, dict]:
    """`_recheck` the round's first trial (in `first`) where its one reading fell below the noise
    band of the incumbent's estimate `est`; else (None, {})."""
    if first and reading(first[0]) is not None and reading(first[0]) < est / ctx.band:
        return _recheck(ctx, name, recipe, state, first[0], deadline)
    return None, {}


def _recheck(ctx: Context, name: str, recipe: Recipe, state: State, trial: optuna.trial.FrozenTrial,
             deadline: float | None) -> tuple[tuple | None, dict]:
    """Look side by side at a most promising config whose one reading fell below the noise band:
    (trial, look) to stop the round, unless the look reads it faster than the incumbent; then
    (None, {its key: the look}), the look being its first comparison (`seen`)."""
    cand = TrainConfig().with_changes(trial.user_attrs["config"])
    look = recheck(ctx, name, recipe, state, cand, deadline)
    if look is None or not look.measured or not look.ratio > 1.0:
        return (trial, look), {}
    return None, {key(cand.flat()): look}


def _climb_order(key: str, values: list, summary: Summary) -> list:
    """The deciding knob's values in climbing order from a measured step: for intra-op threads, one
    thread first (a core left to loader workers) only where compute share x cores < 1, else the default first."""
    if key != "backend.num_threads" or 1 not in values:
        return values
    compute = sum(summary.stages[s].share for s in COMPUTE_STAGES if s in summary.stages)
    one_first = compute * machine.cores() < 1
    return sorted(values, key=lambda v: (v == 1) != one_first)


def _within_host(recipe: Recipe, space: dict[str, list], state: State) -> dict[str, list]:
    """A growable knob's values up to what this host can run (`machine.growth_limit`, from
    the incumbent's measurement): no ladder climbs to 8 CPU-bound decoding workers on 2 cores."""
    out = dict(space)
    for k in recipe.knobs:
        if k.grow and k.key in out:
            limit = machine.growth_limit(k.key, state.summary)
            kept = [v for v in out[k.key] if not isinstance(v, int) or isinstance(v, bool) or v <= limit]
            out[k.key] = kept or out[k.key][:1]
    return out


def _best_with(searches: list[RecipeSearch], values: dict[str, Any]) -> optuna.trial.FrozenTrial | None:
    """The round's fastest feasible trial whose config holds every one of `values`."""
    return max((t for s in searches for t in s.ranked()
                if all((t.user_attrs.get("config") or {}).get(k) == v for k, v in values.items())),
               key=lambda t: t.value, default=None)


# Changes whose saving grows with a growing knob: persistent workers save every worker's
# start at each epoch, so more workers save more.
CARRIED = {"data.num_workers": {"data.persistent_workers": True}}


def _carried(ctx: Context, searches: list[RecipeSearch], grown: str, config: TrainConfig,
             best: optuna.trial.FrozenTrial) -> tuple[TrainConfig, str]:
    """The config a range grows from: `best`'s, with each change of `CARRIED` that a trial of this
    round at the same count (its other knobs as they were) read within the noise of the best, and
    the words that say so."""
    words = []
    for k, v in CARRIED.get(grown, {}).items():
        alt = normalized(config, {k: v})
        if alt.get(k) != v or config.get(k) == v:
            continue
        level = _best_with(searches, {k: v, grown: config.get(grown)})  # at the same count, other knobs as they were
        if level is not None and level.value >= best.value / ctx.band:
            config = alt
            words.append(f"{k}={v}")
    how = (f", with {', '.join(words)} (read within the noise of the best at {config.get(grown)}; saves more with "
           f"more)") if words else ""
    return config, how


def _grow(ctx: Context, name: str, recipe: Recipe, target: Bottleneck, state: State, est: float | None,
          searches: list[RecipeSearch], trials_left: int, deadline: float | None) -> list[tuple[int, str]]:
    """While the best trial sits at a growable knob's top (or the top reads within the noise of it, or
    it is in the top octave) and its waste is still material, search that knob at twice and four
    times the top, within the host's limit; not where the range's best left its waste as it was."""
    out: list[tuple[int, str]] = []
    ranges = {k.key: ints(searches[0].space[k.key]) for k in recipe.knobs if k.grow and k.key in searches[0].space}
    growable = [k for k in recipe.knobs if ranges.get(k.key)]
    for i in range(GROW_STEPS):
        best = best_of(searches)
        if best is None or not growable or trials_left < 1 or (est is not None and best.value < est / ctx.band):
            break  # nothing measured, or the best of the range is slower than the incumbent: no direction to grow
        summary = stored_summary(best)
        verdict = diagnose(summary, ctx.runner.device.type, ctx.constraints.memory_limit, previous=state.verdict)
        waste = verdict.waste(target)
        if waste is None or not material(waste, ctx.margin):
            break
        before = state.verdict.waste(target)
        if i == 0 and est is not None and best.value <= est and (before is None or waste.share > before.share - MOVED):
            out.append((0, f"the range's best trial read no faster than the current config ({best.value / est:.2f}x "
                           f"its estimate) and left the step losing {waste.share:.0%} to {target.value}: the knob "
                           f"does not act on it here, so more of it would not either; range not grown"))
            break
        for knob in growable:
            top = max(ranges[knob.key])
            # The top's own reading, when it is not the best: one reading of each is within
            # the noise of the other, so the range has not shown a peak below its top.
            at_top = _best_with(searches, {knob.key: top})
            # The best in the range's top octave (6 of 1..8) while the waste stays: one low
            # reading of the top (a noisy window, a late rung) does not close the range.
            high = (best.user_attrs.get("config") or {}).get(knob.key)
            near = isinstance(high, int) and not isinstance(high, bool) and 2 * high > top
            if at_top is not None and at_top.value >= best.value / ctx.band:
                start = at_top
            elif near:
                start = best
            else:
                continue
            where = ("the best trial sat at the top of the range" if high == top else
                     "the trial at the top of the range read within the noise of the best" if start is at_top else
                     f"the best trial ({high}) sat in the range's top octave")
            # Grown from the best config found, whichever trial showed the range too small: its
            # other knobs (persistent workers, prefetch depth) came from the search too, and
            # more workers without them can lose what they gave.
            summary, config = stored_summary(best), TrainConfig().with_changes(best.user_attrs["config"])
            busy = machine.saturating(knob.key, top, summary, state.summary)
            if busy:
                out.append((0, f"{knob.key}: {where} ({top}), but loading is CPU work and {top} already exceed the "
                               f"{busy:.1f} that keep the {machine.cores()} cores busy: more would only share them; "
                               f"range not grown"))
                return out
            config, carried = _carried(ctx, searches, knob.key, config, best)
            limit = min(machine.growth_limit(knob.key, summary), machine.growth_limit(knob.key, state.summary))
            values = sorted({min(v, limit) for v in (2 * top, 4 * top)} - {top})
            values = [v for v in values if v > top]
            if not values:
                out.append((0, f"{knob.key}: {where} ({top}), the host's limit "
                               f"({limit}, from memory and open files per worker and how much of the data wait is CPU "
                               f"work); range not grown"))
                return out
            # The best config was measured: it is the grown search's known incumbent.
            grow = RecipeSearch(ctx.storage, f"{name}-grow{i + 1}", {knob.key: values}, config, ctx.runner,
                                ctx.constraints, ctx.seed, pool=ctx.pool, incumbent_known=True, changes_from=state.config,
                                earlier=ctx.earlier)
            ran = grow.run(min(len(values), trials_left), deadline,
                           on_trial=lambda t: ctx.events.trial(trial_record(t)), cost_s=ctx.trial_cost())
            trials_left -= len(grow.finished())
            searches.append(grow)
            ctx.live.append(grow)
            ranges[knob.key] = ranges[knob.key] + values
            out.append((ran, f"{knob.key}: {where} ({top}) and the step still loses {waste.share:.0%} to "
                             f"{target.value}: grown to {', '.join(map(str, values))}{carried}"))
            break
        else:
            break
    return out
