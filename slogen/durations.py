"""Duration helpers slogen adds to llmslo.durations (Prometheus duration strings <-> integer milliseconds).

Durations are kept as integer milliseconds so that window arithmetic is exact and the
strings we print are the ones Prometheus (and Sloth, through prometheus/common) print:
`24h` prints as `1d`, `168h` as `1w`, `30d` stays `30d` (weeks only when exact).
"""

from __future__ import annotations

# Parsing and printing Prometheus durations, and the unit constants, are llmslo.durations'.
from llmslo.durations import HOUR, format_prometheus_duration


def format_seconds(seconds: float) -> str:
    """A duration given in (fractional) seconds, in Prometheus' spelling, to the millisecond."""
    return format_prometheus_duration(int(round(seconds * 1000)))


def hours(ms: int) -> float:
    """Go's time.Duration.Hours(), bit for bit: whole hours plus the remainder as a fraction."""
    whole, rem = divmod(ms, HOUR)
    return float(whole) + rem / float(HOUR)


__all__ = ["format_seconds", "hours"]
