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
    """The ratio a change's interval must clear: the A/A ratio's distance from 1 (either
    direction; what identical configs differ by here), never less than `1 + min_gain`."""
    ok = pairs and ratio is not None and math.isfinite(ratio) and ratio > 0
    bias = abs(math.log(ratio)) if ok else 0.0
    return math.exp(max(bias, math.log1p(min_gain)))


def look_mean(logs: list[float]) -> float:
    """One look's location: the mean of its pairs' log ratios without the lowest and highest fifth
    (one of each per five pairs; none under five), so a burst that slows one window moves it less."""
    g = len(logs) // 5
    kept = sorted(logs)[g:len(logs) - g]
    return statistics.fmean(kept)


def look_variance(logs: list[float]) -> float:
    """The variance of `look_mean` from the look's own pairs (Tukey and McLaughlin: the
    winsorized variance over (1 - 2g/n)^2 n), the floor under the spread between looks."""
    n, g = len(logs), len(logs) // 5
    s = sorted(logs)
    wins = [s[g]] * g + s[g:n - g] + [s[n - g - 1]] * g
    return statistics.variance(wins) / ((1 - 2 * g / n) ** 2 * n)


def looks_ratio(looks: list[tuple[list[float], list[float]]],
                nulls: list[tuple[list[float], list[float]]],
                others: list[list[tuple[list[float], list[float]]]] = ()) -> dict[str, float]:
    """Throughput ratio b/a over several looks (each a fresh pair of sessions, counted once by its
    `look_mean`) with a 95% Student-t interval: the variance pooled from the looks, the `nulls` (A/As,
    around 1) and each of `others` around its own mean, never below `look_variance`; `dof` says how many."""
    def logs(a: list[float], b: list[float]) -> list[float]:
        return [math.log(y / x) for x, y in zip(a, b) if x > 0 and y > 0]

    means, within, pairs = [], [], 0
    for a, b in looks:
        if len(ls := logs(a, b)) > 1:
            means.append(look_mean(ls))
            within.append(look_variance(ls))
            pairs += len(ls)
    k = len(means)
    if not k:
        return {"ratio": float("nan"), "low": float("nan"), "high": float("nan"), "pairs": 0, "looks": 0, "dof": 0}
    m = statistics.fmean(means)
    ss, dof = sum((x - m) ** 2 for x in means), k - 1
    for a, b in nulls:
        if ls := logs(a, b):
            ss, dof = ss + look_mean(ls) ** 2, dof + 1
    for group in others:
        ms = [look_mean(ls) for a, b in group if (ls := logs(a, b))]
        if len(ms) > 1:
            g = statistics.fmean(ms)
            ss, dof = ss + sum((x - g) ** 2 for x in ms), dof + len(ms) - 1
    var = max(ss / dof if dof else float("inf"), statistics.fmean(within))
    half = t95(dof) * math.sqrt(var / k)
    return {"ratio": math.exp(m), "low": math.exp(m - half), "high": math.exp(m + half), "pairs": pairs,
            "looks": k, "dof": dof}
