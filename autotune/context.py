"""What every round of a run shares: the incumbent's state, where trials go, how configs
are measured and compared, the noise, and every reading of every config so far (pooled
into one estimate per config, so no single lucky reading decides).
"""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

import optuna

from .config import TrainConfig
from .events import Listener
from .record import Comparison, Summary, Verdict
from .runner import TrialRunner
from .search import Constraints, identity

__all__ = ["Context", "State", "changes_text", "digest", "key"]


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
    band: float  # a single reading within this factor of the incumbent's is "within noise"
    compare: Callable[[str, TrainConfig, TrainConfig, str], Comparison]
    events: Listener
    readings: dict[str, list[float]] = field(default_factory=dict)  # config key -> every single reading
    walls: list[float] = field(default_factory=list)  # wall time of every measurement (for budgets)
    pool: Any = None  # an `autotune.pool.Dispatcher` when workers measure the trials
    live: list = field(default_factory=list)  # the round in progress' searches (an interrupted run reports them)

    def note(self, config: dict[str, Any], value: float | None, wall: float | None = None) -> None:
        if value is not None:
            self.readings.setdefault(key(config), []).append(value)
        if wall:
            self.walls.append(wall)

    def note_pairs(self, a: TrainConfig, b: TrainConfig, sp: Comparison) -> None:
        """A side-by-side comparison's windows as one reading of each config."""
        if sp.measured and sp.a and sp.b:
            self.note(a.flat(), statistics.fmean(sp.a))
            self.note(b.flat(), statistics.fmean(sp.b))

    def estimate(self, config: TrainConfig) -> float | None:
        values = self.readings.get(key(config.flat()))
        return statistics.fmean(values) if values else None

    def trial_cost(self) -> float | None:
        return statistics.median(self.walls[-8:]) if self.walls else None


def key(config: dict[str, Any]) -> str:
    """A config's meaning (defaults and normalisation applied): readings of one key pool."""
    return identity(TrainConfig().with_changes(config))


def changes_text(t: optuna.trial.FrozenTrial) -> str:
    """A trial's changes (against its round's config) for a reason text."""
    return ", ".join(f"{k}={v}" for k, v in (t.user_attrs.get("changes") or {}).items()) or "unchanged"


def digest(config: dict[str, Any]) -> str:
    """A short stable name for a config, for study and decision keys."""
    return hashlib.sha256(key(config).encode()).hexdigest()[:8]
