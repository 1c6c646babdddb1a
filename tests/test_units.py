"""Sizes and durations given on the command line."""

from __future__ import annotations

import pytest

from autotune.errors import UserError
from autotune.units import format_bytes, parse_duration, parse_size


@pytest.mark.parametrize("text,expected", [
    ("512MB", 512 * 10**6),
    ("2GiB", 2 * 2**30),
    ("1.5G", int(1.5 * 2**30)),
    ("64MiB", 64 * 2**20),
    ("1kb", 1000),
    ("1KiB", 1024),
    ("1K", 1024),
    ("4096", 4096),
    ("100B", 100),
    (" 3 GB ", 3 * 10**9),
    ("1TiB", 2**40),
])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "MB", "-5MB", "0", "0GB", "12XB", "1.2.3G", "5 M B", "1e9"])
def test_parse_size_rejects_garbage(text):
    with pytest.raises(UserError) as info:
        parse_size(text)
    msg = str(info.value)
    assert "--memory-limit" in msg and repr(text) in msg and "512MB" in msg


def test_parse_size_names_the_flag():
    with pytest.raises(UserError, match="--cap"):
        parse_size("huge", flag="--cap")


@pytest.mark.parametrize("text,expected", [
    ("90s", 90.0),
    ("10m", 600.0),
    ("1h30m", 5400.0),
    ("1h", 3600.0),
    ("2m30s", 150.0),
    ("90", 90.0),
    ("1.5h", 5400.0),
    (" 10M ", 600.0),
])
def test_parse_duration(text, expected):
    assert parse_duration(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "soon", "10x", "m10", "1h 30m", "-5s", "0s", "0", "10mm", "h"])
def test_parse_duration_rejects_garbage(text):
    with pytest.raises(UserError) as info:
        parse_duration(text)
    msg = str(info.value)
    assert "--budget" in msg and "90s" in msg


def test_format_bytes():
    assert format_bytes(None) == "n/a"
    assert format_bytes(512) == "512 B"
    assert format_bytes(2 * 2**20) == "2.0 MiB"
    assert format_bytes(-3 * 2**30) == "-3.0 GiB"
