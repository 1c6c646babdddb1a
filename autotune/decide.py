"""The decision that ends a round: which of the search's candidates, if any, replaces the
incumbent (at most one), settled only by side-by-side comparisons: duels among near-tied
candidates, then looks at the best until the policy (`autotune.policy.judge`) keeps or drops it.
"""

from __future__ import annotations

import time

from .config import TrainConfig
from .context import Context, State, changes_text, digest, key
from .diagnose import diagnose
from .evidence import joined, spread
from .policy import Decision, Look, NoiseModel, Verdict, judge
from .recipes import Recipe
from .record import Brief, Comparison, Ratio, Step, Summary, TrialState
from .search import fits, normalized, stored_summary
from .stats import looks_ratio

__all__ = ["CANDIDATES", "decide", "duel", "judgement", "preferred", "recheck", "worth_a_duel"]

CANDIDATES = 3  # most of the search's candidates a round considers (those within the noise of the best are dueled)
OFFERED = 2  # most candidates compared with the incumbent per round
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
        looked = seen.get(key(cand.flat()))
        first, looks, decision = _settle(ctx, name, recipe, state, cand, deadline, looked, chose=looked is not None)
        _verdict(step, first, looks, decision, state, summary, ctx, searched or best.value / state.summary.samples_per_s)
        step.reason += chosen + note  # chosen: the duel's winner, alone
        ctx.events.decision(recipe.name, step.accepted, step.reason or "")
        if step.accepted:
            verdict = diagnose(summary, ctx.runner.device.type, ctx.constraints.memory_limit, previous=state.verdict)
            return State(cand, summary, verdict, fits(summary, ctx.constraints.memory_limit))
    return state


def worth_a_duel(best: float, est: float, feasible: bool) -> bool:
    """Whether near-tied candidates are worth dueling before one is offered: only where one may
    replace the incumbent (the best read above its pooled estimate `est`, or it does not fit)."""
    return not feasible or best > est


def _none_ranked(step: Step) -> str:
    """Why no trial of the round could be compared: which were stopped as far slower than the
    current config, which failed or did not fit."""
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
    """The candidates the search could not tell apart, side by side: the search's best meets each
    of the others in turn and the faster of each duel stays on. Returns the winner and a note
    naming those it was offered before ("" when no duel was measured)."""
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
    """Two candidates side by side, again up to `DUEL_LOOKS` while the interval holds 1: (winner,
    loser's ratio to it, looks, note), or None without time for a look. Undecided within the least
    gain, the one quicker to start wins (`START_FACTOR`, `START_MIN_S`); else `preferred`; else the ratio."""
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
    """Where two configs differ in one knob only, a named mode of `recipe`'s (not a number), that
    knob and the value the recipe lists first; None otherwise."""
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
    """One side-by-side look at a candidate whose single search reading fell below the noise band,
    under the key `_settle` would use (hand it to `decide` as `seen`); None without time for it."""
    return _first_look(ctx, name, recipe, state, cand) if _time_for(ctx, deadline, 2) else None


def _first_look(ctx: Context, name: str, recipe: Recipe, state: State, cand: TrainConfig) -> Comparison:
    """A candidate's first comparison with the incumbent, noted: one key for `recheck` and
    `_settle`, so a recheck's look is the one `_settle` would take (stored, not repeated)."""
    look = ctx.compare(f"{name}:accept:{digest(cand.flat())}", state.config, cand, f"{recipe.name} against current")
    ctx.note_pairs(state.config, cand, look)
    return look


def _settle(ctx: Context, name: str, recipe: Recipe, state: State, cand: TrainConfig,
            deadline: float | None = None, first: Comparison | None = None,
            chose: bool = False) -> tuple[Comparison, list[Comparison], Decision | None]:
    """Looks at a candidate beside the incumbent, each from fresh sessions, until the policy keeps or
    drops it or the budget has no room for another. `first`: a look taken and noted already
    (`recheck`); `chose`: that look chose the candidate, so it is not counted as evidence for it."""
    tag = digest(cand.flat())
    what = f"{recipe.name} against current"
    if first is None:
        first = _first_look(ctx, name, recipe, state, cand)
    if not (state.feasible and first.measured):
        return first, [], None
    looks: list[Comparison] = []
    decision = judgement(ctx, first, looks, chose)
    while decision.verdict is Verdict.LOOK and _time_for(ctx, deadline, 2):  # a look takes two configs' windows
        n = len(looks) + 1
        more = ctx.compare(f"{name}:confirm{n if n > 1 else ''}:{tag}", state.config, cand, f"{what}, look {n + 1}")
        ctx.note_pairs(state.config, cand, more)
        looks.append(more)
        if len(looks) == 1:
            ctx.looked.append(looks)
        if not more.measured:
            break
        decision = judgement(ctx, first, looks, chose)
    return first, looks, decision


def judgement(ctx: Context, first: Comparison, looks: list[Comparison], chose: bool = False) -> Decision:
    """The policy's verdict on a candidate's looks (`first` left out when it `chose` the candidate),
    under the noise model fitted to the run's A/As and every other candidate's repeated looks."""
    nulls, others = spread(ctx, looks)
    model = NoiseModel.fit([Look.of(a, b) for a, b in nulls], [[Look.of(a, b) for a, b in g] for g in others])
    counted = [c for c in ([] if chose else [first]) + looks if c.measured]
    return judge([Look.of(c.a, c.b) for c in counted], model, ctx.policy)


def _verdict(step: Step, first: Comparison, looks: list[Comparison], decision: Decision | None, state: State,
             cand: Summary, ctx: Context, searched: float) -> None:
    """Accept or reject one candidate on its side-by-side looks and the policy's `decision`, with the
    reason (`searched`: the search's reading of it over the incumbent's pooled estimate)."""
    limit = ctx.constraints.memory_limit
    sp = joined([first, *looks])
    if not state.feasible:
        ratio = f"; throughput ratio {sp.ratio:.2f}x [{sp.low:.2f}, {sp.high:.2f}]" if sp.measured else ""
        step.accepted, step.speedup = True, sp.ratio_only() if sp.measured else None
        step.reason = f"fits the memory limit (peak {cand.peak_memory_bytes} B, limit {limit} B){ratio}"
        return
    step.accepted = False
    if sp.failed:
        step.reason = f"the interleaved re-measurement failed: {sp.failed}"
        return
    if not sp.measured or decision is None:
        step.reason = f"the interleaved re-measurement gave too few usable pairs ({sp.pairs}) for an interval"
        return
    post, p = decision.posterior, ctx.policy
    if not post.looks:
        step.speedup = sp.ratio_only()
        step.reason = f"the budget ran out before a look beyond the one that chose it (search estimate {searched:.2f}x)"
        return
    low, high = post.interval()
    pairs = sum(c.pairs for c in ([first] if post.looks > len(looks) else []) + looks)
    step.speedup = Ratio(ratio=post.ratio, low=low, high=high, pairs=pairs)
    step.accepted = decision.verdict is Verdict.KEEP
    looked = f"{post.ratio:.2f}x [{low:.2f}, {high:.2f}] over {post.looks} look{'s' if post.looks > 1 else ''}"
    chance = f"P(gain > {decision.bar:.3f}) = {decision.p_gain:.3f}"
    if step.accepted:
        step.reason = f"{looked}: {chance}, at least {1 - p.alpha:g}"
    elif decision.verdict is Verdict.LOOK:
        step.reason = f"{looked}: {chance}, not settled when the budget ran out (search estimate {searched:.2f}x)"
    elif decision.p_gain < p.floor:
        step.reason = f"{looked}: {chance}, under {p.floor:g} (search estimate {searched:.2f}x)"
    else:
        step.reason = f"{looked}: {chance}; {decision.why} (search estimate {searched:.2f}x)"
