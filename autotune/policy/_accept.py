"""The acceptance rule: keep, drop, or look again, from P(gain > 1 + min_gain) under the noise model."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Sequence

from ._noise import Look, NoiseModel, Posterior
from ._tdist import t_cdf, t_ppf
from ._policy import DEFAULT, Policy


class Verdict(enum.Enum):
    KEEP = "keep"
    DROP = "drop"
    LOOK = "look"


@dataclass(frozen=True, slots=True)
class Decision:
    """A verdict with the numbers behind it: the posterior and P(gain > bar)."""

    verdict: Verdict
    posterior: Posterior
    p_gain: float
    bar: float
    why: str

    def text(self) -> str:
        low, high = self.posterior.interval()
        return (f"{self.posterior.ratio:.2f}x [{low:.2f}, {high:.2f}] over {self.posterior.looks} look(s): "
                f"P(gain > {self.bar:.3f}) = {self.p_gain:.2f}; {self.why}")


def reachable(post: Posterior, policy: Policy) -> float:
    """The predictive probability that `max_looks` looks in all would keep the change: the looks to come
    drawn from the posterior's own uncertainty, not only from its current estimate."""
    k, total = post.looks, policy.max_looks
    if k >= total:
        return 0.0
    var = post.scale ** 2 * k  # one look's variance
    dof = post.dof + total - k
    need = math.log1p(policy.min_gain) + t_ppf(1 - policy.alpha, dof) * math.sqrt(var / total)
    spread = math.sqrt(var * (total - k) / (total * k))
    return 1.0 - t_cdf((need - post.mean) / spread, post.dof)


def judge(looks: Sequence[Look], model: NoiseModel, policy: Policy = DEFAULT) -> Decision:
    """Keep when P(gain > 1 + min_gain) >= 1 - alpha; drop when it is below `floor`, when `max_looks` are
    spent, or when `max_looks` looks would keep it with a probability below `floor`; else look again."""
    bar = 1 + policy.min_gain
    post = model.posterior(looks)
    p = post.p_above(bar)
    if p >= 1 - policy.alpha:
        return Decision(Verdict.KEEP, post, p, bar, f"kept (>= {1 - policy.alpha:g})")
    if p < policy.floor:
        return Decision(Verdict.DROP, post, p, bar, f"dropped (< {policy.floor:g})")
    if post.looks >= policy.max_looks:
        return Decision(Verdict.DROP, post, p, bar, f"dropped: {policy.max_looks} looks did not show it")
    if math.isfinite(post.scale) and reachable(post, policy) < policy.floor:
        return Decision(Verdict.DROP, post, p, bar, f"dropped: {policy.max_looks} looks in all would "
                        f"show it with a chance under {policy.floor:g}")
    return Decision(Verdict.LOOK, post, p, bar, "not settled: another look")
