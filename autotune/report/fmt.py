"""Value formatters shared by every renderer: numbers, ratios, times, sizes, config changes.

Every formatter takes what a report may hold (a number, None, NaN or infinity) and returns
text; anything that is not a finite number prints as "n/a".
"""

from __future__ import annotations

import json
import math
from enum import Enum
from typing import Any

from autotune.record import Ratio
from autotune.units import format_bytes

__all__ = [
    "Code", "change_list", "fmt_bytes", "fmt_ci", "fmt_delta_bytes", "fmt_evidence", "fmt_ms", "fmt_pct_change",
    "fmt_rate", "fmt_ratio", "fmt_seconds", "fmt_speedup", "fmt_value", "number",
]


class Code(str):
    """Text shown as code: backticks in Markdown, `<code>` in HTML."""


def number(x: Any) -> float | None:
    """A finite int or float as a float; None for anything else (booleans, text, NaN, infinities)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def fmt_value(v: Any) -> str:
    """A config value as YAML would write it (`null`, `true`, `2`, `bf16`); NaN and inf as "n/a"."""
    if v is None:
        return "null"
    if isinstance(v, Enum):
        return str(v.value)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "n/a" if number(v) is None else f"{v:g}"
    return v if isinstance(v, str) else json.dumps(v, default=str)


def change_list(changes: dict[str, Any]) -> list[Code]:
    """`key: old → new` as one `Code` per changed dotted key, in the mapping's order (a value that
    is not a pair prints alone)."""
    out = []
    for key, pair in changes.items():
        if isinstance(pair, (list, tuple)) and len(pair) == 2:
            out.append(Code(f"{key}: {fmt_value(pair[0])} → {fmt_value(pair[1])}"))
        else:
            out.append(Code(f"{key}: {fmt_value(pair)}"))
    return out


def fmt_ratio(x: Any) -> str:
    """`4.13×`, or "n/a"."""
    x = number(x)
    return "n/a" if x is None else f"{x:.2f}×"


def fmt_ci(low: Any, high: Any) -> str:
    """`3.88–4.41`, or "n/a" unless both ends are finite."""
    low, high = number(low), number(high)
    return "n/a" if low is None or high is None else f"{low:.2f}–{high:.2f}"


def fmt_speedup(sp: Ratio | None) -> str:
    """`4.13× (CI 3.88–4.41, 4 pairs)`, or "not measured"."""
    if sp is None or number(sp.ratio) is None:
        return "not measured"
    return f"{fmt_ratio(sp.ratio)} (CI {fmt_ci(sp.low, sp.high)}, {sp.pairs} pairs)"


def fmt_ms(ms: Any) -> str:
    """Milliseconds with three significant figures or so (`33.5 ms`, `8.10 ms`, `250 ms`)."""
    ms = number(ms)
    if ms is None:
        return "n/a"
    return f"{ms:.0f} ms" if ms >= 100 else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


def fmt_seconds(s: Any) -> str:
    """Seconds as ms under a second, `1.12 s` under a minute, else `5 min 0 s`."""
    s = number(s)
    if s is None:
        return "n/a"
    if abs(s) < 1:
        return fmt_ms(s * 1e3)
    return f"{s:.2f} s" if s < 60 else f"{int(s // 60)} min {s % 60:.0f} s"


def fmt_rate(x: Any) -> str:
    """A throughput: `1,975` from 100 up, `47.8` below."""
    x = number(x)
    return "n/a" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def fmt_bytes(n: Any) -> str:
    """A size in B, KiB, MiB, ... or "n/a"."""
    return format_bytes(number(n))


def fmt_delta_bytes(n: Any) -> str:
    """A signed change of size (`+21.5 KiB`, `-168.0 KiB`, `no change`)."""
    n = number(n)
    if n is None:
        return "n/a"
    return "no change" if n == 0 else ("+" if n > 0 else "") + format_bytes(n)


def fmt_pct_change(base: Any, new: Any) -> str:
    """`+313%` from base to new, or "" when either is missing or base is zero."""
    base, new = number(base), number(new)
    if base is None or new is None or base == 0:
        return ""
    return f"{(new - base) / base:+.0%}"


def fmt_evidence(v: Any) -> str:
    """An evidence value: mappings as `key value, ...`, floats to four figures."""
    if isinstance(v, dict):
        return ", ".join(f"{k} {fmt_evidence(x)}" for k, x in v.items())
    if isinstance(v, float):
        return "n/a" if number(v) is None else f"{v:.4g}"
    return fmt_value(v)
