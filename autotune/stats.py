"""Paired comparison of two configs measured in turns, with a confidence interval."""

from __future__ import annotations

import math
import statistics

# Two-sided 95% Student-t quantiles by degrees of freedom (beyond 30: normal).
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
        10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 25: 2.060, 30: 2.042}


def t95(df: int) -> float:
    if df <= 0:
        return float("inf")
    keys = [k for k in sorted(_T95) if k <= df]
    return _T95[keys[-1]] if df <= 30 else 1.96


def paired_ratio(a: list[float], b: list[float]) -> dict[str, float]:
    """Throughput ratio b/a from paired windows: geometric mean and its 95% interval.

    Pairs are adjacent windows of A and B, so slow drift of the machine divides out.
    """
    logs = [math.log(y / x) for x, y in zip(a, b) if x > 0 and y > 0]
    if not logs:
        return {"ratio": float("nan"), "low": float("nan"), "high": float("nan"), "pairs": 0}
    m = statistics.fmean(logs)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("inf")
    return {"ratio": math.exp(m), "low": math.exp(m - half), "high": math.exp(m + half), "pairs": len(logs)}


def noise_margin(ratio: float | None, pairs: int, min_gain: float) -> float:
    """The ratio a change's interval must clear: what "no change" measured as (the A/A
    ratio's distance from 1, in either direction), and never less than `1 + min_gain`.

    The candidate's own interval already carries its window-to-window spread; the A/A
    ratio adds what two identical configs differ by on this machine (process placement,
    drift), which an interval from one comparison cannot see.
    """
    ok = pairs and ratio is not None and math.isfinite(ratio) and ratio > 0
    bias = abs(math.log(ratio)) if ok else 0.0
    return math.exp(max(bias, math.log1p(min_gain)))
