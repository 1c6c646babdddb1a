"""One recipe's Optuna study: the incumbent enqueued first, then the recipe's knobs.

Every trial is measured under the run's protocol (by the `Runner`) and stored with its
summary as a user attribute, so an interrupted run resumes without re-measuring, and
`autotune report` can rebuild everything from storage. Infeasible trials (over the memory
limit, out of memory, crashed, hung, loss diverged) are pruned with their reason and are
never chosen.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import optuna

from . import machine
from .config import TrainConfig
from .errors import ConfigError, TrialCut, TrialFailed
from .faults import checkpoint
from .record import FailureKind, Summary, Trial, TrialState
from .runner import TrialRunner

# A trial's mean loss over the first measured steps may differ from the baseline's by at
# most this fraction (AMP and compilation change rounding, not the trajectory).
LOSS_TOLERANCE = 0.25
# Spaces with at most this many points are walked in order (`walk`), as far as the round
# takes them; a larger one is searched by TPE (a joint search measures each knob alone first).
GRID_LIMIT = 12


def normalized(config: TrainConfig, changes: dict[str, Any]) -> TrainConfig:
    """The config with `changes`, dropping settings that mean nothing in the result
    (prefetch depth or persistent workers without workers) instead of failing on them,
    and naming DataLoader's own default prefetch depth when workers have none set."""
    flat = {**config.flat(), **changes}
    if not flat["data.num_workers"]:
        flat["data.prefetch_factor"], flat["data.persistent_workers"] = None, False
    elif flat["data.prefetch_factor"] is None:
        flat["data.prefetch_factor"] = 2  # what DataLoader does with workers: one config, not two
    return TrainConfig().with_changes(flat)


def loss_diverged(losses: list[float], reference: list[float]) -> str | None:
    if any(not math.isfinite(x) for x in losses):
        return "loss is not finite (NaN or inf)"
    n = min(len(losses), len(reference))
    if n == 0:
        return None
    a, b = sum(losses[:n]) / n, sum(reference[:n]) / n
    if abs(a - b) > LOSS_TOLERANCE * max(abs(b), 1e-8):
        return f"mean loss over the first {n} steps is {a:.4g}, baseline {b:.4g} (tolerance {LOSS_TOLERANCE:.0%})"
    return None


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna's INFO lines off while autotune searches (failures are recorded, not logged),
    and the caller's own verbosity back afterwards."""
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


def fits(summary: Summary, memory_limit: int | None) -> bool:
    """Whether a measurement stayed within the memory limit (an unmeasured peak fits)."""
    peak = summary.peak_memory_bytes
    return not (memory_limit and peak is not None and peak > memory_limit)


SLOW_CUT = 3.0  # a trial none of whose windows reaches 1/SLOW_CUT of a fitting incumbent's estimate is stopped


@dataclass
class Constraints:
    memory_limit: int | None
    reference_losses: list[float]
    # samples/s a trial must show in some window to be measured to the end (`Runner.measure`):
    # a round sets it to a fraction of a config that fits (`SLOW_CUT`); none: every window.
    floor: float | None = None

    def check(self, summary: Summary) -> str | None:
        if not fits(summary, self.memory_limit):
            return f"peak memory {summary.peak_memory_bytes} B exceeds the limit {self.memory_limit} B"
        return loss_diverged(summary.first_losses, self.reference_losses)


def stored_summary(t: optuna.trial.FrozenTrial) -> Summary | None:
    """The summary a trial stored in its user attributes, if it was measured."""
    raw = t.user_attrs.get("summary")
    return Summary.model_validate(raw) if raw is not None else None


def reading(t: optuna.trial.FrozenTrial) -> float | None:
    """A trial's samples/s: measured to the end, or as far as a slow one was (`TrialState.SLOW`)."""
    if t.state == optuna.trial.TrialState.COMPLETE:
        return t.value
    return t.user_attrs.get("samples_per_s") if t.user_attrs.get("state") == TrialState.SLOW.value else None


def trial_record(t: optuna.trial.FrozenTrial) -> Trial:
    complete = t.state == optuna.trial.TrialState.COMPLETE
    summary = stored_summary(t)
    return Trial(
        number=t.number,
        changes=t.user_attrs.get("changes", {}),
        samples_per_s=reading(t),
        state=TrialState(t.user_attrs.get("state", TrialState.OK if complete else TrialState.FAILED)),
        reason=t.user_attrs.get("reason"),
        peak_memory_bytes=summary.peak_memory_bytes if summary else None,
        config=t.user_attrs.get("config"),
        worker=t.user_attrs.get("worker"),
        reused_from=str(t.user_attrs["reused_from"]) if "reused_from" in t.user_attrs else None,
    )


def identity(config: TrainConfig) -> str:
    """A config's identity: two that mean the same (a prefetch depth without workers,
    DataLoader's default depth named or not) are one."""
    return repr(sorted(normalized(config, {}).flat().items()))


def best_of(searches: list[RecipeSearch]) -> optuna.trial.FrozenTrial | None:
    """The fastest feasible trial of several searches (a round's stages), if any."""
    return max((b for b in (s.best() for s in searches) if b is not None), key=lambda t: t.value, default=None)


def walk(space: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every point of a small space, in the order an engineer would try them: the incumbent
    (each knob's first value), then one knob changed at a time, then two, ...; within each,
    the recipe file's order, whose first choices are its most promising."""
    combos = itertools.product(*(range(len(v)) for v in space.values()))
    ordered = sorted(combos, key=lambda idx: (sum(1 for i in idx if i), idx))
    return [{k: space[k][i] for k, i in zip(space, idx)} for idx in ordered]


def _distinct(base: TrainConfig, points: list[dict[str, Any]], skip: dict[str, Any] | None) -> list[dict[str, Any]]:
    """`points` without those that make the same config as an earlier one (prefetch depth
    without workers, DataLoader's default depth named), or as `skip`; an invalid
    combination stays (its trial says why)."""
    seen, out = set(), []
    for p in ([skip] if skip is not None else []) + points:
        try:
            key = identity(normalized(base, p))
        except ConfigError:
            key = repr(sorted(p.items()))
        if key not in seen:
            seen.add(key)
            if p is not skip:
                out.append(p)
    return out


# A config's identity -> where an earlier round of the run measured it ("study#trial") and that trial.
Earlier = dict[str, tuple[str, optuna.trial.FrozenTrial]]
REUSABLE = (TrialState.OK.value, TrialState.INFEASIBLE.value, TrialState.SLOW.value)  # not: a crash, a cut-off


def remember(earlier: Earlier, study: str, trials: list[optuna.trial.FrozenTrial]) -> None:
    """Note `trials` (measured in `study`) for later rounds to reuse: each config's first
    full reading, or the state that ruled it out (over the memory limit, far too slow)."""
    for t in trials:
        if "reused_from" in t.user_attrs or t.user_attrs.get("state") not in REUSABLE or not t.user_attrs.get("config"):
            continue
        earlier.setdefault(identity(TrainConfig().with_changes(t.user_attrs["config"])), (_trial_ref(study, t), t))


def _trial_ref(study: str, t: optuna.trial.FrozenTrial) -> str:
    """Where a trial was measured, as a reused trial names it: "study#trial"."""
    return f"{study}#{t.number}"


def _reuse(trial: optuna.Trial, t: optuna.trial.FrozenTrial, where: str) -> float | None:
    """`trial` takes `t`'s reading (or the state that ruled it out) instead of a measurement."""
    for k in ("state", "reason", "summary", "samples_per_s"):
        if k in t.user_attrs:
            trial.set_user_attr(k, t.user_attrs[k])
    trial.set_user_attr("reused_from", where)
    if t.state == optuna.trial.TrialState.PRUNED:
        raise optuna.TrialPruned()
    return t.value


class RecipeSearch:
    """Search one recipe's space from the incumbent; `run` returns the stored study.

    With a `pool` (`autotune.pool.Dispatcher`), trials are enqueued for `autotune worker`
    processes instead of measured here; a worker rebuilds the search from what the study
    stores (`attach`) and measures each trial it claims with the same objective.
    """

    KEY = "search"  # the study user attribute a worker rebuilds the search from

    def __init__(self, storage, name: str, space: dict[str, list[Any]], incumbent: TrainConfig,
                 runner: TrialRunner, constraints: Constraints, seed: int, each_knob_first: bool = False,
                 pool: Any = None, sampler: optuna.samplers.BaseSampler | None = None,
                 incumbent_known: bool = False, changes_from: TrainConfig | None = None,
                 earlier: Earlier | None = None) -> None:
        canonical = normalized(incumbent, {})  # a value that means the same as a choice is that choice
        self.earlier = earlier  # the run's earlier rounds' trials: a config they measured is not measured again
        self.space = {k: list(dict.fromkeys([canonical.get(k), *v])) for k, v in space.items()}
        self.incumbent, self.runner, self.constraints, self.pool = canonical, runner, constraints, pool
        # What a trial's `changes` are shown against: the round's config, when this search
        # starts elsewhere (a stage of a ladder, a grown range).
        self.changes_from = normalized(changes_from, {}) if changes_from is not None else canonical
        # With `incumbent_known` the run already holds readings of the incumbent (pooled by
        # the caller), so it is not measured again: `grid` counts the configs left to try.
        self.walked = math.prod(len(v) for v in self.space.values()) <= GRID_LIMIT
        first = {k: canonical.get(k) for k in self.space}
        points = [] if incumbent_known else [first]
        if self.walked:
            points += [p for p in walk(self.space) if p != first]
        elif each_knob_first:  # one knob at a time (what each does alone), then TPE over the combinations
            points += [{**first, k: v} for k, vs in self.space.items() for v in vs if v != first[k]]
        self.points = _distinct(canonical, points, skip=first if incumbent_known else None)
        self.grid = len(self.points) if self.walked else \
            math.prod(len(v) for v in self.space.values()) - (1 if incumbent_known else 0)
        self.skipped = 0
        self.until: float | None = None  # a trial measured here stops at this time (`run`'s deadline)
        self.me = machine.worker_ref(runner.device)
        # A small space is walked in order (the incumbent first unless known, then one knob
        # changed at a time, ...); a larger one is searched by TPE from the incumbent.
        with quiet_optuna():
            self.study = optuna.create_study(
                study_name=name, storage=storage, direction="maximize", load_if_exists=True,
                sampler=sampler or optuna.samplers.TPESampler(seed=seed, n_startup_trials=4))
        if sampler is not None:
            return  # attached by a worker: the coordinator enqueues
        self.study.set_user_attr(self.KEY, {"space": self.space, "incumbent": incumbent.flat(), "seed": seed,
                                            "memory_limit": constraints.memory_limit, "floor": constraints.floor,
                                            "reference_losses": constraints.reference_losses,
                                            "incumbent_known": incumbent_known,
                                            "changes_from": self.changes_from.flat()})
        if pool is None:  # measured here, one after the other: the whole queue at once
            for p in self.unqueued(running=False):  # a running trial here was cut off with its run
                self.study.enqueue_trial(p)

    @classmethod
    def attach(cls, storage, name: str, runner: TrialRunner, sampler: optuna.samplers.BaseSampler) -> RecipeSearch:
        """The search a coordinator stored under `name`, to measure its trials with `runner`."""
        stored = optuna.load_study(study_name=name, storage=storage).user_attrs[cls.KEY]
        incumbent = TrainConfig().with_changes(stored["incumbent"])
        return cls(storage, name, stored["space"], incumbent, runner,
                   Constraints(stored["memory_limit"], stored["reference_losses"], stored.get("floor")), stored["seed"], sampler=sampler,
                   incumbent_known=stored.get("incumbent_known", False),
                   changes_from=TrainConfig().with_changes(stored["changes_from"]) if "changes_from" in stored else None)

    def unqueued(self, running: bool = True) -> list[dict[str, Any]]:
        """The planned points not measured, queued or (with `running`) being measured yet;
        after an interrupted run, what is not measured yet."""
        pending = (optuna.trial.TrialState.WAITING,) + ((optuna.trial.TrialState.RUNNING,) if running else ())
        # A waiting trial's values are its fixed params until it runs.
        have = [t.params for t in self.finished()] + [
            t.system_attrs.get("fixed_params", t.params) for t in self.study.get_trials(states=pending)]
        return [p for p in self.points if p not in have]

    def finished(self) -> list[optuna.trial.FrozenTrial]:
        done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        return [t for t in self.study.trials if t.state in done]

    def objective(self, trial: optuna.Trial) -> float:
        params = {k: trial.suggest_categorical(k, v) for k, v in self.space.items()}
        try:
            config = normalized(self.incumbent, params)
        except ConfigError as exc:
            trial.set_user_attr("state", TrialState.INFEASIBLE.value)
            trial.set_user_attr("reason", "invalid combination: " + "; ".join(exc.errors))
            raise optuna.TrialPruned() from None
        trial.set_user_attr("config", config.flat())
        trial.set_user_attr("changes", self.changes_from.diff(config))
        trial.set_user_attr("worker", self.me.model_dump(mode="json"))
        for t in self.finished():  # the same config again (normalisation, TPE repeats): reuse it
            if t.user_attrs.get("config") == config.flat() and t.number != trial.number:
                return _reuse(trial, t, _trial_ref(self.study.study_name, t))
        before = (self.earlier or {}).get(identity(config))
        if before is not None:  # an earlier round measured it (a stage's single knob, a round's only config)
            return _reuse(trial, before[1], before[0])
        checkpoint("trial")
        try:
            summary = self.runner.measure(config, floor=self.constraints.floor, until=self.until)
        except TrialCut as cut:  # far slower than a config that fits, or out of time: not a candidate
            if cut.floor is None:
                trial.set_user_attr("state", TrialState.FAILED.value)
                trial.set_user_attr("reason", f"{cut}: not a full measurement, not a candidate")
                raise optuna.TrialPruned() from None
            trial.set_user_attr("state", TrialState.SLOW.value)
            trial.set_user_attr("samples_per_s", statistics.fmean(cut.windows))
            trial.set_user_attr("reason", f"{cut} (1/{SLOW_CUT:g} of the current config's estimate): not measured "
                                          "further")
            raise optuna.TrialPruned() from None
        except TrialFailed as exc:
            state = TrialState.INFEASIBLE if exc.kind is FailureKind.OOM else TrialState.FAILED  # killed: failed
            trial.set_user_attr("state", state.value)
            trial.set_user_attr("reason", f"{exc.kind.value}: {exc.reason}")
            raise optuna.TrialPruned() from None
        trial.set_user_attr("summary", summary.model_dump(mode="json"))
        problem = self.constraints.check(summary)
        if problem:
            trial.set_user_attr("state", TrialState.INFEASIBLE.value)
            trial.set_user_attr("reason", problem)
            raise optuna.TrialPruned()
        trial.set_user_attr("state", TrialState.OK.value)
        return summary.samples_per_s

    def run(self, n_trials: int, deadline: float | None, on_trial: Callable | None = None,
            cost_s: float | None = None) -> int:
        """Run until `n_trials` are finished (resumed ones count); returns how many ran now.

        A trial that cannot finish before `deadline` (estimated to take `cost_s`, or as long
        as the longest of this search's own trials: a compile round's trials cost alike, and
        far more than the run's earlier ones) is not started; `skipped` counts them."""
        if self.pool is not None:
            return self.pool.run(self, n_trials, deadline, on_trial, cost_s)
        ran, self.skipped, self.until = 0, 0, deadline
        while len(self.finished()) < min(n_trials, self.grid):
            own = [s.wall_s for s in map(stored_summary, self.finished()) if s is not None and s.wall_s]
            cost = max([cost_s or 0.0, *own])
            if deadline is not None and time.time() + cost >= deadline:
                self.skipped = min(n_trials, self.grid) - len(self.finished())
                break
            done: list[optuna.trial.FrozenTrial] = []
            with quiet_optuna():
                self.study.optimize(self.objective, n_trials=1, catch=(), callbacks=[lambda _, t: done.append(t)])
            ran += 0 if done and "reused_from" in done[-1].user_attrs else 1  # a reused reading ran nothing
            if on_trial and done:
                on_trial(done[-1])
        return ran

    def best(self) -> optuna.trial.FrozenTrial | None:
        ok = self.ranked()
        return ok[0] if ok else None

    def comparable(self, t: optuna.trial.FrozenTrial) -> bool:
        """Measured on a machine like this one (same fingerprint): only such trials compete."""
        who = t.user_attrs.get("worker")
        return who is None or who.get("machine") == self.me.machine

    def ranked(self) -> list[optuna.trial.FrozenTrial]:
        """Feasible trials, fastest first, one per config (the first measured of repeats)."""
        seen, out = set(), []
        ok = [t for t in self.study.trials if t.state == optuna.trial.TrialState.COMPLETE and self.comparable(t)]
        for t in sorted(ok, key=lambda t: t.number):  # the first reading, not the luckiest of repeats
            key = identity(TrainConfig().with_changes(t.user_attrs.get("config") or {}))
            if key not in seen:
                seen.add(key)
                out.append(t)
        return sorted(out, key=lambda t: (-t.value, t.number))
