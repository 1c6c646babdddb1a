"""The tuning loop: baseline, A/A noise, diagnose, search the cheapest matching recipe,
accept only what clears the noise in an interleaved re-measurement, repeat.

Decisions live in Optuna storage beside the trials (study user attributes), so re-running
the same command resumes: nothing finished is measured again. The agent fills one typed
`Report` as it goes, so an interrupted run still holds everything measured so far.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import optuna
from pydantic import BaseModel

from .version import __version__
from . import handoff, machine
from .config import TrainConfig
from .diagnose import diagnose
from .errors import TrialFailed, UserError
from .events import Listener, Silent
from .faults import checkpoint
from .identity import Resume, choose_study, fingerprint, fingerprint_id
from .lock import Lease
from .leftover import leftover
from .policy import DEFAULT
from .plan import Attempts, closing_recipe, inapplicable, joint_memory_recipe, rank, stop_reason
from .recipes import Recipe
from .recommend import recommendations
from .record import (Bottleneck, Brief, Budget, Comparison, FailureKind, Noise, Ratio, Report, Step,
                     StudyRef, Summary, Trial)
from .context import BAND_CAP, Context, State, window_band
from .rounds import play
from .evidence import one_look, pooled
from .runner import TrialRunner
from .search import Constraints, fits, quiet_optuna, trial_record
from .stats import noise_margin, paired_ratio

MIN_GAIN = DEFAULT.min_gain  # a change must gain at least this, whatever the noise says
SIZED = "window_steps"  # the ledger's record of the steps per window the baseline sized

M = TypeVar("M", bound=BaseModel)


def measured(trials: list[Trial]) -> int:
    """How many of `trials` were measured (a reading reused from earlier in the run was not)."""
    return sum(1 for t in trials if t.reused_from is None)


@dataclass
class Settings:
    trials: int = 40
    budget_s: float | None = None
    memory_limit: int | None = None
    seed: int = 0
    only: tuple[str, ...] = ()
    resume: Resume = Resume.AUTO


@dataclass
class Agent:
    runner: TrialRunner
    recipes: list[Recipe]
    storage: Any
    study: str
    settings: Settings
    facts: dict[str, bool]
    events: Listener = field(default_factory=Silent)
    storage_label: str | None = None  # the storage URL as reports may show it (no password)
    pool: Any = None  # an `autotune.pool.Dispatcher`: workers measure the search trials
    report: Report = field(init=False)

    def __post_init__(self) -> None:
        self._turns = 0  # comparisons measured by this process: which side opens first alternates
        self.fingerprint = fingerprint(self.runner, self.recipes, self.settings.memory_limit)
        self.study, self.study_note = choose_study(self.storage, self.study, self.fingerprint, self.settings.resume)
        self.report = self._header()

    # --- stored decisions --------------------------------------------------------------
    def _ledger(self) -> optuna.Study:
        return optuna.create_study(study_name=self.study, storage=self.storage, load_if_exists=True)

    def _remember(self, key: str, model: type[M], compute: Callable[[], M]) -> M:
        """A stored decision, or compute and store it; a failed comparison is not stored,
        so the next run tries it again."""
        ledger = self._ledger()
        if key in ledger.user_attrs:
            return model.model_validate(ledger.user_attrs[key])
        value = compute()
        if not getattr(value, "failed", None):
            ledger.set_user_attr(key, value.model_dump(mode="json"))
        return value

    def _compare(self, key: str, a: TrainConfig, b: TrainConfig, what: str) -> Comparison:
        """B over A from windows taken in turns; `failed` says why when one could not run. Which config
        opens first alternates between comparisons, so a bias of the second-opened side does not
        repeat in every look at a candidate."""

        def run() -> Comparison:
            checkpoint("compare")
            self.events.phase(f"comparing {what}")
            self._turns += 1
            try:
                if self._turns % 2:
                    xs, ys = self.runner.interleave(a, b, self.runner.protocol.windows)
                else:
                    ys, xs = self.runner.interleave(b, a, self.runner.protocol.windows)
            except TrialFailed as exc:
                return Comparison(ratio=None, low=None, high=None, pairs=0, failed=f"{exc.kind.value}: {exc.reason}")
            return Comparison(**paired_ratio(xs, ys), a=xs, b=ys)

        return self._remember(key, Comparison, run)

    def _noise(self, config: TrainConfig) -> tuple[Comparison, list[Comparison]]:
        """The A/A that sets the margin, and every A/A measured for it: two pooled; where that is
        `implausible_aa`, a third, and the two nearest 1 pooled (a repeat that fails keeps what was
        measured before it)."""
        first = self._compare("noise", config, config, "baseline against itself")
        if first.failed:
            raise UserError(f"the baseline could not be measured twice side by side ({first.failed}).")
        second = self._compare("noise:2", config, config, "baseline against itself again")
        if second.failed or second.ratio is None:
            return first, [first]
        measured = [first, second]
        aa = pooled(first, second)
        if not implausible_aa(aa):
            return aa, measured
        third = self._compare("noise:3", config, config, "baseline against itself a third time")
        if third.failed or third.ratio is None:
            return aa, measured
        measured.append(third)
        kept = sorted(measured, key=lambda c: abs(math.log(c.ratio)))[:2]
        return pooled(*kept), measured

    # --- the loop ------------------------------------------------------------------------
    def _state(self, config: TrainConfig, summary: Summary) -> State:
        v = diagnose(summary, self.runner.device.type, self.settings.memory_limit)
        return State(config, summary, v, fits(summary, self.settings.memory_limit))

    def run(self) -> Report:
        """The whole loop; the report holds what was measured even when it is interrupted."""
        with quiet_optuna():
            lease = Lease(self._ledger(), ttl_s=2 * getattr(self.runner, "timeout_s", 600.0) + 60)
            lease.take()
            self._lease = lease
            try:
                if self.pool is not None:
                    self.pool.keepalive = lease.renew  # a long parallel round keeps the study's lease fresh
                    self.pool.on_wait = lambda what: self.events.phase(what)
                return self._run()
            finally:
                if self.pool is not None:
                    self.pool.close(done=self.report.complete)
                lease.release()

    def _published(self) -> dict[str, Any]:
        """What a worker needs to measure this run's trials as this process would."""
        fp = machine.fingerprint(self.runner.device)
        return {"target": self.fingerprint["target"], "device": self.runner.device.type,
                "protocol": dataclasses.asdict(self.runner.protocol), "timeout_s": getattr(self.runner, "timeout_s", 600.0),
                "seed": self.settings.seed, "machine": fp, "machine_id": machine.fingerprint_id(fp)}

    def _run(self) -> Report:
        t_start = time.time()
        deadline = t_start + self.settings.budget_s if self.settings.budget_s else None
        r = self.report
        self.events.phase("baseline")
        base_cfg = self.runner.workload.base_config()  # defaults, with the workload's world size
        ledger = self._ledger()
        ledger.set_user_attr("fingerprint", self.fingerprint)
        if SIZED in ledger.user_attrs:  # resumed: the steps this study's windows were sized to
            self.runner.protocol = dataclasses.replace(self.runner.protocol, steps=ledger.user_attrs[SIZED])
        base = self._remember("baseline", Summary, lambda: self._sized_baseline(base_cfg))
        ledger.set_user_attr(SIZED, self.runner.protocol.steps)
        r.protocol = self.runner.protocol.describe()
        if self.pool is not None:  # workers measure with the sized protocol
            self.pool.bind(self.study, self._published())
        state = self._state(base_cfg, base)
        r.baseline, r.initial_diagnosis = base, state.verdict
        r.machine.lowp_matmul = self._lowp()
        r.machine.batch_handoff_s = self._handoff()
        r.final, r.diagnosis, r.final_config = base, state.verdict, base_cfg.flat()
        self.events.phase("A/A noise")
        aa, measured = self._noise(base_cfg)
        policy = DEFAULT
        margin = noise_margin(aa.ratio, aa.pairs, policy.min_gain)
        r.noise = Noise(ratio=aa.ratio, low=aa.low, high=aa.high, pairs=aa.pairs, margin=margin,
                        min_gain=policy.min_gain, alpha=policy.alpha, floor=policy.floor, max_looks=policy.max_looks,
                        readings=[m.ratio_only() for m in measured])
        ctx = Context(self.storage, self.study, self.runner, Constraints(self.settings.memory_limit, base.first_losses),
                      self.settings.seed, margin, _band(aa, margin, base, measured), self._compare, self.events,
                      pool=self.pool, lowp=r.machine.lowp_matmul, nulls=measured, policy=policy,
                      handoff_s=r.machine.batch_handoff_s)
        ctx.note(base.config, base.samples_per_s, base.wall_s)
        for m in measured:  # each A/A's two sides: more readings of the baseline to pool
            ctx.note_pairs(base_cfg, base_cfg, m)
        try:
            state = self._rounds(ctx, state, deadline)
        finally:  # an interrupted run's report says how long it ran too, and its band
            r.budget.wall_s = time.time() - t_start
            by_spread = ctx.band > ctx.aa_band  # else the A/A's width decided (a wide A/A beats the cap)
            r.noise.band, r.noise.band_dof = ctx.band, ctx.spread_dof() if by_spread else 0
        if state.config != base_cfg:
            self.events.phase("final against baseline")
            sp = self._compare(f"final:{state.config.short()}", base_cfg, state.config, "final against baseline")
            r.speedup = one_look(ctx, sp)  # one look: its interval has the spread between sessions
        else:
            r.speedup = Ratio(ratio=1.0, low=1.0, high=1.0, pairs=0)
        r.budget.wall_s = time.time() - t_start
        r.complete = True
        return r

    def _rounds(self, ctx: Context, state: State, deadline: float | None) -> State:
        """Rounds until no recipe is worth a search or a budget is spent."""
        r, s = self.report, self.settings
        r.budget = Budget(trials_used=0, trials_run_now=0, trials_limit=s.trials, wall_s=0.0, budget_s=s.budget_s)
        attempts, by_name = Attempts(), {x.name: x for x in self.recipes}
        device, cores, batch = self.runner.device.type, machine.cores(), self.runner.workload.rank_batch

        def new(recipe: Recipe, config: TrainConfig) -> bool:
            """Whether the recipe has a value to try from `config` on this machine (not: a
            range past its cores; a revisit of a knob already at its only value)."""
            return any(v != config.get(k) for k, vs in recipe.space(device, cores, batch).items() for v in vs)

        closed: set[str] = set()  # the closing recipes played (`plan.closing_recipe`)
        while r.stop_reason is None:
            usable = [x for x in self.recipes if new(x, state.config)]
            hand = handoff.step_share(ctx.handoff_s, state.config, state.summary)  # workers' floor on its wait
            choices = rank(usable, state.verdict, device, self.facts, attempts, ctx.margin, s.only, ctx.lowp, hand,
                           ctx.trial_cost())
            reserve = 3 * (ctx.trial_cost() or 0.0)  # a trial, and the final comparison's windows
            closing = None if choices or not state.feasible else \
                closing_recipe(r.steps, state.config, by_name, ctx.margin, closed)
            if not choices and closing is None:
                why_not = handoff.why_not(ctx.handoff_s, state.summary, state.verdict, hand, ctx.margin) \
                    or inapplicable(self.recipes, state.verdict, device, self.facts, ctx.margin)
                r.leftover = leftover(state.verdict, ctx.margin, state.config, [state.summary, r.baseline], r.steps,
                                      ctx.band, ctx.handoff_s, why_not)
                r.stop_reason = stop_reason(state.verdict, ctx.margin, ctx.lowp, why_not, r.leftover)
            elif r.budget.trials_used >= s.trials:
                r.stop_reason = f"trial budget spent ({r.budget.trials_used} of {s.trials})"
            elif deadline and time.time() + reserve >= deadline:
                r.stop_reason = f"time budget spent ({s.budget_s:.0f} s; the next trial would not finish inside it)"
            if r.stop_reason is not None:
                break
            joint = joint_memory_recipe(choices)
            if closing is not None:  # every recipe was tried: the near-misses together, then undoes
                by_name[closing.name] = closing
                closed.add(closing.name)
                recipe, target, expected = closing, state.verdict.bottleneck, closing.compute_speedup
            else:
                recipe, target, expected = (joint, Bottleneck.MEMORY, math.inf) if joint else (
                    choices[0].recipe, choices[0].target, choices[0].expected)
            tried = [c.recipe for c in (choices if joint else choices[:1]) if joint is None or c.target is Bottleneck.MEMORY]
            if joint:
                by_name[joint.name] = joint
            self._lease.renew()
            ctx.live = []
            try:
                out = play(ctx, len(r.steps) + 1, recipe, target, expected, state, s.trials - r.budget.trials_used,
                           deadline - reserve if deadline else None, revisit=attempts.times(recipe.name) > 0,
                           near=attempts.near_miss(recipe, state.verdict))
            except BaseException:  # interrupted or failed mid-round: what it measured stays in the report
                self._partial(ctx, recipe, target, state)
                raise
            state = out.state
            for tried_recipe in tried:  # the shares it left: a revisit needs its waste to come back
                attempts.record(tried_recipe, state.verdict, out.step)
            r.budget.trials_used += measured(out.step.trials)
            r.budget.trials_run_now += out.ran
            r.budget.trials_skipped_for_budget += out.skipped
            r.steps.append(out.step)
            r.final, r.diagnosis, r.final_config = state.summary, state.verdict, state.config.flat()
            r.recommendations = recommendations(r.steps, by_name)
        return state

    def _partial(self, ctx: Context, recipe: Recipe, target: Bottleneck, state: State) -> None:
        """The round in progress as an undecided step, with the trials it finished."""
        trials = [trial_record(t) for s in ctx.live for t in s.finished()]
        if not trials:
            return
        r = self.report
        r.steps.append(Step(round=len(r.steps) + 1, recipe=recipe.name, bottleneck=target, trials=trials,
                            before=Brief.of(state.summary),
                            reason="the run stopped before this round could compare and decide"))
        r.budget.trials_used += measured(trials)

    def _handoff(self) -> float | None:
        """What receiving a batch from a loader worker costs here (`autotune.handoff`; the
        base config loads in the step's own process), stored with the run like `_lowp`."""
        ledger = self._ledger()
        if "batch_handoff_s" not in ledger.user_attrs:
            self.events.phase("loader hand-off probe")
            ledger.set_user_attr("batch_handoff_s", self.runner.batch_handoff())
        return ledger.user_attrs["batch_handoff_s"]

    def _lowp(self) -> dict[str, float]:
        """The low-precision probe of this machine (`autotune.probe`), stored with the run so
        a resumed run ranks its recipes as the first did."""
        ledger = self._ledger()
        if "lowp_matmul" not in ledger.user_attrs:
            self.events.phase("low-precision matmul probe")
            ledger.set_user_attr("lowp_matmul", self.runner.lowp_matmul())
        return dict(ledger.user_attrs["lowp_matmul"])

    def _sized_baseline(self, config: TrainConfig) -> Summary:
        """The baseline, measured again with longer windows where its windows were shorter than
        the protocol's `window_s`; every later measurement uses the same steps."""
        base = self._baseline(config)
        sized = self.runner.protocol.sized(base.step_time_s.mean or base.step_time_s.median)  # a window: steps x mean
        if sized == self.runner.protocol:
            return base
        self.runner.protocol = sized
        return self._baseline(config)

    def _baseline(self, config: TrainConfig) -> Summary:
        checkpoint("baseline")
        try:
            return self.runner.measure(config)
        except TrialFailed as exc:
            # The user's own traceback helps; autotune's does not (a bad input names itself).
            detail = f"\n{exc.detail}" if exc.kind in (FailureKind.USER_CODE, FailureKind.CRASH) and exc.detail else ""
            raise UserError(
                f"the baseline (default config) of workload {self.runner.workload.name!r} could not be measured: "
                f"{exc.kind.value}: {exc.reason.rstrip('.')}. Fix the workload so that `autotune profile` runs, "
                f"then tune.{detail}"
            ) from None

    def _header(self) -> Report:
        dev = self.runner.device
        return Report(
            autotune_version=__version__, workload=self.runner.workload.name, target=self.runner.target,
            batch_size=self.runner.workload.batch_size,
            device=dev.type, memory_limit_bytes=self.settings.memory_limit,
            machine=machine.describe(dev),
            protocol=self.runner.protocol.describe(),
            study=StudyRef(name=self.study, storage=self.storage_label, fingerprint=fingerprint_id(self.fingerprint),
                           note=self.study_note),
        )


def implausible_aa(aa: Comparison) -> bool:
    """Whether an A/A's identical configs read apart beyond their own interval, or by more than twice
    the least gain whatever the interval: more likely a disturbance than this machine's noise."""
    return aa.measured and (aa.low > 1.0 or aa.high < 1.0 or abs(math.log(aa.ratio)) > math.log1p(2 * MIN_GAIN))


def _band(aa: Comparison, margin: float, base: Summary, measured: list[Comparison]) -> float:
    """The band of a single reading before the run's own spread says it: the widest of the margin,
    a single A/A's interval width (the median of those measured) and `window_band` of the
    baseline's and the A/A sides' windows (at most `BAND_CAP`)."""
    windows = window_band([base.windows_samples_per_s] + [side for m in measured for side in (m.a, m.b) if side],
                          len(base.windows_samples_per_s))
    widths = [math.log(m.high / m.low) for m in measured if m.measured and m.low]
    if widths:
        aa_width = math.exp(statistics.median(widths))
    else:
        aa_width = aa.high / aa.low if aa.measured and aa.low else 1.10
    return max(margin, aa_width, min(BAND_CAP, windows))
