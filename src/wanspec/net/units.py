"""Rates and durations written the way `tc` writes them: `1mbit`, `10mbit/s`, `50ms`, `250us`;
memory sizes (`2GiB`, `512M`); and network addresses as `HOST:PORT`.

Rates use SI prefixes (1 kbit = 1000 bits), like `tc`. Byte-based spellings (`mbps`, `mb`) are
refused rather than guessed: `tc` reads `mbps` as megaBYTES per second while most people mean
megabits, and a silent factor of 8 in a link emulator is worse than an error.
"""

from __future__ import annotations

import math
import re

_RATE_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}
_TIME_UNIT = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
_NUMBER = r"(?P<num>[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)"
_RATE = re.compile(rf"{_NUMBER}\s*(?:(?P<prefix>[kmg]?)bit(?:/s)?)?", re.IGNORECASE)
_TIME = re.compile(rf"{_NUMBER}\s*(?P<unit>s|ms|us)?", re.IGNORECASE)
_UNLIMITED = {"inf", "unlimited", "none"}
_SIZE_UNIT = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_SIZE_UNIT |= {f"{p}b": _SIZE_UNIT[p] for p in "kmgt"}
_SIZE_UNIT |= {f"{p}ib": 1 << (10 * (i + 1)) for i, p in enumerate("kmgt")}
_SIZE = re.compile(rf"{_NUMBER}\s*(?P<unit>[a-z]*)", re.IGNORECASE)


def parse_rate(text: str) -> float:
    """Bits per second from `1mbit`, `2.5Mbit/s`, `800kbit`, `1e6` (bits/s) or `unlimited`."""
    spelled = text.strip()
    if spelled.lower() in _UNLIMITED:
        return math.inf
    match = _RATE.fullmatch(spelled)
    if match is None:
        raise ValueError(
            f"bad rate {text!r}: write a number with bit, kbit, mbit or gbit (optionally /s), "
            "e.g. 10mbit, or 'unlimited'"
        )
    value = float(match["num"]) * _RATE_PREFIX[(match["prefix"] or "").lower()]
    if value <= 0:
        raise ValueError(f"a rate must be > 0, got {text!r}")
    return value


def parse_duration(text: str) -> float:
    """Seconds from `50ms`, `0.05s`, `250us` or a bare number of seconds."""
    match = _TIME.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"bad duration {text!r}: write a number with s, ms or us, e.g. 50ms")
    return float(match["num"]) * _TIME_UNIT[(match["unit"] or "").lower()]


def parse_size(text: str) -> int:
    """Bytes from `2GiB`, `512MiB`, `1.5G`, `800K` or a bare number of bytes: K, M, G, T (and
    KB, MB…) are powers of 1000, KiB, MiB, GiB, TiB powers of 1024."""
    match = _SIZE.fullmatch(text.strip())
    unit = _SIZE_UNIT.get((match["unit"] if match else "").lower())
    if match is None or unit is None:
        raise ValueError(
            f"bad size {text!r}: write a number of bytes, optionally with K, M, G, KiB, MiB or "
            "GiB, e.g. 2GiB"
        )
    value = round(float(match["num"]) * unit)
    if value <= 0:
        raise ValueError(f"a size must be > 0, got {text!r}")
    return value


def parse_address(text: str) -> tuple[str, int]:
    """(host, port) from `HOST:PORT` (IPv6 in brackets: `[::1]:7070`); port 0 = any free one."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)
