"""What every round of a run shares (`Context`): the incumbent's state, where trials go, how
configs are measured and compared, the noise band of a single reading, and every reading of
every config so far, pooled into one estimate per config.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import optuna

from .config import TrainConfig
from .events import Listener
from .policy import DEFAULT, Policy
from .record import BAND_CAP, Comparison, Summary, Verdict
from .runner import TrialRunner
from .search import Constraints, Earlier, identity

__all__ = ["BAND_CAP", "Context", "State", "changes_text", "digest", "key", "window_band"]

SPREAD_Z = 2.0  # two single readings apart beyond z standard deviations of their difference: not noise
SPREAD_DOF = 3  # fewest degrees of freedom (readings beyond the first of each config) to trust the spread


@dataclass
class State:
    config: TrainConfig
    summary: Summary
    verdict: Verdict
    feasible: bool


@dataclass
class Context:
    """What every round shares: where trials go, how to measure and compare, the noise."""

    storage: Any
    study: str
    runner: TrialRunner
    constraints: Constraints
    seed: int
    margin: float
    aa_band: float  # the A/A's paired interval width and the baseline's windows' (never below the margin): the floor
    compare: Callable[[str, TrainConfig, TrainConfig, str], Comparison]
    events: Listener
    readings: dict[str, list[float]] = field(default_factory=dict)  # config key -> every single reading
    walls: list[float] = field(default_factory=list)  # wall time of every measurement (for budgets)
    pool: Any = None  # an `autotune.pool.Dispatcher` when workers measure the trials
    live: list = field(default_factory=list)  # the round in progress' searches (an interrupted run reports them)
    lowp: dict[str, float] = field(default_factory=dict)  # the low-precision probe (`autotune.probe`)
    nulls: list[Comparison] = field(default_factory=list)  # every A/A: the spread between fresh pairs of sessions
    looked: list[list[Comparison]] = field(default_factory=list)  # each candidate's fresh looks, for the same spread
    policy: Policy = DEFAULT  # when a change is kept, dropped or looked at again (`autotune.policy`)
    earlier: Earlier = field(default_factory=dict)  # every config the run's rounds measured, for later rounds
    handoff_s: float | None = None  # receiving one batch from a loader worker (`autotune.handoff`)

    @property
    def min_gain(self) -> float:
        """The least gain worth keeping, whatever the noise (the policy's)."""
        return self.policy.min_gain

    def note(self, config: dict[str, Any], value: float | None, wall: float | None = None) -> None:
        if value is not None:
            self.readings.setdefault(key(config), []).append(value)
        if wall:
            self.walls.append(wall)

    def note_pairs(self, a: TrainConfig, b: TrainConfig, sp: Comparison) -> None:
        """A side-by-side comparison's windows as one reading of each config (an A/A's as
        one: its sides were taken together, so they are one occasion, not two)."""
        if not (sp.measured and sp.a and sp.b):
            return
        if key(a.flat()) == key(b.flat()):
            self.note(a.flat(), statistics.fmean(sp.a + sp.b))
            return
        self.note(a.flat(), statistics.fmean(sp.a))
        self.note(b.flat(), statistics.fmean(sp.b))

    def spread(self) -> float | None:
        """The standard deviation of one reading's log around its config's mean, pooled
        over every config read more than once; None until `SPREAD_DOF` readings say it."""
        ss, dof = self._squares()
        return math.sqrt(ss / dof) if dof >= SPREAD_DOF else None

    def spread_dof(self) -> int:
        return self._squares()[1]

    def _squares(self) -> tuple[float, int]:
        return log_squares(self.readings.values())

    @property
    def band(self) -> float:
        """A single reading within this factor of another config's (or of a pooled
        estimate) is "within noise": `SPREAD_Z` deviations of the difference of two
        readings, never below the A/A's band, never above `BAND_CAP` unless the A/A is."""
        s = self.spread()
        if s is None:
            return self.aa_band
        return max(self.aa_band, min(BAND_CAP, math.exp(SPREAD_Z * s * math.sqrt(2))))

    def estimate(self, config: TrainConfig) -> float | None:
        values = self.readings.get(key(config.flat()))
        return statistics.fmean(values) if values else None

    def trial_cost(self) -> float | None:
        return statistics.median(self.walls[-8:]) if self.walls else None


def log_squares(groups: Iterable[list[float]]) -> tuple[float, int]:
    """The squares of each value's log around its group's mean, summed over the groups of
    more than one, and their degrees of freedom: a spread pooled within groups."""
    ss, dof = 0.0, 0
    for values in groups:
        logs = [math.log(v) for v in values if v > 0]
        if len(logs) > 1:
            mean = statistics.fmean(logs)
            ss += sum((x - mean) ** 2 for x in logs)
            dof += len(logs) - 1
    return ss, dof


def window_band(groups: list[list[float]], per_reading: int) -> float:
    """The least band two single readings of `per_reading` windows each need, from the
    windows' own spread: `SPREAD_Z` standard errors of the difference of two such means,
    the log-spread pooled within each group (a reading's windows; an A/A side's). 1.0
    when no group has two windows."""
    ss, dof = log_squares(groups)
    if not dof or per_reading < 1:
        return 1.0
    return math.exp(SPREAD_Z * math.sqrt(ss / dof / per_reading) * math.sqrt(2))


def key(config: dict[str, Any]) -> str:
    """A config's meaning (defaults and normalisation applied): readings of one key pool."""
    return identity(TrainConfig().with_changes(config))


def changes_text(t: optuna.trial.FrozenTrial) -> str:
    """A trial's changes (against its round's config) for a reason text."""
    return ", ".join(f"{k}={v}" for k, v in (t.user_attrs.get("changes") or {}).items()) or "unchanged"


def digest(config: dict[str, Any]) -> str:
    """A short stable name for a config, for study and decision keys."""
    return hashlib.sha256(key(config).encode()).hexdigest()[:8]
