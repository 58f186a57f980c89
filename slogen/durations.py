"""Prometheus duration strings <-> integer milliseconds.

Durations are kept as integer milliseconds so that window arithmetic is exact and the
strings we print are the ones Prometheus (and Sloth, through prometheus/common) print:
`24h` prints as `1d`, `168h` as `1w`, `30d` stays `30d` (weeks only when exact).
"""

from __future__ import annotations

# Prometheus durations: the one parser of that grammar (llmslo.durations), under the names slogen's
# modules use; the Go grammar (exporter flags, web config) is llmslo.durations.parse_go_duration.
from llmslo.durations import DAY, HOUR, MINUTE, MS, SECOND, WEEK, YEAR
from llmslo.durations import format_prometheus_duration as format_duration
from llmslo.durations import parse_prometheus_duration as parse_duration


def format_seconds(seconds: float) -> str:
    """A duration given in (fractional) seconds, in Prometheus' spelling, to the millisecond."""
    return format_duration(int(round(seconds * 1000)))


def hours(ms: int) -> float:
    """Go's time.Duration.Hours(), bit for bit: whole hours plus the remainder as a fraction."""
    whole, rem = divmod(ms, HOUR)
    return float(whole) + rem / float(HOUR)


def seconds(ms: int) -> float:
    return ms / 1000.0


__all__ = ["MS", "SECOND", "MINUTE", "HOUR", "DAY", "WEEK", "YEAR", "parse_duration", "format_duration",
           "format_seconds", "hours", "seconds"]
