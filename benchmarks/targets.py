"""The suite's targets, each reported with the measured figure, never asserted.

Per example: autotune reaches >= 0.95 of the grid's best (the best of the grid's top few,
re-measured side by side with every method's choice; counted on the point estimate and on
its interval's lower bound) with <= 1/4 of the grid's windows and of its seconds (every
window autotune measured: baseline, A/As, trials, comparisons, duels); never ends below
the default; beats the rule of thumb wherever the rule is wrong here; on
the I/O example at least the rule of thumb's throughput; under a memory limit it ends
within the limit (and the grid's best is the fastest config that fits).
"""

from __future__ import annotations

from typing import Any

TARGET_ORACLE = 0.95
TARGET_SHARE = 0.25  # of the grid's windows and of its wall time
TIME_LIMIT_S = 30 * 60


def above(r: dict[str, Any]) -> bool:
    """B is better than A: the paired interval is above 1, or only B is feasible."""
    return bool(r.get("only_b_feasible")) or (r["low"] is not None and r["low"] > 1.0)


def not_below(r: dict[str, Any]) -> bool:
    """B is not significantly worse than A: the interval reaches 1, or only B is feasible."""
    return bool(r.get("only_b_feasible")) or (r["high"] is not None and r["high"] >= 1.0)


def _fmt(x: float | None, d: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{d}f}"


def brief(x: Any) -> str:
    if isinstance(x, dict) and x.get("only_b_feasible"):
        return "only autotune's config fits"
    if isinstance(x, dict):
        return f"{_fmt(x.get('ratio'))} [{_fmt(x.get('low'))}, {_fmt(x.get('high'))}]"
    return _fmt(x) if isinstance(x, float) else str(x)


def case_targets(res: dict[str, Any]) -> dict[str, Any]:
    m, cmp = res["methods"], res["comparisons"]
    at, grid = m["autotune"], res["grid_summary"]
    r = at["ratio_to_oracle"]
    out: dict[str, Any] = {}
    out["oracle"] = {"target": f">= {TARGET_ORACLE} of the grid's best (re-measured side by side; point estimate)",
                     "measured": r["ratio"], "interval": [r.get("low"), r.get("high")],
                     "met": r["ratio"] is not None and r["ratio"] >= TARGET_ORACLE}
    out["oracle_lower"] = {"target": f">= {TARGET_ORACLE} of the grid's best on the 95% interval's lower bound",
                           "measured": r.get("low"),
                           "met": r.get("low") is not None and r["low"] >= TARGET_ORACLE}
    limit = TARGET_SHARE * grid["windows"]
    out["windows"] = {"target": f"<= {TARGET_SHARE:.0%} of the grid's {grid['windows']} windows ({limit:g})",
                      "measured": at["windows"], "trials": at["trials"], "grid_trials": grid["trials"],
                      "met": at["windows"] is not None and at["windows"] <= limit}
    share = at["wall_s"] / grid["wall_s"] if grid["wall_s"] else None
    out["wall"] = {"target": f"<= {TARGET_SHARE:.0%} of the grid's wall time ({grid['wall_s']:.0f} s)",
                   "measured": share, "met": share is not None and share <= TARGET_SHARE}
    b = cmp["autotune_vs_blind"]
    out["not_below_blind"] = {"target": "autotune >= blind TPE (95% interval of the ratio reaches 1 or above)",
                              "measured": b, "met": not_below(b)}
    out["better_than_blind"] = {"target": "autotune > blind TPE (interval above 1)", "measured": b, "met": above(b)}
    rnd = cmp["autotune_vs_random"]
    out["not_below_random"] = {"target": "autotune >= random search (interval reaches 1 or above)",
                               "measured": rnd, "met": not_below(rnd)}
    d = cmp["autotune_vs_default"]
    out["not_below_default"] = {"target": "autotune never below the default (interval reaches 1 or above)",
                                "measured": d, "met": not_below(d)}
    rv, ar = cmp["rule_vs_oracle"], cmp["autotune_vs_rule"]
    wrong = not not_below(rv)
    out["beats_rule_where_wrong"] = {
        "target": "where the rule of thumb is wrong for this machine (significantly below the grid's best, or over "
                  "the memory limit), autotune beats it", "rule_wrong": wrong, "rule_vs_oracle": rv, "measured": ar,
        "met": above(ar) if wrong else None}
    out["at_least_rule"] = {"target": "autotune reaches at least the rule of thumb's throughput (interval reaches 1)",
                            "measured": ar, "met": not_below(ar) if res.get("rule_floor") else None}
    limit_b = res.get("memory_limit_bytes")
    out["within_limit"] = {"target": "autotune's config fits the memory limit", "measured": at.get("peak_memory_bytes"),
                           "met": at["feasible"] if limit_b else None}
    return out


def suite_targets(cases: list[dict[str, Any]], placebo: dict[str, Any] | None, total_s: float, quick: bool) -> dict[str, Any]:
    def all_met(key: str) -> dict[str, Any]:
        rows = {c["name"]: c["targets"][key] for c in cases if c["targets"][key]["met"] is not None}
        missed = [f"{n} ({brief(t['measured'])})" for n, t in rows.items() if not t["met"]]
        return {"met": not missed, "examples": len(rows), "missed": missed}

    better = [c["name"] for c in cases if c["targets"]["better_than_blind"]["met"]]
    planted = [c for c in cases if c["diagnosis"]["planted"]]
    out = {k: all_met(k2) for k, k2 in (
        ("oracle_every_example", "oracle"), ("oracle_lower_every_example", "oracle_lower"),
        ("windows_quarter_every_example", "windows"),
        ("wall_quarter_every_example", "wall"), ("not_below_blind_every_example", "not_below_blind"),
        ("not_below_random_every_example", "not_below_random"), ("not_below_default_every_example", "not_below_default"),
        ("beats_rule_where_wrong", "beats_rule_where_wrong"), ("at_least_rule_on_io", "at_least_rule"),
        ("within_memory_limit", "within_limit"))}
    out["better_than_blind_on_half"] = {"met": 2 * len(better) >= len(cases), "better_on": better,
                                        "examples": len(cases)}
    out["diagnosis"] = {"correct": sum(bool(c["diagnosis"]["correct"]) for c in planted), "examples": len(planted),
                        "wrong": [f"{c['name']} (planted {c['diagnosis']['planted']}, diagnosed "
                                  f"{c['diagnosis']['diagnosed']})" for c in planted if not c["diagnosis"]["correct"]]}
    if placebo is not None:
        out["no_false_acceptances"] = {"met": placebo["met"], "accepted": placebo["accepted"],
                                       "decided": placebo["decided"], "rate": placebo["rate"],
                                       "interval": placebo["interval"], "runs": len(placebo["runs"])}
    out["total_minutes"] = {"met": None, "measured_s": total_s}
    return out
