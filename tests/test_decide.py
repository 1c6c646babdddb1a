"""How a round decides between its candidates and the incumbent, on scripted side-by-side
comparisons: looks are taken until the policy keeps or drops a candidate, each outcome
following from the looks and the noise alone, and two candidates that the search cannot
tell apart are compared with each other first."""

from __future__ import annotations

import time

import optuna
import pytest

from autotune.config import TrainConfig
from autotune.context import Context, State, key
from autotune.decide import decide, judgement, preferred
from autotune.evidence import one_look
from autotune.diagnose import diagnose
from autotune.policy import Policy
from autotune.events import Silent
from autotune.recipes import load_recipes
from autotune.record import Brief, Comparison, Step
from autotune.search import Constraints
from autotune.stats import paired_ratio
from autotune.testing import FakeRunner

INCUMBENT = [100.0] * 5
CLEAR = [110.0, 111.0, 109.5, 110.5, 110.2]  # 1.10x, a narrow interval
PROMISING = [110.52, 102.02, 108.33, 104.08, 106.18]  # 1.06x, an interval that straddles the margin
NOTHING = [100.5, 99.0, 101.0, 99.5, 100.2]  # 1.00x
# Two A/As that read 1.01x and 0.99x: what fresh pairs of sessions differ by here.
NULLS = [Comparison(**paired_ratio(INCUMBENT, b), a=INCUMBENT, b=b) for b in ([101.0] * 5, [99.0] * 5)]


def tight(r: float) -> list[float]:
    """Five windows of a config `r` times the incumbent's, within 0.2% of each other: a
    look whose spread is between looks, not inside it."""
    return [100.0 * r * f for f in (1.002, 0.998, 1.001, 0.999, 1.0)]


def nulls(*ratios: float) -> list[Comparison]:
    """A/As of tight looks that read `ratios`: what fresh pairs of sessions differ by."""
    return [Comparison(**paired_ratio(INCUMBENT, tight(r)), a=INCUMBENT, b=tight(r)) for r in ratios]


def in_turn(kind: str, ratios) -> dict[str, list[float]]:
    """Tight looks reading `ratios`, keyed as `kind`'s looks are asked: kind, kind2, kind3, ..."""
    return {f"{kind}{i + 1 if i else ''}": tight(r) for i, r in enumerate(ratios)}


class Script:
    """`Context.compare` answering from a script: per kind of key (accept, confirm,
    confirm2, duel), the windows of B (A's are `INCUMBENT`); every key asked is kept."""

    def __init__(self, **windows: list[float] | list[list[float]]) -> None:
        self.windows, self.keys = windows, []

    def __call__(self, key: str, a: TrainConfig, b: TrainConfig, what: str) -> Comparison:
        self.keys.append(key)
        kind = key.split(":")[1]
        ys = self.windows[kind]
        if ys and isinstance(ys[0], list):  # one script per candidate, in the order asked
            ys = ys.pop(0)
        return Comparison(**paired_ratio(INCUMBENT, ys), a=INCUMBENT, b=list(ys))

    def kinds(self) -> list[str]:
        return [k.split(":")[1] for k in self.keys]


def setup(script: Script, margin: float = 1.03, band: float = 1.08):
    runner = FakeRunner(lambda c: 100.0)
    ctx = Context(storage=None, study="s", runner=runner, constraints=Constraints(None, [1.0, 0.9]), seed=0,
                  margin=margin, aa_band=band, compare=script, events=Silent(), nulls=list(NULLS))
    base = TrainConfig()
    summary = runner.open(base).summary()
    ctx.note(base.flat(), 100.0)
    return ctx, runner, State(base, summary, diagnose(summary, "cpu"), True)


def candidate(runner: FakeRunner, changes: dict, value: float) -> optuna.trial.FrozenTrial:
    cfg = TrainConfig().with_changes(changes)
    return optuna.trial.create_trial(value=value, user_attrs={
        "config": cfg.flat(), "changes": changes, "summary": runner.open(cfg).summary().model_dump(mode="json")})


def run(script: Script, cands: list[optuna.trial.FrozenTrial], ctx, state,
        prior: float | None = None, recipe: str = "optimizer-impl") -> tuple[Step, State]:
    step = Step(round=1, recipe=recipe, bottleneck="compute", trials=[], before=Brief.of(state.summary),
                expected_gain=prior)
    recipe = next(r for r in load_recipes() if r.name == recipe)
    return step, decide(ctx, "s/01", recipe, step, state, cands, None)


def test_two_candidates_within_noise_of_each_other_are_compared_with_each_other_first():
    """The search read `foreach` a little higher (one lucky reading); side by side `fused`
    is faster, so `fused` is the one offered against the incumbent and kept."""
    script = Script(duel=CLEAR, accept=[CLEAR], confirm=[CLEAR])
    ctx, runner, state = setup(script)
    lucky = candidate(runner, {"optimizer.impl": "foreach"}, 112.0)
    better = candidate(runner, {"optimizer.impl": "fused"}, 109.0)
    step, after = run(script, [lucky, better], ctx, state)
    assert script.kinds()[:2] == ["duel", "accept"]
    assert step.accepted and after.config.optimizer.impl == "fused"
    assert "offered before the other candidate (optimizer.impl=foreach)" in step.reason
    assert "0.91x of it side by side" in step.reason


def test_the_search_order_stands_when_the_duel_agrees_with_it():
    script = Script(duel=[90.0, 91.0, 89.0, 90.5, 90.0], accept=[CLEAR], confirm=[CLEAR])
    ctx, runner, state = setup(script)
    first = candidate(runner, {"optimizer.impl": "foreach"}, 112.0)
    second = candidate(runner, {"optimizer.impl": "fused"}, 109.0)
    step, after = run(script, [first, second], ctx, state)
    assert script.kinds()[:2] == ["duel", "accept"]
    assert after.config.optimizer.impl == "foreach"


def test_candidates_apart_beyond_the_noise_are_not_dueled():
    script = Script(accept=[CLEAR, CLEAR], confirm=[CLEAR])
    ctx, runner, state = setup(script)
    step, after = run(script, [candidate(runner, {"optimizer.impl": "foreach"}, 130.0),
                               candidate(runner, {"optimizer.impl": "fused"}, 109.0)], ctx, state)
    assert "duel" not in script.kinds()
    assert after.config.optimizer.impl == "foreach"


def test_the_loser_of_a_duel_gets_no_second_chance_against_the_incumbent():
    script = Script(duel=[90.0, 91.0, 89.0, 90.5, 90.0], accept=[NOTHING, CLEAR], confirm=[CLEAR])
    ctx, runner, state = setup(script)
    step, after = run(script, [candidate(runner, {"optimizer.impl": "foreach"}, 112.0),
                               candidate(runner, {"optimizer.impl": "fused"}, 109.0)], ctx, state)
    assert script.kinds() == ["duel", "accept"]  # foreach won the duel and did not clear: fused is not tried
    assert not step.accepted and after is state


def test_over_the_memory_limit_the_two_fastest_fits_are_dueled_and_the_faster_is_kept():
    script = Script(duel=CLEAR, accept=[NOTHING])
    ctx, runner, state = setup(script)
    state = State(state.config, state.summary, state.verdict, False)  # the incumbent does not fit
    lucky = candidate(runner, {"memory.micro_batch_size": 512, "memory.activation_checkpointing": True}, 112.0)
    faster = candidate(runner, {"memory.activation_checkpointing": True}, 109.0)
    step, after = run(script, [lucky, faster], ctx, state)
    assert script.kinds() == ["duel", "accept"]  # fitting is the gain: no fresh evidence is asked
    assert step.accepted and after.config.memory.micro_batch_size is None
    assert after.config.memory.activation_checkpointing is True


def test_three_candidates_within_noise_meet_in_turn_and_the_last_winner_is_offered():
    """decode_bound's grid's best read third of three in the search: the search's best
    beats the second side by side, then loses to the third, which alone is offered."""
    script = Script(duel=[[90.0, 91.0, 89.0, 90.5, 90.0], CLEAR], accept=[CLEAR], confirm=[CLEAR])
    ctx, runner, state = setup(script)
    first = candidate(runner, {"optimizer.impl": "foreach"}, 112.0)
    second = candidate(runner, {"optimizer.impl": "fused"}, 110.0)
    third = candidate(runner, {"optimizer.impl": "foreach", "backend.num_threads": 1}, 108.0)
    step, after = run(script, [first, second, third], ctx, state)
    assert script.kinds()[:3] == ["duel", "duel", "accept"]
    assert step.accepted and after.config.backend.num_threads == 1
    assert "offered before 2 other candidates" in step.reason and "(optimizer.impl=fused) 0.90x" in step.reason


def test_candidates_that_all_read_slower_than_the_incumbent_are_offered_without_a_duel():
    """Two candidates within the noise of each other, both read below the incumbent's
    estimate: which of two likely losers is offered is not worth a duel's looks (a keyword
    spotter's loader round spent its budget on them); each is offered, a look each."""
    script = Script(accept=[NOTHING, NOTHING])
    ctx, runner, state = setup(script)
    first = candidate(runner, {"optimizer.impl": "foreach"}, 97.0)
    second = candidate(runner, {"optimizer.impl": "fused"}, 96.0)
    step, after = run(script, [first, second], ctx, state)
    assert script.kinds() == ["accept", "accept"], script.kinds()
    assert not step.accepted and after.config.optimizer.impl == "default"


@pytest.mark.parametrize("feasible", [True, False])
def test_candidates_are_dueled_where_the_best_reads_faster_or_the_incumbent_does_not_fit(feasible):
    script = Script(duel=CLEAR, accept=[CLEAR], confirm=[CLEAR])
    ctx, runner, state = setup(script)
    state = State(state.config, state.summary, state.verdict, feasible)
    best = 101.0 if feasible else 97.0  # just above the incumbent's estimate; or below it, but nothing fits
    step, after = run(script, [candidate(runner, {"optimizer.impl": "foreach"}, best),
                               candidate(runner, {"optimizer.impl": "fused"}, 96.0)], ctx, state)
    assert script.kinds()[0] == "duel", script.kinds()


def test_a_duel_that_cannot_tell_its_candidates_apart_looks_again():
    """memory_bound's two fits 7% apart read 0.99x in one look and the slower was kept:
    while the duel's looks hold 1, another is taken (up to six), and they decide."""
    wide = [118.0, 84.0, 117.0, 83.0, 100.0]  # 0.99x, an interval holding 1
    later = [105.0, 109.0, 107.0, 106.0, 108.0]
    script = Script(duel=wide, duel2=[104.0, 108.0, 106.0, 107.0, 105.0], duel3=later, duel4=later, duel5=later,
                    duel6=later, accept=[NOTHING])
    ctx, runner, state = setup(script)
    state = State(state.config, state.summary, state.verdict, False)  # the incumbent does not fit
    lucky = candidate(runner, {"memory.activation_checkpointing": True}, 112.0)
    faster = candidate(runner, {"memory.micro_batch_size": 512}, 109.0)
    step, after = run(script, [lucky, faster], ctx, state)
    assert script.kinds()[:2] == ["duel", "duel2"] and script.kinds()[-1] == "accept"
    assert after.config.memory.micro_batch_size == 512 and not after.config.memory.activation_checkpointing
    assert "looks" in step.reason


def test_a_duel_whose_three_looks_still_hold_one_looks_again_and_the_later_looks_decide():
    """memory_bound's checkpointing read 1.00x of micro-batch 512 over three looks, the
    judge 0.82x: three looks that still hold 1 get more (up to six), and all of them pick."""
    script = Script(**in_turn("duel", (0.97, 1.03, 0.99, 1.08, 1.07, 1.09)), accept=[NOTHING])
    ctx, runner, state = setup(script)
    state = State(state.config, state.summary, state.verdict, False)  # the incumbent does not fit
    lucky = candidate(runner, {"memory.activation_checkpointing": True}, 112.0)
    faster = candidate(runner, {"memory.micro_batch_size": 512}, 109.0)
    step, after = run(script, [lucky, faster], ctx, state)
    assert script.kinds()[:4] == ["duel", "duel2", "duel3", "duel4"], script.kinds()
    assert after.config.memory.micro_batch_size == 512 and not after.config.memory.activation_checkpointing
    assert "checkpointing" in step.reason and "looks" in step.reason


def started(trial: optuna.trial.FrozenTrial, seconds: float) -> optuna.trial.FrozenTrial:
    """`trial` with a search measurement that took `seconds` to set up and take a first step."""
    trial.user_attrs["summary"]["one_time"] = {"setup_s": seconds / 2, "first_step_s": seconds / 2}
    return trial


def test_a_duel_too_close_to_call_keeps_the_candidate_that_is_clearly_quicker_to_start():
    """Two compile modes read within the least gain of each other over six looks: the one
    that compiles in 10 s wins over the one that takes 30 s, though its looks read 0.99x."""
    script = Script(**in_turn("duel", (0.97, 1.02, 0.98, 1.01, 0.99, 1.00)), accept=[CLEAR], confirm=[CLEAR])
    ctx, runner, state = setup(script)
    slow = started(candidate(runner, {"compile.mode": "max-autotune-no-cudagraphs"}, 112.0), 30.0)
    quick = started(candidate(runner, {"compile.mode": "default"}, 109.0), 10.0)
    step, after = run(script, [slow, quick], ctx, state)
    assert script.kinds()[:6] == ["duel", "duel2", "duel3", "duel4", "duel5", "duel6"], script.kinds()
    assert after.config.compile.mode == "default", step.reason
    assert "too close to call" in step.reason and "30.0 s against 10.0 s" in step.reason


@pytest.mark.parametrize("ratios, seconds, quick_s", [
    ((1.02, 0.92, 1.01, 0.93, 0.99, 0.94), 30.0, 10.0),  # 0.97x, holding 1: past the least gain
    ((0.97, 1.02, 0.98, 1.01, 0.99, 1.00), 30.0, 25.0),  # 25 s against 30: not 1.5x quicker
    ((0.97, 1.02, 0.98, 1.01, 0.99, 1.00), 0.2, 0.02),  # 10x quicker, by a fraction of a second
])
def test_a_duel_that_reads_apart_or_starts_alike_keeps_the_faster_reading(ratios, seconds, quick_s):
    """Six looks that hold 1 but read the two a least gain apart, or two candidates that
    start within 1.5x or 5 s of each other: the looks' ratio picks."""
    script = Script(**in_turn("duel", ratios), accept=[CLEAR], confirm=[CLEAR])
    ctx, runner, state = setup(script)
    slow = started(candidate(runner, {"compile.mode": "max-autotune-no-cudagraphs"}, 112.0), seconds)
    quick = started(candidate(runner, {"compile.mode": "default"}, 109.0), quick_s)
    step, after = run(script, [slow, quick], ctx, state)
    assert after.config.compile.mode == "max-autotune-no-cudagraphs", step.reason
    assert "too close to call" not in step.reason


def test_a_duel_that_cannot_tell_two_modes_apart_keeps_the_one_the_recipe_lists_first():
    """overhead_bound's compile round kept max-autotune where six looks read default 0.96x
    of it, holding 1 (the judge: 0.91 and 0.94 of the grid's best, in default mode). Undecided
    looks do not show the other mode's gain: the recipe's first choice stays."""
    script = Script(**in_turn("duel", (1.02, 0.92, 1.01, 0.93, 0.99, 0.94)), accept=[CLEAR], confirm=[CLEAR])
    ctx, runner, state = setup(script)
    luckier = candidate(runner, {"compile.mode": "max-autotune-no-cudagraphs"}, 112.0)
    first = candidate(runner, {"compile.mode": "default"}, 109.0)
    step, after = run(script, [luckier, first], ctx, state, recipe="compile")
    assert script.kinds()[:6] == ["duel", "duel2", "duel3", "duel4", "duel5", "duel6"], script.kinds()
    assert step.accepted and after.config.compile.mode == "default", step.reason
    assert "the recipe's first choice" in step.reason and "0.97x" not in step.reason


def test_a_duel_that_shows_the_later_mode_faster_keeps_it():
    script = Script(duel=[80.0, 81.0, 79.0, 80.5, 80.0], accept=[CLEAR], confirm=[CLEAR])
    ctx, runner, state = setup(script)
    faster = candidate(runner, {"compile.mode": "max-autotune-no-cudagraphs"}, 112.0)
    step, after = run(script, [faster, candidate(runner, {"compile.mode": "default"}, 109.0)], ctx, state,
                      recipe="compile")
    assert script.kinds()[0] == "duel" and "duel2" not in script.kinds()
    assert after.config.compile.mode == "max-autotune-no-cudagraphs", step.reason
    assert "first choice" not in step.reason


@pytest.mark.parametrize("a, b, want", [
    ({"compile.mode": "max-autotune-no-cudagraphs"}, {"compile.mode": "default"}, ("compile.mode", "default")),
    ({"optimizer.impl": "foreach"}, {"optimizer.impl": "fused"}, None),  # not the compile recipe's knob
    ({"compile.mode": "default", "optimizer.impl": "fused"}, {"compile.mode": "max-autotune-no-cudagraphs"}, None),
    ({"compile.mode": "default", "data.num_workers": 2}, {"compile.mode": "default", "data.num_workers": 3}, None),
])
def test_a_recipe_prefers_only_between_two_of_its_named_modes(a, b, want):
    recipe = next(r for r in load_recipes() if r.name == "compile")
    assert preferred(recipe, TrainConfig().with_changes(a), TrainConfig().with_changes(b)) == want


def test_a_duel_that_tells_its_candidates_apart_at_once_takes_one_look():
    script = Script(duel=[80.0, 81.0, 79.0, 80.5, 80.0], duel2=CLEAR, accept=[NOTHING])
    ctx, runner, state = setup(script)
    state = State(state.config, state.summary, state.verdict, False)
    first = candidate(runner, {"memory.activation_checkpointing": True}, 112.0)
    second = candidate(runner, {"memory.micro_batch_size": 512}, 109.0)
    step, after = run(script, [first, second], ctx, state)
    assert script.kinds() == ["duel", "accept"]
    assert after.config.memory.activation_checkpointing is True


def test_the_noise_band_is_the_spread_of_the_runs_own_unpaired_readings():
    """Readings of one config taken at different times spread more than an A/A's paired
    windows: the band widens to say so (and stays the A/A's until the run has readings)."""
    ctx, runner, state = setup(Script(), band=1.03)
    assert ctx.band == 1.03  # one reading so far: no spread
    fused = TrainConfig().with_changes({"optimizer.impl": "fused"})
    for v in (92.0, 106.0):
        ctx.note(TrainConfig().flat(), v)
    for v in (120.0, 108.0):
        ctx.note(fused.flat(), v)
    assert ctx.spread() is not None and 1.10 < ctx.band < 1.5
    for _ in range(50):  # a flood of wild readings: capped
        ctx.note(fused.flat(), 60.0)
        ctx.note(fused.flat(), 160.0)
    assert ctx.band == 1.5


def test_an_a_a_is_one_reading_of_the_baseline_not_two():
    ctx, runner, state = setup(Script())
    aa = Comparison(**paired_ratio(INCUMBENT, NOTHING), a=INCUMBENT, b=NOTHING)
    ctx.note_pairs(state.config, state.config, aa)
    assert len(ctx.readings[next(iter(ctx.readings))]) == 2  # the baseline's trial and the A/A


def test_a_candidate_below_the_a_a_band_but_within_the_runs_spread_is_compared():
    """overhead_bound's 1 thread read 0.96x of the incumbent's pooled estimate, under the
    A/A's 1/1.03; the run's own readings of one config spread 5-10%: it is compared, and kept."""
    script = Script(accept=CLEAR, confirm=CLEAR)
    ctx, runner, state = setup(script, band=1.03)
    for v in (108.0, 95.0, 103.0):
        ctx.note(state.config.flat(), v)
    est = ctx.estimate(state.config)
    assert 96.0 / est < 1 / 1.03 and ctx.band > 1.05  # the premise: dropped by the A/A's band alone
    step, after = run(script, [candidate(runner, {"backend.num_threads": 1}, 96.0)], ctx, state)
    assert script.kinds()[0] == "accept"
    assert step.accepted and after.config.backend.num_threads == 1


INCONCLUSIVE = [112.0, 93.0, 110.0, 95.0, 101.0]  # 1.02x, an interval from ~0.93 to ~1.12


DIP = [105.0, 92.0, 104.0, 93.0, 99.0]  # 0.98x, an interval from ~0.91 to ~1.06


def test_a_gain_read_by_one_sessions_pairs_alone_is_not_shown_where_sessions_differ():
    """Two A/As read 1.04x and 0.96x, each with windows in step: pairs of one session agree,
    sessions do not. One fresh look of 1.08x in tight pairs clears 1.03 as pairs pooled,
    but not as one look among looks that differ by 4%; the looks that follow read 1.00x,
    1.06x, 0.99x and 1.07x, then 1.00-1.03x: a placebo's spread, and it is not kept."""
    later = {f"confirm{i}": tight(r) for i, r in enumerate((1.0, 1.03, 0.98, 1.02, 0.99, 1.01, 1.0), start=6)}
    script = Script(accept=tight(1.09), confirm=tight(1.08), confirm2=tight(1.0), confirm3=tight(1.06),
                    confirm4=tight(0.99), confirm5=tight(1.07), **later)
    ctx, runner, state = setup(script)
    ctx.nulls = nulls(1.04, 0.96)
    once = Comparison(**paired_ratio(INCUMBENT, tight(1.08)))
    assert once.low > ctx.margin  # the premise: its pairs alone clear the margin
    step, after = run(script, [candidate(runner, {"optimizer.impl": "fused"}, 108.0)], ctx, state)
    assert script.kinds()[:2] == ["accept", "confirm"] and len(script.kinds()) > 2
    assert not step.accepted and after is state, step.reason


def test_the_final_comparison_is_one_look_and_its_interval_holds_the_spread_between_sessions():
    ctx, runner, state = setup(Script())
    ctx.nulls = nulls(1.04, 0.96)
    final = Comparison(**paired_ratio(INCUMBENT, tight(1.5)), a=INCUMBENT, b=tight(1.5))
    r = one_look(ctx, final)
    assert r.ratio == pytest.approx(final.ratio, rel=1e-3) and r.pairs == 5  # its trimmed mean
    assert r.low < final.low / 1.05 and r.high > final.high * 1.05  # sessions 4% apart: far wider than its pairs
    assert r.low < 1.5 < r.high


def test_a_fake_session_offsets_all_its_windows_alike_and_each_session_its_own():
    """`FakeRunner(session=...)`: the windows of one handle (a measurement, one side of a
    comparison) share one offset; another handle of the same config draws another."""
    runner = FakeRunner(lambda c: 100.0, noise=0.0, session=0.1, seed=3)
    one, two = runner.open(TrainConfig()), runner.open(TrainConfig())
    a, b = [one.window() for _ in range(4)], [two.window() for _ in range(4)]
    assert len(set(a)) == 1 and len(set(b)) == 1 and a[0] != b[0]
    assert FakeRunner(lambda c: 100.0, noise=0.0).open(TrainConfig()).window() == 100.0


def _looks_script(first: float, fresh: list[float]) -> Script:
    """The first comparison and the fresh looks, each in tight pairs (the spread is between looks)."""
    return Script(accept=tight(first), **in_turn("confirm", fresh))


def forever(first: list[float], later: list[float]) -> Script:
    """A first look, then every later look reading `later` (as many as are asked)."""
    return Script(accept=first, **{f"confirm{i if i > 1 else ''}": later for i in range(1, 20)})


def looks_taken(script: Script) -> int:
    return sum(1 for k in script.kinds() if k == "accept" or k.startswith("confirm"))


def test_a_clear_gain_is_kept_on_its_first_look_and_the_reason_states_the_chance():
    script = forever(CLEAR, CLEAR)
    ctx, runner, state = setup(script)
    step, after = run(script, [candidate(runner, {"optimizer.impl": "fused"}, 110.0)], ctx, state)
    assert step.accepted and after.config.optimizer.impl == "fused"
    assert script.kinds() == ["accept"]  # tight looks, A/As 1% apart: one look settles it
    assert "P(gain > 1.030)" in step.reason and step.speedup.low > 1.03


def test_no_gain_is_dropped_at_its_first_look():
    script = forever(NOTHING, CLEAR)
    ctx, runner, state = setup(script)
    step, after = run(script, [candidate(runner, {"optimizer.impl": "fused"}, 104.0)], ctx, state)
    assert script.kinds() == ["accept"] and not step.accepted and after is state
    assert "under 0.05" in step.reason


@pytest.mark.parametrize("first, second", [(1.13, 1.14), (1.25, 1.22)])
def test_a_gain_two_looks_agree_on_is_kept_where_sessions_stray_four_percent(first, second):
    """One look is not enough where A/As read 1.04x and 0.96x; two that agree are."""
    script = _looks_script(first, [second, 1.0, 1.0])
    ctx, runner, state = setup(script)
    ctx.nulls = nulls(1.04, 0.96)
    step, after = run(script, [candidate(runner, {"optimizer.impl": "fused"}, 112.0)], ctx, state)
    assert looks_taken(script) <= 2
    assert step.accepted and after.config.optimizer.impl == "fused", step.reason


@pytest.mark.parametrize("first", [PROMISING, [107.0, 107.0, 107.0, 107.0, 70.0],
                                   [112.0, 93.0, 110.0, 95.0, 101.0], [105.0, 92.0, 104.0, 93.0, 99.0]],
                         ids=["promising", "burst", "inconclusive", "dip"])
def test_a_first_look_that_neither_shows_nor_rules_out_a_gain_gets_more_looks_that_decide(first):
    """Whatever the search read or the recipe promised: the looks alone decide."""
    for later, kept in ((CLEAR, True), (NOTHING, False)):
        script = forever(first, later)
        ctx, runner, state = setup(script)
        step, after = run(script, [candidate(runner, {"optimizer.impl": "fused"}, 100.0)], ctx, state)
        assert script.kinds()[:2] == ["accept", "confirm"], script.kinds()
        assert step.accepted is kept, step.reason


@pytest.mark.parametrize("fresh, kept", [
    ([1.01] * 12, False),  # fresh looks contradict a strong first look
    ([1.03, *[1.2] * 11], True),  # one contradicts it, the next ones agree with it
    ([1.06, 1.24, 1.00, 1.26, 1.04, 1.16, 1.12], True),  # looks 1.0-1.26x around a real gain
])
def test_looks_after_a_strong_first_look_decide_with_it(fresh, kept):
    """1.15x on one look where A/As read 1.04x and 0.96x: not enough alone, and the later looks decide."""
    script = _looks_script(1.15, fresh)
    ctx, runner, state = setup(script)
    ctx.nulls = nulls(1.04, 0.96)
    step, after = run(script, [candidate(runner, {"optimizer.impl": "fused"}, 120.0)], ctx, state)
    assert step.accepted is kept, step.reason
    assert looks_taken(script) <= ctx.policy.max_looks


def test_a_gain_the_looks_never_settle_is_looked_at_no_more_than_max_looks_times():
    wide = [125.0, 90.0, 128.0, 88.0, 105.0]  # 1.06x with windows 40% apart
    for limit in (3, 8):
        script = forever(wide, wide)
        ctx, runner, state = setup(script)
        ctx.policy = Policy(max_looks=limit)
        step, after = run(script, [candidate(runner, {"optimizer.impl": "fused"}, 108.0)], ctx, state)
        assert 1 < looks_taken(script) <= limit and not step.accepted and after is state, step.reason


def test_looks_stop_once_the_gain_they_read_is_out_of_reach():
    """Looks reading 0.97-1.10x around 1.03x: max_looks of them could not show a gain past 1.03."""
    script = _looks_script(1.10, [0.98, 1.08, 0.97, 1.06, 0.99, 1.05, 0.98, 1.07, 1.0, 1.0])
    ctx, runner, state = setup(script)
    ctx.nulls = nulls(1.04, 0.96)
    step, after = run(script, [candidate(runner, {"optimizer.impl": "fused"}, 116.0)], ctx, state)
    assert not step.accepted and after is state, step.reason
    assert looks_taken(script) < ctx.policy.max_looks, script.kinds()


def test_the_look_that_chose_a_candidate_is_not_counted_for_it():
    """A recheck's look (handed to `decide` as `seen`) put the candidate forward: it alone,
    however clear, keeps nothing; a fresh look is taken and decides."""
    script = forever(CLEAR, NOTHING)
    ctx, runner, state = setup(script)
    cand = candidate(runner, {"optimizer.impl": "fused"}, 90.0)
    seen = {key(cand.user_attrs["config"]): Comparison(**paired_ratio(INCUMBENT, CLEAR), a=INCUMBENT, b=CLEAR)}
    step = Step(round=1, recipe="optimizer-impl", bottleneck="compute", trials=[], before=Brief.of(state.summary))
    recipe = next(r for r in load_recipes() if r.name == "optimizer-impl")
    after = decide(ctx, "s/01", recipe, step, state, [cand], None, seen)
    assert script.kinds()[0] == "confirm" and not step.accepted and after is state, step.reason
    assert judgement(ctx, seen[key(cand.user_attrs["config"])], [], chose=True).posterior.looks == 0


def test_a_candidate_whose_looks_the_budget_cuts_short_is_not_kept_and_the_reason_says_so():
    script = forever(PROMISING, CLEAR)
    ctx, runner, state = setup(script)
    ctx.walls = [60.0]  # a look costs two minutes; the deadline is one away
    step = Step(round=1, recipe="optimizer-impl", bottleneck="compute", trials=[], before=Brief.of(state.summary))
    recipe = next(r for r in load_recipes() if r.name == "optimizer-impl")
    after = decide(ctx, "s/01", recipe, step, state, [candidate(runner, {"optimizer.impl": "fused"}, 108.0)],
                   time.time() + 60)
    assert script.kinds() == ["accept"] and not step.accepted and after is state
    assert "not settled when the budget ran out" in step.reason


def test_a_failed_look_rejects_the_candidate_with_the_failure():
    script = Script(accept=PROMISING)
    ctx, runner, state = setup(script)
    failing = Comparison(ratio=None, low=None, high=None, pairs=0, failed="out of memory")
    script_call = ctx.compare

    def compare(k, a, b, what):
        return failing if ":confirm" in k else script_call(k, a, b, what)
    ctx.compare = compare
    step, after = run(script, [candidate(runner, {"optimizer.impl": "fused"}, 108.0)], ctx, state)
    assert not step.accepted and after is state and "out of memory" in step.reason
