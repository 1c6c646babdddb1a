"""The decision that ends a round: which of the search's candidates, if any, replaces the
incumbent, settled only by configs measured in turns (A B A B ...) on this machine.

A search reads each config once, so it only nominates: each candidate within the noise
band of the incumbent's pooled estimate (the best few) is compared with it side by side.
When the best few read within the noise of each other, they are first compared with each
other (the search's best meets each of the others in turn), so that the faster one, not
the one with the luckier single reading, is offered, alone (decode_bound's loader round
had kept the config with the best single reading, 0.90 of its grid's best; with the duel
it kept the grid's best), where the best of them read faster than the incumbent
(`worth_a_duel`). A round accepts at most one
change. Under a memory limit the same duel picks the fastest of the configs that fit
(memory_bound's round had kept micro-batch 512 with checkpointing, which checkpointing
alone beat 1.17x side by side in the benchmark). A duel whose look cannot tell the two
apart looks again, up to `DUEL_LOOKS` (on a model of two configs 7% apart, windows 6%,
sessions 4%, 1 look in 10 off by 10-25%: the slower kept in 8% of duels with up to three
looks, 2% with up to six).

A gain stands only on fresh evidence. A first comparison whose ratio clears the margin
nominates the candidate (so does one that points the same way as a search reading of a
clear gain without settling it); fresh comparisons ("looks") then decide. While they are
promising but the gain is not shown, another look is taken, up to `FRESH_LOOKS`, and up
to `LAST_LOOKS` while all the looks together read past the least gain and could show it
within reach (`evidence.nearly`); a look past the time budget is not taken.
What the looks show, and whether another is worth taking, is `evidence`'s.
"""

from __future__ import annotations

import time

from .config import TrainConfig
from .context import Context, State, changes_text, digest, key
from .diagnose import clear_gain, diagnose
from .evidence import fresh_and_all, joined, nearly, pooled, promising, shown, spread
from .recipes import Recipe
from .record import Brief, Comparison, Ratio, Step, Summary, TrialState
from .search import fits, normalized, stored_summary
from .stats import looks_ratio

__all__ = ["CANDIDATES", "decide", "duel", "preferred", "recheck", "worth_a_duel"]

CANDIDATES = 3  # most of the search's candidates a round considers (those within the noise of the best are dueled)
OFFERED = 2  # most candidates compared with the incumbent per round
FRESH_LOOKS = 5  # most fresh comparisons (5 pairs each) while a gain stays promising but unshown
LAST_LOOKS = 12  # most fresh comparisons while all the looks read past the least gain and could still show it
DUEL_LOOKS = 6  # most comparisons of a round's two best candidates while they cannot be told apart
START_FACTOR = 1.5  # a duel's looks too close to call: the one this much quicker to start (compile, workers) wins,
START_MIN_S = 5.0  # by at least this many seconds (a warm compile cache starts either in a fraction of a second)


def decide(ctx: Context, name: str, recipe: Recipe, step: Step, state: State, ranked: list,
           deadline: float | None, seen: dict[str, Comparison] | None = None, note: str = "") -> State:
    """Compare the candidates the search could not tell from the incumbent, best first.

    `seen`: candidates (by config key) already compared with the incumbent side by side
    (`recheck`): each stands where that look puts it, not where its single reading did,
    and the look is its first comparison. `note` ends the reason (how the search chose
    where to go on from: `ladder.Rungs`)."""
    seen = seen or {}
    inc = key(state.config.flat())
    est = ctx.estimate(state.config) or state.summary.samples_per_s

    def value(t) -> float:
        look = seen.get(key(t.user_attrs.get("config") or {}))
        return est * look.ratio if state.feasible and look is not None else t.value

    cands = sorted((t for t in ranked if key(t.user_attrs.get("config") or {}) != inc), key=lambda t: -value(t))
    if not state.feasible:
        cands = cands[:CANDIDATES]  # the incumbent does not fit: the fastest config that fits wins
    else:
        cands = [t for t in cands if value(t) >= est / ctx.band][:CANDIDATES]
    if not cands:
        step.reason = ("the time budget ran out before a trial could finish" if not step.trials else
                       _none_ranked(step) if not ranked else
                       "the current config is over the memory limit and no trial fit" if not state.feasible else
                       "no trial came within the noise band of the current config in the search") + note
        return state
    chosen = ""
    close = [t for t in cands if value(t) >= value(cands[0]) / ctx.band]
    if len(close) > 1 and worth_a_duel(value(cands[0]), est, state.feasible):  # each duel first checks its time
        winner, chosen = _playoff(ctx, name, recipe, close, deadline)
        if chosen:  # the others measured no faster than it: no second chance against the incumbent
            cands = [winner]
    cands = cands[:OFFERED]
    for i, best in enumerate(cands):
        if i and not _time_for(ctx, deadline, 2):
            break
        cand = TrainConfig().with_changes(best.user_attrs["config"])
        summary = stored_summary(best)
        step.changes, step.after, step.after_config = normalized(state.config, {}).diff(cand), Brief.of(summary), cand.flat()
        pooled_est = ctx.estimate(state.config) if state.feasible else None
        searched = value(best) / pooled_est if pooled_est else None  # against the incumbent's pooled readings
        first, looks = _settle(ctx, name, recipe, state, cand, searched, deadline, step.expected_gain,
                               seen.get(key(cand.flat())))
        _verdict(step, first, looks, state, summary, ctx, searched or best.value / state.summary.samples_per_s)
        step.reason += chosen + note  # chosen: the duel's winner, alone
        ctx.events.decision(recipe.name, step.accepted, step.reason or "")
        if step.accepted:
            verdict = diagnose(summary, ctx.runner.device.type, ctx.constraints.memory_limit, previous=state.verdict)
            return State(cand, summary, verdict, fits(summary, ctx.constraints.memory_limit))
    return state


def worth_a_duel(best: float, est: float, feasible: bool) -> bool:
    """Whether candidates the search could not tell apart are worth dueling before one is
    offered: only where one may replace the incumbent, i.e. the best of them read faster
    than the incumbent's pooled estimate (or the incumbent does not fit: the fastest fit
    wins). Where none read faster, the likeliest end is that none is kept, whichever is
    offered, and the offers' own comparisons say so in a look each: a keyword-spotting
    model's loader round (an 8-minute budget) spent about 24 of its looks on duels among
    configs that all read 0.77-0.98x of the default, 1.00x and 0.98x of each other, offered
    the winner at 1.04x, not shown, and the budget ran out before compile or fused AdamW
    were tried."""
    return not feasible or best > est


def _none_ranked(step: Step) -> str:
    """Why no trial of the round could be compared: which were stopped as far slower than
    the current config (a working config, not a failure: undoing input_bound's loader read
    456 samples/s against 2,772 in its first window), which failed or did not fit."""
    slow = [t for t in step.trials if t.state is TrialState.SLOW]
    if not slow:
        return "every trial was infeasible or failed"
    why = f" ({slow[0].reason})" if len(slow) == 1 and slow[0].reason else ""
    if len(slow) == len(step.trials):
        return "every trial was far slower than the current config and stopped early" + why
    return (f"every trial was infeasible, failed or far slower than the current config ({len(slow)} of "
            f"{len(step.trials)} stopped early as far slower)")


def _time_for(ctx: Context, deadline: float | None, trials: float) -> bool:
    cost = ctx.trial_cost()
    return deadline is None or cost is None or time.time() + trials * cost < deadline


def _playoff(ctx: Context, name: str, recipe: Recipe, close: list, deadline: float | None) -> tuple[object, str]:
    """The candidates the search could not tell apart, side by side: the search's best
    meets each of the others in turn and the faster of each duel stays on (decode_bound's
    grid's best, 3 persistent workers with prefetch 4, read third of three within the noise
    in the search, and a duel of the first two kept one 0.91x of it). The winner, and a
    note naming the ones it was offered before ("" when no duel was measured)."""
    champion, lost = close[0], []
    for challenger in close[1:]:
        out = duel(ctx, name, recipe, champion, challenger, deadline)
        if out is None:
            continue
        winner, ratio, looks, note = out
        loser = challenger if winner is champion else champion
        champion = winner
        lost.append((loser, ratio, looks, note))
    if not lost:
        return close[0], ""
    if len(lost) == 1:
        loser, ratio, looks, note = lost[0]
        over = f" over {looks} looks" if looks > 1 else ""
        return champion, (f"; offered before the other candidate ({changes_text(loser)}), which read within the "
                          f"noise of it in the search and measured {ratio:.2f}x of it side by side{over}{note}")
    each = ", ".join(f"({changes_text(loser)}) {ratio:.2f}x of its rival" + (f" over {looks} looks" if looks > 1 else "")
                     + note for loser, ratio, looks, note in lost)
    return champion, (f"; offered before {len(lost)} other candidates that read within the noise of it in the search, "
                      f"each losing a duel side by side: {each}")


def duel(ctx: Context, name: str, recipe: Recipe, one, other,
          deadline: float | None) -> tuple[object, float, int, str] | None:
    """Two candidates side by side: the winner, the loser's ratio to it, the looks taken
    and a note when the start times picked it (None when no look was measured: no time for one).

    While the looks cannot tell which is faster (their interval, `stats.looks_ratio` with
    the run's spread between looks, holds 1), another look is taken, up to `DUEL_LOOKS`:
    memory_bound's two fits 7% apart (bf16 with micro-batch 512, bf16 with checkpointing)
    read 0.99x in one look and the slower was kept; later, checkpointing read 1.00x of
    micro-batch 512 over three looks (the benchmark's judge: 0.82x). Where the looks end
    undecided their ratio picks. Stopping early where the looks could not show their ratio
    within a few more (as `evidence.nearly` does for gains) kept the slower more often on
    the look model than three looks did: a ratio near 1 is where the pick goes wrong.

    Looks that end undecided and read the two within the least gain of each other cannot
    say which is faster, and a difference that small is not worth keeping: the one that is
    clearly quicker to start wins (`START_FACTOR`, `START_MIN_S`; set-up and first step, as
    each one's search trial measured them: compilation, worker start). Five of nine
    examples' compile rounds ended a 6-look duel of two compile modes at 0.96-1.00x, and
    the modes differ in how long they take to compile. Without the floor in seconds, 0.2 s
    against 0.0 s (compile modes from a warm cache, in-process) picked.

    Looks that end undecided otherwise keep the recipe's first choice where the two differ
    in one of its named modes (`preferred`): a change to the other would have to show its
    gain, and the looks did not."""
    if not _time_for(ctx, deadline, 2):
        return None
    a, b = (TrainConfig().with_changes(t.user_attrs["config"]) for t in (one, other))
    tag = f"{digest(a.flat())}:{digest(b.flat())}"
    what = f"{recipe.name}: two of its best candidates against each other"
    looks: list[Comparison] = []
    for look in range(1, DUEL_LOOKS + 1):
        again = f", look {look}" if look > 1 else ""
        sp = ctx.compare(f"{name}:duel{look if look > 1 else ''}:{tag}", a, b, what + again)
        ctx.note_pairs(a, b, sp)
        if not sp.measured:
            break
        looks.append(sp)
        r = looks_ratio([(c.a, c.b) for c in looks], *spread(ctx))
        undecided = bool(r["looks"]) and r["low"] < 1.0 < r["high"]
        if not undecided or not _time_for(ctx, deadline, 2):
            break
    if not looks:
        return None
    ratio = r["ratio"] if r["looks"] else joined(looks).ratio  # the last look's reading of them all
    faster = (other, 1.0 / ratio, len(looks), "") if ratio > 1.0 else (one, ratio, len(looks), "")
    if not undecided:
        return faster
    s_one, s_other = (stored_summary(t) for t in (one, other))
    if 1 / (1 + ctx.min_gain) < ratio < 1 + ctx.min_gain and s_one is not None and s_other is not None:
        (quick, q_s), (_, slow_s) = sorted(((one, Brief.of(s_one).one_time_s),
                                            (other, Brief.of(s_other).one_time_s)), key=lambda p: p[1])
        if slow_s >= max(q_s * START_FACTOR, q_s + START_MIN_S):
            note = (f" (too close to call, within the least gain {1 + ctx.min_gain:.3f}: it starts "
                    f"{slow_s - q_s:.1f} s later, {slow_s:.1f} s against {q_s:.1f} s to set up and take a first step)")
            return quick, (ratio if quick is one else 1.0 / ratio), len(looks), note
    plain = preferred(recipe, a, b)
    if plain is None:
        return faster
    k, v = plain
    kept = one if a.get(k) == v else other
    note = (f" (the looks could not tell them apart, interval [{r['low']:.2f}, {r['high']:.2f}] holding 1: "
            f"{k}={v}, the recipe's first choice of the two, is kept; the other would have to show it is faster)")
    return kept, (ratio if kept is one else 1.0 / ratio), len(looks), note


def preferred(recipe: Recipe, a: TrainConfig, b: TrainConfig) -> tuple[str, object] | None:
    """Where two configs differ in one knob only, a named mode of `recipe`'s (compile's
    default or max-autotune, fused or foreach, bf16 or fp16), that knob and the value the
    recipe lists first; None otherwise (numbers are climbed, not preferred: a ladder's
    rungs are settled by their readings).

    The recipe lists its modes in the order it would have them when measurements cannot
    tell them apart: compile's default mode compiles in less time than max-autotune and
    does not benchmark kernel choices at start-up, so each start runs the same program.
    overhead_bound's compile round kept max-autotune where six looks read default 0.96x
    of it, holding 1, in two runs (s19, s21); the benchmark's judge read them 0.91 and
    0.94 of the grid's best, which compiles in default mode."""
    diff = [k for k, v in a.flat().items() if b.flat().get(k) != v]
    if len(diff) != 1:
        return None
    k = diff[0]
    knob = next((kn for kn in recipe.knobs if kn.key == k and not isinstance(kn.choices, str)), None)
    va, vb = a.get(k), b.get(k)
    if knob is None or not (isinstance(va, str) and isinstance(vb, str)) or not {va, vb} <= set(knob.choices):
        return None
    return k, min((va, vb), key=knob.choices.index)


def recheck(ctx: Context, name: str, recipe: Recipe, state: State, cand: TrainConfig,
            deadline: float | None) -> Comparison | None:
    """One side-by-side look at a candidate whose single search reading said it is slower
    than the incumbent beyond the noise, before that reading ends its recipe's round (None
    when the time budget has no room for it). It is the look `_settle` would take first,
    under the same key, and is noted here: hand it to `decide` as `seen`.
    overhead_bound's compile read 0.74x of the incumbent's estimate in its one search
    reading (a trial of ~0.3 s: one disturbance covers it), 1.14x side by side."""
    return _first_look(ctx, name, recipe, state, cand) if _time_for(ctx, deadline, 2) else None


def _first_look(ctx: Context, name: str, recipe: Recipe, state: State, cand: TrainConfig) -> Comparison:
    """A candidate's first comparison with the incumbent, noted: one key for `recheck` and
    `_settle`, so a recheck's look is the one `_settle` would take (stored, not repeated)."""
    look = ctx.compare(f"{name}:accept:{digest(cand.flat())}", state.config, cand, f"{recipe.name} against current")
    ctx.note_pairs(state.config, cand, look)
    return look


def _settle(ctx: Context, name: str, recipe: Recipe, state: State, cand: TrainConfig,
            searched: float | None, deadline: float | None = None,
            prior: float | None = None, first: Comparison | None = None) -> tuple[Comparison, list[Comparison]]:
    """The first comparison with the incumbent and, when it nominates the candidate, the
    fresh looks that decide (one comparison, or up to `FRESH_LOOKS` while the looks are
    promising (`promising`) but the gain is not shown yet; up to
    `LAST_LOOKS` while `nearly`). Their ratio is the one that decides (each look's trimmed
    mean): the pairs pooled let one burst end the looks (on the look model, a 1.08x gain
    was kept in 93% of runs instead of 86%, a 1.05x in 40% instead of 37%, placebos in 0
    of 4,000 either way).
    Decisions are stored under the candidate's keys; `first`, when given, is the first
    comparison, taken and noted already (`recheck`)."""
    tag = digest(cand.flat())
    what = f"{recipe.name} against current"
    if first is None:
        first = _first_look(ctx, name, recipe, state, cand)
    if not (state.feasible and first.measured and _nominates(first, searched, ctx.margin, prior)):
        return first, []
    looks = [ctx.compare(f"{name}:confirm:{tag}", state.config, cand, f"{what}, again")]
    ctx.note_pairs(state.config, cand, looks[0])
    ctx.looked.append(looks)
    for look in range(2, LAST_LOOKS + 1):
        if not looks[-1].measured:  # the looks before it were measured, or the loop had ended
            break
        alone, every = fresh_and_all(ctx, first, looks)
        if not promising(ctx, first, alone, every):
            break
        if shown(ctx, alone, every) or (look > FRESH_LOOKS and not nearly(ctx, alone, every)):
            break
        if not _time_for(ctx, deadline, 2):  # a look takes two configs' windows
            break
        more = ctx.compare(f"{name}:confirm{look}:{tag}", state.config, cand, f"{what}, look {look + 1}")
        ctx.note_pairs(state.config, cand, more)
        looks.append(more)
    return first, looks


def _nominates(first: Comparison, searched: float | None, margin: float, prior: float | None = None) -> bool:
    """Whether the first comparison earns fresh evidence: its ratio clears the margin; or
    the search read a gain beyond the margin (`searched`: the candidate's reading over the
    incumbent's estimate) and the comparison neither contradicts it nor settles it (its
    ratio above 1, its interval reaching past the margin). Five pairs on a noisy machine
    span +-7%: compute_bound's fused AdamW (1.14x side by side in the benchmark's judge)
    read 1.03x [0.96, 1.10] once and was dropped. The fresh pairs still decide alone.

    Or the profile measured a waste this recipe removes worth more than twice the margin
    (`prior`: the recipe's expected gain, Amdahl on the waste's share) and the comparison
    does not rule out a gain (its interval reaching past the margin): one look at one pair
    of sessions does not drop the fix for the step's measured cost. decode_bound's
    persistent loader workers read 0.99x [0.85, 1.15] once (the search's single readings,
    under a lucky baseline, 0.81x) and were dropped; three more looks in the same session
    read 1.15x, 1.24x and 1.16x, the benchmark's judge 1.39x."""
    if first.ratio > margin:
        return True
    if not first.high > margin:
        return False
    if searched is not None and searched > margin and first.ratio > 1.0:
        return True
    return prior is not None and prior > clear_gain(margin)


def _verdict(step: Step, first: Comparison, looks: list[Comparison], state: State, cand: Summary, ctx: Context,
             searched: float) -> None:
    """Accept or reject one candidate on its side-by-side comparisons, with the reason
    (`searched`: the search's reading of it over the incumbent's pooled estimate)."""
    margin, limit = ctx.margin, ctx.constraints.memory_limit
    fresh = joined(looks) if looks else None
    sp = first if fresh is None else pooled(first, fresh)
    if not state.feasible:
        ratio = f"; throughput ratio {sp.ratio:.2f}x [{sp.low:.2f}, {sp.high:.2f}]" if sp.measured else ""
        step.accepted, step.speedup = True, sp.ratio_only() if sp.measured else None
        step.reason = f"fits the memory limit (peak {cand.peak_memory_bytes} B, limit {limit} B){ratio}"
        return
    if sp.failed:
        step.accepted, step.reason = False, f"the interleaved re-measurement failed: {sp.failed}"
        return
    if not sp.measured:
        step.accepted = False
        step.reason = f"the interleaved re-measurement gave too few usable pairs ({sp.pairs}) for an interval"
        return
    step.speedup = sp.ratio_only()
    if fresh is None:
        step.accepted = False
        step.reason = (f"measured {sp.ratio:.2f}x, interval [{sp.low:.2f}, {sp.high:.2f}], not above the noise "
                       f"margin {margin:.3f} (search estimate was {searched:.2f}x)")
        return
    alone, every = fresh_and_all(ctx, first, looks)
    step.accepted = shown(ctx, alone, every)
    if every["looks"]:
        step.speedup = Ratio(ratio=every["ratio"], low=every["low"], high=every["high"], pairs=every["pairs"])
    bar = 1 + ctx.min_gain
    how = (f"each look {len(first.a)} pairs from a fresh pair of sessions, counted once; the spread between looks "
           f"pooled with the A/As' and the run's other looks: {every['dof']} degrees of freedom")
    again = (f"the first comparison {first.ratio:.2f}x [{first.low:.2f}, {first.high:.2f}], then {alone['looks']} "
             f"fresh look{'s' if alone['looks'] != 1 else ''} alone {alone['ratio']:.2f}x "
             f"[{alone['low']:.2f}, {alone['high']:.2f}]")
    if step.accepted:
        step.reason = (f"{every['ratio']:.2f}x, interval [{every['low']:.2f}, {every['high']:.2f}] over "
                       f"{every['looks']} looks clears the least gain {bar:.3f} ({again}; {how})")
    else:
        step.reason = (f"not shown: {again}; all {every['looks']} looks {every['ratio']:.2f}x "
                       f"[{every['low']:.2f}, {every['high']:.2f}]: the fresh looks and all of them must each clear "
                       f"the least gain {bar:.3f} ({how})")
