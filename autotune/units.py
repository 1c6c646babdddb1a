"""Parsing of sizes (`512MB`, `2GiB`) and durations (`90s`, `10m`, `1h30m`) given on the CLI.

Both are parsed exactly (no float rounding), refused when not positive, and capped: a size
must be a whole number of bytes up to `MAX_SIZE`, a duration at most `MAX_DURATION_S`.
"""

from __future__ import annotations

import re
from fractions import Fraction

from .errors import UserError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600}
_NUMBER = r"[0-9]+(?:\.[0-9]+)?"  # ASCII digits only (`\d` would take any script's digits)
_MAX_DIGITS = 30  # before or after the point: more is a typo, and Python's int() refuses thousands
MAX_SIZE = 2**50  # 1 PiB: no accelerator or host comes near it
MAX_DURATION_S = 30 * 24 * 3600  # 30 days: longer is a typo, and timers overflow somewhere past it
_SIZE_HINT = ("write a positive number with a unit, like 512MB, 2GiB or 1.5G "
              "(KB/MB/GB are powers of 1000, KiB/MiB/GiB and K/M/G of 1024)")
_DURATION_HINT = "write seconds or a number with s/m/h, like 90s, 10m or 1h30m"


def _shown(text: object) -> str:
    """The user's text for a message, cut so a 400-digit value does not flood the terminal."""
    s = str(text)
    return repr(s if len(s) <= 40 else s[:37] + "...")


def _exact(number: str, flag: str, text: object, what: str, hint: str) -> Fraction:
    """The exact value of a plain decimal, refused past `_MAX_DIGITS` digits either side of the point."""
    whole, _, frac = number.partition(".")
    if len(whole.lstrip("0")) > _MAX_DIGITS:
        raise UserError(f"{flag} {_shown(text)} is more than autotune accepts ({what}); {hint}.")
    if len(frac) > _MAX_DIGITS:
        raise UserError(f"{flag} {_shown(text)} has more than {_MAX_DIGITS} decimals; {hint}.")
    return Fraction(number)


def parse_size(text: str, flag: str = "--memory-limit") -> int:
    """Bytes from `512MB`, `2GiB`, `1.5G` or a plain number of bytes; a whole number of bytes."""
    m = re.fullmatch(rf"\s*({_NUMBER})\s*([a-zA-Z]{{0,3}})\s*", str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise UserError(f"{flag} {_shown(text)} is not a size: {_SIZE_HINT}.")
    value = _exact(m.group(1), flag, text, "at most 1024TiB", _SIZE_HINT) * _SIZE_UNITS[unit]
    if value <= 0:
        raise UserError(f"{flag} {_shown(text)} is not a size: it must be more than zero bytes; {_SIZE_HINT}.")
    if value.denominator != 1:
        raise UserError(
            f"{flag} {_shown(text)} is {float(value):g} bytes, not a whole number of bytes; "
            f"{_SIZE_HINT}, that comes to whole bytes."
        )
    if value > MAX_SIZE:
        raise UserError(
            f"{flag} {_shown(text)} is more than autotune accepts (at most 1024TiB); "
            f"give the memory the device really has, {_SIZE_HINT}."
        )
    return int(value)


def parse_duration(text: str, flag: str = "--budget") -> float:
    """Seconds from `90`, `90s`, `10m`, `1h30m`; positive and at most `MAX_DURATION_S`."""
    s = str(text).strip().lower()
    if re.fullmatch(_NUMBER, s):
        value = _exact(s, flag, text, "at most 720h", _DURATION_HINT)
    else:
        parts = re.findall(rf"({_NUMBER})([smh])", s)
        if not parts or "".join(a + b for a, b in parts) != s:
            value = Fraction(-1)
        else:
            value = sum((_exact(n, flag, text, "at most 720h", _DURATION_HINT) * _DURATION_UNITS[u] for n, u in parts),
                        Fraction(0))
    if value <= 0:
        raise UserError(f"{flag} {_shown(text)} is not a duration: {_DURATION_HINT}; it must be more than zero.")
    if value > MAX_DURATION_S:
        raise UserError(
            f"{flag} {_shown(text)} is longer than autotune accepts (at most 720h, 30 days); "
            f"give a shorter duration: {_DURATION_HINT}."
        )
    return float(value)


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
