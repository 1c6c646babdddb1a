"""Anytime curves: the best throughput a method has found after n trials and after t seconds.

Each method's trials are a trace in the order they ran: the config, its throughput (0 when
infeasible) and the wall time when it finished. The curve is the running best over the
trace. All curves of an example are read in one unit, the stored grid's figure of a config:
blind TPE and random search look every trial up in the stored grid (their wall time is the
stored measurements' wall time); autotune runs for real, and each of its trials counts at
the stored grid's figure of its config when the grid holds it, else at its own measurement
(`own` counts those). Curves are drawn as a compact table (`table_lines`) and as an SVG
(`svg`), each point as a fraction of the stored grid's best.
"""

from __future__ import annotations

from typing import Any

from benchmarks.grids import key

CHECKPOINTS = (1, 2, 4, 8, 12, 16, 24, 32)
COLOURS = {"autotune": "#d62728", "blind_tpe": "#1f77b4", "random": "#2ca02c"}
LABELS = {"autotune": "autotune", "blind_tpe": "blind TPE", "random": "random search"}


def in_grid_units(trace: list[dict[str, Any]], stored: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
    """The trace with each trial's figure replaced by the stored grid's figure of its config
    where the grid holds it; and how many kept their own measurement."""
    rows = {key(r["config"]): r for r in stored["rows"]}
    out, own = [], 0
    for t in trace:
        row = rows.get(key(t["config"])) if t.get("config") else None
        if row is None:
            own += 1
        out.append({**t, "samples_per_s": row["samples_per_s"] if row else t["samples_per_s"],
                    "in_grid": row is not None})
    return out, own


def curve(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The running best: one point per trial, {trial, wall_s, best}."""
    best, out = 0.0, []
    for i, t in enumerate(trace, 1):
        best = max(best, t["samples_per_s"] or 0.0)
        out.append({"trial": i, "wall_s": t["wall_s"], "best": best})
    return out


def best_after(points: list[dict[str, Any]], trials: int | None = None, wall_s: float | None = None) -> float | None:
    """The best found within `trials` trials or `wall_s` seconds; None before the first."""
    ok = [p for p in points if (trials is None or p["trial"] <= trials) and (wall_s is None or p["wall_s"] <= wall_s)]
    return ok[-1]["best"] if ok else None


def reach(points: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first trial (and its wall time) at which the best found reaches `target`."""
    p = next((p for p in points if p["best"] >= target), None)
    return None if p is None else {"trial": p["trial"], "wall_s": p["wall_s"]}


def curves(traces: dict[str, list[dict[str, Any]]], stored: dict[str, Any], fraction: float) -> dict[str, Any]:
    """Every method's curve in the stored grid's units, with when it reached `fraction` of
    the stored grid's best."""
    grid_best = max((r["samples_per_s"] for r in stored["rows"]), default=0.0)
    out: dict[str, Any] = {"grid_best_samples_per_s": grid_best, "grid_trials": len(stored["rows"]),
                           "grid_wall_s": sum(r["wall_s"] for r in stored["rows"]), "methods": {}}
    for m, trace in traces.items():
        units, own = in_grid_units(trace, stored)
        pts = curve(units)
        out["methods"][m] = {"points": pts, "own_measurements": own,
                             "reached": reach(pts, fraction * grid_best) if grid_best else None}
    return out


def table_lines(cases: list[dict[str, Any]], fraction: float) -> list[str]:
    """Per example and method: best found (fraction of the stored grid's best) after n
    trials, and the trial and wall time at which it reached `fraction`."""
    cols = [n for n in CHECKPOINTS if any(c["anytime"]["grid_trials"] >= n for c in cases)]
    lines = ["| example | method | " + " | ".join(f"{n} trial{'s' * (n > 1)}" for n in cols)
             + f" | all | reached {fraction:.2f} at (trial, s) |",
             "|---|---|" + "---:|" * (len(cols) + 2)]
    for c in cases:
        a = c["anytime"]
        gb = a["grid_best_samples_per_s"] or 1.0
        for m, d in a["methods"].items():
            pts = d["points"]
            cells = []
            for n in cols:
                v = best_after(pts, trials=n) if pts and n <= pts[-1]["trial"] else None
                cells.append("" if v is None else f"{v / gb:.2f}")
            last = f"{pts[-1]['best'] / gb:.2f} ({pts[-1]['trial']})" if pts else "n/a"
            r = d["reached"]
            at = "not reached" if not r else f"{r['trial']}, {r['wall_s']:.0f} s"
            own = f" ({d['own_measurements']} own)" if d["own_measurements"] else ""
            lines.append(f"| {c['name']} | {LABELS.get(m, m)}{own} | " + " | ".join(cells) + f" | {last} | {at} |")
    return lines


def _path(pts: list[tuple[float, float]]) -> str:
    """A step line through the points (the best found holds until the next improvement)."""
    d, prev = [], None
    for x, y in pts:
        if prev is None:
            d.append(f"M{x:.1f},{y:.1f}")
        else:
            d.append(f"H{x:.1f}V{y:.1f}")
        prev = (x, y)
    return " ".join(d)


def svg(cases: list[dict[str, Any]]) -> str:
    """Small multiples: one row per example, best found (fraction of the stored grid's best)
    against trials (left) and against wall time (right, log scale)."""
    import math

    w, h, pad, row_h = 300, 120, 40, 160
    width, height = 2 * (w + 2 * pad) + 20, 40 + row_h * len(cases) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11">', f'<rect width="{width}" height="{height}" fill="white"/>',
           '<text x="10" y="18" font-size="13">Best found, as a fraction of the stored grid\'s best: against trials '
           '(left) and wall time (right, log)</text>']
    for i, (m, colour) in enumerate(COLOURS.items()):
        out.append(f'<rect x="{10 + 130 * i}" y="26" width="12" height="3" fill="{colour}"/>'
                   f'<text x="{26 + 130 * i}" y="31">{LABELS[m]}</text>')
    for r, c in enumerate(cases):
        a = c["anytime"]
        gb = a["grid_best_samples_per_s"] or 1.0
        top = 50 + r * row_h
        n_max = max([a["grid_trials"] // 4] + [d["points"][-1]["trial"] for d in a["methods"].values() if d["points"]])
        t_all = [p["wall_s"] for d in a["methods"].values() for p in d["points"] if p["wall_s"] > 0]
        t_lo, t_hi = (min(t_all), max(t_all)) if t_all else (1.0, 10.0)
        t_lo, t_hi = max(0.1, t_lo), max(t_hi, t_lo * 10)
        for panel in (0, 1):
            x0 = pad + panel * (w + 2 * pad + 20)
            out.append(f'<rect x="{x0}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#999"/>')
            title = f"{c['name']}: vs trials (grid {a['grid_trials']})" if panel == 0 else "vs wall time (s)"
            out.append(f'<text x="{x0}" y="{top - 4}">{title}</text>')
            for frac in (0.0, 0.5, 0.95, 1.0):
                y = top + h - min(frac, 1.1) / 1.1 * h
                out.append(f'<line x1="{x0}" x2="{x0 + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>'
                           f'<text x="{x0 - 30}" y="{y + 4:.1f}">{frac:g}</text>')
            if panel == 0 and a["grid_trials"] >= 8:  # the target: a quarter of the grid's trials
                xq = x0 + (a["grid_trials"] / 4 - 1) / max(1, n_max - 1) * w
                out.append(f'<line x1="{xq:.1f}" x2="{xq:.1f}" y1="{top}" y2="{top + h}" stroke="#999" '
                           f'stroke-dasharray="3,3"/><text x="{xq + 2:.1f}" y="{top + 12}" fill="#666">1/4 grid</text>')
            lo = "1" if panel == 0 else f"{t_lo:.1f}"
            hi = str(n_max) if panel == 0 else f"{t_hi:.0f}"
            out.append(f'<text x="{x0}" y="{top + h + 13}">{lo}</text>'
                       f'<text x="{x0 + w - 20}" y="{top + h + 13}">{hi}</text>')
            for m, d in a["methods"].items():
                pts = []
                for p in d["points"]:
                    if panel == 0:
                        x = x0 + (p["trial"] - 1) / max(1, n_max - 1) * w
                    else:
                        x = x0 + (math.log(max(p["wall_s"], t_lo)) - math.log(t_lo)) / (math.log(t_hi) - math.log(t_lo)) * w
                    pts.append((min(x, x0 + w), top + h - min(p["best"] / gb, 1.1) / 1.1 * h))
                if pts:
                    out.append(f'<path d="{_path(pts)}" fill="none" stroke="{COLOURS.get(m, "#000")}" '
                               f'stroke-width="1.5"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
