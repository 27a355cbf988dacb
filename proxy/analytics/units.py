"""Byte sizes, rates and durations: parsing what operators type (``500GiB``, ``1h``) and printing what they read.

Kafka's throttles are set in bytes per second, so every rate here is B/s; the human form adds a binary-prefixed
figure (MiB/s) because that is what ``kafka-configs`` users usually reason in.
"""

from __future__ import annotations

import math
import re

__all__ = ["fmt_bytes", "fmt_duration", "fmt_rate", "parse_bytes", "parse_duration"]

_SIZE_SUFFIXES = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}
_DURATION_SUFFIXES = {"": 1, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_NUMBER = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def _parse(text: str, suffixes: dict[str, int], what: str) -> float:
    m = _NUMBER.match(text)
    if m is None or m.group(2).lower() not in suffixes:
        known = ", ".join(s for s in suffixes if s)
        raise ValueError(f"not a {what}: {text!r} (a number with an optional suffix: {known})")
    return float(m.group(1)) * suffixes[m.group(2).lower()]


def parse_bytes(text: str) -> int:
    """``"500GiB"`` -> 536870912000; decimal (k, M, G, T) and binary (Ki, Mi, Gi, Ti) prefixes, case-insensitive."""
    return int(_parse(text, _SIZE_SUFFIXES, "byte size"))


def parse_duration(text: str) -> float:
    """``"90m"`` -> 5400.0 seconds; suffixes s, m/min, h, d; a bare number is seconds."""
    return _parse(text, _DURATION_SUFFIXES, "duration")


def fmt_bytes(n: float) -> str:
    """Binary prefixes, three significant figures: ``1536`` -> ``"1.50 KiB"``."""
    if not math.isfinite(n):
        return str(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_rate(bps: float) -> str:
    """``"12582912 B/s (12.0 MiB/s)"``: the exact figure a throttle is configured with, and a readable one."""
    return f"{bps:,.0f} B/s ({fmt_bytes(bps)}/s)"


def fmt_duration(seconds: float) -> str:
    """``5400`` -> ``"1 h 30 min"``; infinite -> ``"never"``."""
    if not math.isfinite(seconds) or seconds < 0:
        return "never"
    if seconds < 60:
        return f"{seconds:.3g} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{seconds / 86400:.3g} days"
