"""What side-by-side looks show: each look counted once, the spread between looks pooled with
the run's A/As and other candidates' looks, and whether the looks show a gain (`shown`), still
promise one (`promising`) or could show it within reach (`nearly`).
"""

from __future__ import annotations

import math


from .context import Context
from .record import Comparison, Ratio
from .stats import looks_ratio, paired_ratio

__all__ = ["REACH", "fresh_and_all", "joined", "nearly", "one_look", "pooled", "promising", "reach", "shown", "spread"]

REACH = 40  # most looks an unshown gain may need at its spread (`reach`) for more to be taken past decide.FRESH_LOOKS


def promising(ctx: Context, first: Comparison, alone: dict, every: dict) -> bool:
    """Whether another fresh look is worth taking: the fresh looks' ratio clears the margin, or all
    the looks' ratio does while the fresh looks read above 1 and their interval reaches past the
    first look's ratio (or, after one fresh look, the first look's own interval cleared the margin)."""
    if alone["ratio"] > ctx.margin:
        return True
    lead = looks_ratio([(first.a, first.b)], [], [])["ratio"]
    tie = alone["looks"] == 1 and first.low > ctx.margin
    return every["ratio"] > ctx.margin and alone["ratio"] > 1.0 and (tie or alone["high"] > lead)




def fresh_and_all(ctx: Context, first: Comparison, looks: list[Comparison]) -> tuple[dict, dict]:
    """The fresh looks alone, and all the looks with the first, each look counted once
    (`stats.looks_ratio`), their spread pooled with the run's A/As and other candidates' looks."""
    nulls, others = spread(ctx, looks)
    alone = looks_ratio([(c.a, c.b) for c in looks], nulls, others)
    every = looks_ratio([(c.a, c.b) for c in [first, *looks]], nulls, others)
    return alone, every




def shown(ctx: Context, alone: dict, every: dict) -> bool:
    """Whether the fresh looks alone, and all the looks, each clear the least gain (`fresh_and_all`;
    the callers have ruled out a failed look)."""
    bar = 1 + ctx.min_gain
    return bool(alone["looks"]) and alone["low"] > bar and every["low"] > bar




def nearly(ctx: Context, alone: dict, every: dict) -> bool:
    """Whether a candidate not shown in `decide.FRESH_LOOKS` fresh looks earns more, up to
    `decide.LAST_LOOKS`: all its looks read past the least gain, the fresh looks above 1, and the
    looks `reach` says the gain would need stay within `REACH`."""
    return every["ratio"] > 1 + ctx.min_gain and alone["ratio"] > 1.0 and reach(ctx, every) <= REACH




def reach(ctx: Context, r: dict) -> float:
    """How many looks an interval as wide per look as `r`'s would take to clear the least gain
    around `r`'s ratio (the width narrows as one over the root of the looks)."""
    gap = math.log(r["ratio"]) - math.log1p(ctx.min_gain)
    half = math.log(r["high"]) - math.log(r["ratio"])
    return r["looks"] * (half / gap) ** 2 if gap > 0 else math.inf


def joined(looks: list[Comparison]) -> Comparison:
    """The looks' pairs as one comparison (the first failure, when one failed)."""
    out = looks[0]
    for more in looks[1:]:
        out = pooled(out, more)
    return out


def spread(ctx: Context, looks: list[Comparison] | None = None) -> tuple[list, list]:
    """What the spread between looks is pooled from: every A/A, and every candidate's fresh
    looks but `looks` (the candidate being judged), as `stats.looks_ratio` takes them."""
    nulls = [(n.a, n.b) for n in ctx.nulls if n.measured]
    others = [[(c.a, c.b) for c in group] for group in ctx.looked if group is not looks]
    return nulls, others


def one_look(ctx: Context, comparison: Comparison) -> Ratio:
    """One comparison's ratio with the interval a single look has here: the spread between
    fresh pairs of sessions (the A/As' and the run's candidates' looks), not only its own
    pairs' (the final comparison with the baseline is one look)."""
    if not comparison.measured:
        return comparison.ratio_only()
    r = looks_ratio([(comparison.a, comparison.b)], *spread(ctx))
    return Ratio(ratio=r["ratio"], low=r["low"], high=r["high"], pairs=r["pairs"]) if r["looks"] else \
        comparison.ratio_only()


def pooled(first: Comparison, again: Comparison) -> Comparison:
    """Both comparisons' pairs as one; the second's failure when it failed."""
    if again.failed or not again.measured:
        return again
    a, b = first.a + again.a, first.b + again.b
    return Comparison(**paired_ratio(a, b), a=a, b=b)
