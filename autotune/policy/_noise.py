"""The noise model: a look's log ratio = the change's effect + a session offset + heavy-tailed window noise."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from ..stats import look_mean, look_variance
from ._tdist import t_cdf, t_ppf


@dataclass(frozen=True, slots=True)
class Look:
    """One side-by-side comparison from a fresh pair of sessions: windows of A and B taken in turns."""

    a: tuple[float, ...]
    b: tuple[float, ...]

    @classmethod
    def of(cls, a: Sequence[float], b: Sequence[float]) -> Look:
        return cls(tuple(a), tuple(b))

    def logs(self) -> list[float]:
        return [math.log(y / x) for x, y in zip(self.a, self.b) if x > 0 and y > 0]

    def usable(self) -> bool:
        return len(self.logs()) > 1

    def mean(self) -> float:
        """The look's trimmed mean log ratio (a burst that slows one window moves it little)."""
        return look_mean(self.logs())

    def within(self) -> float:
        """The variance of `mean` from the look's own pairs: the window noise alone."""
        return look_variance(self.logs())


@dataclass(frozen=True, slots=True)
class Posterior:
    """The change's log gain: Student's t with location `mean`, `scale` and `dof` (flat prior)."""

    mean: float
    scale: float
    dof: int
    looks: int

    def p_above(self, ratio: float) -> float:
        """P(gain > ratio)."""
        if not math.isfinite(self.scale) or self.dof <= 0:
            return 0.5
        if self.scale == 0:
            return 1.0 if self.mean > math.log(ratio) else 0.0
        return 1.0 - t_cdf((math.log(ratio) - self.mean) / self.scale, self.dof)

    def interval(self, level: float = 0.95) -> tuple[float, float]:
        """The central interval of the gain holding `level` of the posterior."""
        if not math.isfinite(self.scale) or self.dof <= 0:
            return 0.0, math.inf
        half = t_ppf(0.5 + level / 2, self.dof) * self.scale
        return math.exp(self.mean - half), math.exp(self.mean + half)

    @property
    def ratio(self) -> float:
        return math.exp(self.mean)


@dataclass(frozen=True, slots=True)
class NoiseModel:
    """Scales of the noise, pooled over this run's reference looks (A/As and other candidates' repeats).

    A look's variance is `ss / dof` (the spread between looks: sessions and windows together), never below
    what a look's own pairs say; `within` is the window part alone.
    """

    ss: float = 0.0
    dof: int = 0
    within: float = 0.0

    @classmethod
    def fit(cls, nulls: Sequence[Look], groups: Sequence[Sequence[Look]] = ()) -> NoiseModel:
        """From A/As (`nulls`, true ratio 1: deviations from 0) and repeated looks at one change each
        (`groups`: deviations from their own mean)."""
        ss, dof, within = 0.0, 0, []
        for look in (n for n in nulls if n.usable()):
            ss, dof = ss + look.mean() ** 2, dof + 1
            within.append(look.within())
        for group in groups:
            means = [g.mean() for g in group if g.usable()]
            if len(means) > 1:
                m = statistics.fmean(means)
                ss, dof = ss + sum((x - m) ** 2 for x in means), dof + len(means) - 1
            within += [g.within() for g in group if g.usable()]
        return cls(ss, dof, statistics.fmean(within) if within else 0.0)

    def look_variance(self) -> float:
        """The variance of one look's mean log ratio (infinite before anything is known)."""
        return max(self.ss / self.dof, self.within) if self.dof else math.inf

    @property
    def session(self) -> float:
        """The variance between sessions beyond the windows' own (0 when the windows explain it all)."""
        return max(self.look_variance() - self.within, 0.0) if self.dof else math.nan

    def posterior(self, looks: Sequence[Look]) -> Posterior:
        """The change's log gain after `looks` at it, each counted once, their spread pooled with the model's."""
        used = [look for look in looks if look.usable()]
        if not used:
            return Posterior(0.0, math.inf, 0, 0)
        means = [look.mean() for look in used]
        m = statistics.fmean(means)
        ss = self.ss + sum((x - m) ** 2 for x in means)
        dof = self.dof + len(means) - 1
        within = statistics.fmean([self.within, *(look.within() for look in used)] if self.dof else
                                  [look.within() for look in used])
        var = max(ss / dof, within) if dof else math.inf
        return Posterior(m, math.sqrt(var / len(means)), dof, len(means))
