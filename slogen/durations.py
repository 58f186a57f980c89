"""Prometheus duration strings <-> integer milliseconds.

Durations are kept as integer milliseconds so that window arithmetic is exact and the
strings we print are the ones Prometheus (and Sloth, through prometheus/common) print:
`24h` prints as `1d`, `168h` as `1w`, `30d` stays `30d` (weeks only when exact).
"""

from __future__ import annotations

import re

MS = 1
SECOND = 1000 * MS
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR
WEEK = 7 * DAY
YEAR = 365 * DAY

_UNITS = (("y", YEAR), ("w", WEEK), ("d", DAY), ("h", HOUR), ("m", MINUTE), ("s", SECOND), ("ms", MS))
_DURATION_RE = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")


def parse_duration(text: str) -> int:
    """Milliseconds in a Prometheus duration such as `30d`, `1h30m`, `500ms`; ValueError otherwise."""
    text = str(text).strip()
    m = _DURATION_RE.match(text)
    if not text or text == "0" or not m or not any(m.groups()):
        if text == "0":
            return 0
        raise ValueError(f"not a Prometheus duration: {text!r} (expected e.g. 5m, 1h, 30d)")
    return sum(int(g) * mult for g, (_, mult) in zip(m.groups(), _UNITS) if g)


def format_duration(ms: int) -> str:
    """Prometheus' own spelling: years and weeks only when they divide exactly."""
    if ms == 0:
        return "0s"
    out = []
    for unit, mult in _UNITS:
        exact_only = unit in ("y", "w")
        if exact_only and ms % mult:
            continue
        value, ms = divmod(ms, mult)
        if value:
            out.append(f"{value}{unit}")
    return "".join(out)


def format_seconds(seconds: float) -> str:
    """A duration given in (fractional) seconds, in Prometheus' spelling, to the millisecond."""
    return format_duration(int(round(seconds * 1000)))


def hours(ms: int) -> float:
    """Go's time.Duration.Hours(), bit for bit: whole hours plus the remainder as a fraction."""
    whole, rem = divmod(ms, HOUR)
    return float(whole) + rem / float(HOUR)


def seconds(ms: int) -> float:
    return ms / 1000.0
