"""Parsing of sizes (`512MB`, `2GiB`) and durations (`90s`, `10m`, `1h30m`) given on the CLI."""

from __future__ import annotations

import re

from .errors import UserError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_size(text: str, flag: str = "--memory-limit") -> int:
    """Bytes from `512MB`, `2GiB`, `1.5G` or a plain number of bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_UNITS or float(m.group(1)) <= 0:
        raise UserError(
            f"{flag} {text!r} is not a size: write a positive number with a unit, "
            "like 512MB, 2GiB or 1.5G (KB/MB/GB are powers of 1000, KiB/MiB/GiB and K/M/G of 1024)."
        )
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def parse_duration(text: str, flag: str = "--budget") -> float:
    """Seconds from `90`, `90s`, `10m`, `1h30m`."""
    s = str(text).strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        value = float(s)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([smh])", s)
        if not parts or "".join(a + b for a, b in parts) != s:
            value = -1.0
        else:
            value = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    if value <= 0:
        raise UserError(
            f"{flag} {text!r} is not a duration: write seconds or a number with s/m/h, like 90s, 10m or 1h30m."
        )
    return value


def format_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    return f"{sign}{n:.1f} TiB"
