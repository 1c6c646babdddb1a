"""Side-by-side looks as evidence: joined into one comparison, and the run's A/As and other
candidates' looks that the spread between looks is pooled from.
"""

from __future__ import annotations

from .context import Context
from .record import Comparison, Ratio
from .stats import looks_ratio, paired_ratio

__all__ = ["joined", "one_look", "pooled", "spread"]


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
