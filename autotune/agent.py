"""The tuning loop: baseline, A/A noise, diagnose, search the cheapest matching recipe,
accept only what clears the noise in an interleaved re-measurement, repeat.

Decisions live in Optuna storage beside the trials (study user attributes), so re-running
the same command resumes: nothing finished is measured again. The agent fills one typed
`Report` as it goes, so an interrupted run still holds everything measured so far.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

import optuna
from pydantic import BaseModel

from .version import __version__
from . import machine
from .config import TrainConfig
from .diagnose import ADVICE, acceptable, diagnose
from .errors import TrialFailed, UserError
from .events import Listener, Silent
from .recipes import Recipe, matching
from .record import (
    Brief, Budget, Comparison, Noise, Ratio, Recommendation, Report, Step, StudyRef, Summary, Verdict,
)
from .runner import TrialRunner
from .search import Constraints, RecipeSearch, quiet_optuna, stored_summary, trial_record
from .stats import noise_margin, paired_ratio

MIN_GAIN = 0.03  # a change must gain at least 3%, whatever the noise says

M = TypeVar("M", bound=BaseModel)


@dataclass
class Settings:
    trials: int = 40
    budget_s: float | None = None
    memory_limit: int | None = None
    seed: int = 0
    only: tuple[str, ...] = ()


@dataclass
class State:
    config: TrainConfig
    summary: Summary
    verdict: Verdict
    feasible: bool


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
    report: Report = field(init=False)

    def __post_init__(self) -> None:
        self.report = self._header()

    # --- stored decisions --------------------------------------------------------------
    def _ledger(self) -> optuna.Study:
        return optuna.create_study(study_name=self.study, storage=self.storage, load_if_exists=True)

    def _remember(self, key: str, model: type[M], compute: Callable[[], M]) -> M:
        ledger = self._ledger()
        if key in ledger.user_attrs:
            return model.model_validate(ledger.user_attrs[key])
        value = compute()
        ledger.set_user_attr(key, value.model_dump(mode="json"))
        return value

    def _compare(self, key: str, a: TrainConfig, b: TrainConfig, what: str) -> Comparison:
        """B over A from windows taken in turns; `failed` says why when one could not run."""

        def run() -> Comparison:
            self.events.phase(f"comparing {what}")
            try:
                xs, ys = self.runner.interleave(a, b, self.runner.protocol.windows)
            except TrialFailed as exc:
                return Comparison(ratio=None, low=None, high=None, pairs=0, failed=f"{exc.kind.value}: {exc.reason}")
            return Comparison(**paired_ratio(xs, ys), a=xs, b=ys)

        return self._remember(key, Comparison, run)

    # --- the loop ------------------------------------------------------------------------
    def _feasible(self, summary: Summary) -> bool:
        lim = self.settings.memory_limit
        return not (lim and (summary.peak_memory_bytes or 0) > lim)

    def _state(self, config: TrainConfig, summary: Summary) -> State:
        v = diagnose(summary, self.runner.device.type, self.settings.memory_limit)
        return State(config, summary, v, self._feasible(summary))

    def run(self) -> Report:
        with quiet_optuna():
            return self._run()

    def _run(self) -> Report:
        t_start = time.time()
        deadline = t_start + self.settings.budget_s if self.settings.budget_s else None
        r = self.report
        self.events.phase("baseline")
        base_cfg = TrainConfig()
        base = self._remember("baseline", Summary, lambda: self._baseline(base_cfg))
        state = self._state(base_cfg, base)
        r.baseline, r.initial_diagnosis = base, state.verdict
        r.final, r.diagnosis, r.final_config = base, state.verdict, base_cfg.flat()
        self.events.phase("A/A noise")
        aa = self._compare("noise", base_cfg, base_cfg, "baseline against itself")
        if aa.failed:
            raise UserError(f"the baseline could not be measured twice side by side ({aa.failed}).")
        margin = noise_margin(aa.ratio, aa.pairs, MIN_GAIN)
        r.noise = Noise(ratio=aa.ratio, low=aa.low, high=aa.high, pairs=aa.pairs, margin=margin, min_gain=MIN_GAIN)
        used, ran_now, tried, round_no = 0, 0, set(), 0
        by_name = {x.name: x for x in self.recipes}
        while r.stop_reason is None:
            todo = [x for x in matching(self.recipes, state.verdict.bottleneck, self.runner.device.type, self.facts)
                    if x.name not in tried and (not self.settings.only or x.name in self.settings.only)]
            if not todo:
                r.stop_reason = self._why_stop(state)
            elif used >= self.settings.trials:
                r.stop_reason = f"trial budget spent ({used} of {self.settings.trials})"
            elif deadline and time.time() >= deadline:
                r.stop_reason = f"time budget spent ({self.settings.budget_s:.0f} s)"
            if r.stop_reason is not None:
                break
            recipe = todo[0]
            tried.add(recipe.name)
            round_no += 1
            step, state, ran = self._try(round_no, recipe, state, base, margin, self.settings.trials - used, deadline)
            used += len(step.trials)
            ran_now += ran
            r.steps.append(step)
            r.final, r.diagnosis, r.final_config = state.summary, state.verdict, state.config.flat()
            r.recommendations = recommendations(r.steps, by_name)
        if state.config != base_cfg:
            self.events.phase("final against baseline")
            sp = self._compare(f"final:{state.config.short()}", base_cfg, state.config, "final against baseline")
            r.speedup = sp.ratio_only()
        else:
            r.speedup = Ratio(ratio=1.0, low=1.0, high=1.0, pairs=0)
        r.budget = Budget(trials_used=used, trials_run_now=ran_now, trials_limit=self.settings.trials,
                          wall_s=time.time() - t_start, budget_s=self.settings.budget_s)
        return r

    def _baseline(self, config: TrainConfig) -> Summary:
        try:
            return self.runner.measure(config)
        except TrialFailed as exc:
            raise UserError(
                f"the baseline (default config) of workload {self.runner.workload.name!r} could not be measured: "
                f"{exc.kind.value}: {exc.reason}. Fix the workload so that `autotune profile` runs, then tune.\n{exc.detail}"
            ) from None

    def _why_stop(self, state: State) -> str:
        v = state.verdict
        if acceptable(v):
            return f"the slowest stage is acceptable: the step is compute-bound ({v.reason}) and every matching recipe was tried"
        advice = ADVICE.get(v.bottleneck)
        return f"no recipe left for the {v.bottleneck.value} bottleneck ({v.reason})" + (f"; in your code: {advice}" if advice else "")

    def _try(self, round_no: int, recipe: Recipe, state: State, base: Summary, margin: float,
             trials_left: int, deadline: float | None) -> tuple[Step, State, int]:
        dev = self.runner.device.type
        space = recipe.space(dev, machine.cores(), self.runner.workload.batch_size)
        name = f"{self.study}/{round_no:02d}-{recipe.name}"
        search = RecipeSearch(self.storage, name, space, state.config, self.runner,
                              Constraints(self.settings.memory_limit, base.first_losses), self.settings.seed)
        n = min(recipe.trials, trials_left)  # finished trials of a resumed study count
        self.events.recipe(round_no, recipe.name, min(n, search.grid))
        ran = search.run(n, deadline, on_trial=lambda t: self.events.trial(trial_record(t)))
        step = Step(round=round_no, recipe=recipe.name, bottleneck=state.verdict.bottleneck,
                    trials=[trial_record(t) for t in search.finished()], before=Brief.of(state.summary))
        best = search.best()
        if best is None or best.user_attrs.get("config") == state.config.flat():
            step.reason = ("every trial was infeasible or failed" if best is None
                           else "no trial beat the current config in the search")
            if best is not None and state.feasible is False:
                step.reason = "the current config is over the memory limit and no trial fit"
            return step, state, ran
        cand = TrainConfig().with_changes(best.user_attrs["config"])
        cand_summary = stored_summary(best)
        assert cand_summary is not None, "a complete trial always stores its summary"
        step.changes = state.config.diff(cand)
        step.after, step.after_config = Brief.of(cand_summary), cand.flat()
        sp = self._compare(f"{name}:accept", state.config, cand, f"{recipe.name} against current")
        self._decide(step, sp, state, cand_summary, margin, best.value)
        self.events.decision(recipe.name, step.accepted, step.reason or "")
        if step.accepted:
            state = self._state(cand, cand_summary)
        return step, state, ran

    def _decide(self, step: Step, sp: Comparison, state: State, cand: Summary, margin: float, estimate: float) -> None:
        """Accept or reject the candidate on its interleaved comparison, with the reason."""
        if not state.feasible:
            # The incumbent does not fit: any feasible config is progress, and the fastest wins.
            ratio = f"; throughput ratio {sp.ratio:.2f}x [{sp.low:.2f}, {sp.high:.2f}]" if sp.measured else ""
            step.accepted, step.speedup = True, sp.ratio_only() if sp.measured else None
            step.reason = f"fits the memory limit (peak {cand.peak_memory_bytes} B, limit {self.settings.memory_limit} B){ratio}"
        elif sp.failed:
            step.reason = f"the interleaved re-measurement failed: {sp.failed}"
        elif not sp.measured:
            step.reason = f"the interleaved re-measurement gave too few usable pairs ({sp.pairs}) for an interval"
        else:
            step.speedup = sp.ratio_only()
            if sp.low > margin:
                step.accepted = True
                step.reason = f"{sp.ratio:.2f}x, interval [{sp.low:.2f}, {sp.high:.2f}] clears the noise margin {margin:.3f}"
            else:
                step.reason = (f"measured {sp.ratio:.2f}x, interval [{sp.low:.2f}, {sp.high:.2f}] does not clear "
                               f"the noise margin {margin:.3f} (search estimate was {estimate / state.summary.samples_per_s:.2f}x)")

    def _header(self) -> Report:
        dev = self.runner.device
        return Report(
            autotune_version=__version__, workload=self.runner.workload.name, target=self.runner.target,
            device=dev.type, memory_limit_bytes=self.settings.memory_limit,
            machine=machine.describe(dev),
            protocol=self.runner.protocol.describe(),
            study=StudyRef(name=self.study, storage=self.storage_label),
        )


def recommendations(steps: list[Step], recipes: dict[str, Recipe]) -> list[Recommendation]:
    """One per recipe tried that produced a candidate, ranked: accepted by gain, then rejected."""
    out = []
    for st in steps:
        sp = st.speedup
        rec = Recommendation(recipe=st.recipe, changes=st.changes, speedup=sp.ratio if sp else None,
                             ci=[sp.low, sp.high] if sp else [None, None], accepted=st.accepted,
                             reason=None if st.accepted else st.reason)
        before, after = st.before, st.after
        if after:
            if after.peak_memory_bytes is not None and before.peak_memory_bytes is not None:
                rec.memory_delta_bytes = after.peak_memory_bytes - before.peak_memory_bytes
            extra = after.one_time_s - before.one_time_s
            rec.one_time_s = extra
            saved = (before.step_time_s or 0) - (after.step_time_s or 0)
            rec.payoff_steps = (0 if extra <= 0 else int(extra / saved) + 1) if saved > 0 else None
        recipe = recipes.get(st.recipe)
        if recipe and recipe.snippet and st.changes:
            rec.snippet = render_snippet(recipe.snippet, st.after_config or {})
        out.append(rec)
    return sorted(out, key=lambda x: (not x.accepted, -(x.speedup or 0)))


def render_snippet(template: str, config: dict[str, Any]) -> str:
    """The recipe's snippet with `{dotted.key}` filled from the config it recommends."""
    text = template
    for key, value in config.items():
        text = text.replace("{" + key + "}", str(value))
    return text

