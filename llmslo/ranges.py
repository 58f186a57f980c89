"""Plausible ranges for every number a spec or config gives, and the wrong-unit hint when one is outside.

A TTFT threshold of `500` is valid YAML and a valid number, but it means 500 seconds: the SLO can never fire
and the tap's first-token deadline becomes 10 x 500 s. So every number that measures something has a range
that covers what people run (docs/slogen.md, "Plausible ranges"); a value outside it is refused, and when the
value times a unit factor lands inside (500 ms -> 0.5 s, 0.99 -> 99 %, 90 % -> 0.9), the message says that
first. One table, read by slogen's loaders, the plugin option reader (so the tap refuses at start what
`slogen validate` refuses) and the exporter's config; to go beyond a range on purpose, an SLO sets
`allow_out_of_range: true` and the exporter's config writes the unit (`interval: 500s`).
"""

from __future__ import annotations

from dataclasses import dataclass

SECONDS = "seconds"
RATIO = "ratio"
PERCENT = "percent"

ALLOW_KEY = "allow_out_of_range"  # the SLO-level key that accepts a value outside its range


@dataclass(frozen=True)
class Range:
    """What a number measures, its unit and the closed range [lo, hi] people plausibly write."""

    what: str
    unit: str
    lo: float
    hi: float

    def describe(self) -> str:
        unit = {SECONDS: "in seconds", PERCENT: "a percentage", RATIO: "a ratio"}[self.unit]
        return f"{self.what} is {unit}, plausibly {self.lo:g} to {self.hi:g}"


# name -> range; the names are the plugin metrics (llmslo.sli_plugins.LATENCY_METRICS) and a few more.
RANGES: dict[str, Range] = {
    "ttft": Range("a TTFT threshold", SECONDS, 0.01, 60),
    "tpot": Range("a TPOT threshold", SECONDS, 0.001, 2),
    "itl": Range("an ITL threshold", SECONDS, 0.001, 2),
    "e2e": Range("an end-to-end latency threshold", SECONDS, 0.05, 1800),
    "queue": Range("a queue-time threshold", SECONDS, 0.001, 600),
    "kv_ratio": Range("a KV-cache usage threshold", RATIO, 0.1, 1),
    "objective": Range("an objective", PERCENT, 50, 100),
    "exporter_interval": Range("the exporter's collection interval", SECONDS, 0.1, 300),
}

# (factor, what the value looks like, per unit): value * factor inside the range -> "looks like <what>"
_SCALES: dict[str, tuple[tuple[float, str], ...]] = {
    SECONDS: ((1e-3, "milliseconds"), (1e-6, "microseconds")),
    RATIO: ((1e-2, "a percentage"),),
    PERCENT: ((1e2, "a ratio"),),
}


@dataclass(frozen=True)
class OutOfRange:
    """Why a value is implausible: `message` (the unit hint first, when there is one) and `suggested`
    (the value in the right unit, or None)."""

    message: str
    suggested: float | None


def _text(value: float) -> str:
    return f"{value:.12g}"


def check(name: str, value: float) -> OutOfRange | None:
    """None when `value` is within RANGES[name]; else what is wrong, with the right-unit value if one fits."""
    r = RANGES[name]
    if r.lo <= value <= r.hi:
        return None
    for factor, looks in _SCALES[r.unit]:
        scaled = float(_text(value * factor))
        if r.lo <= scaled <= r.hi:
            extra = ": objectives are percentages," if r.unit == PERCENT else ":"
            return OutOfRange(f"{_text(value)} looks like {looks}{extra} write {_text(scaled)} "
                              f"({r.describe()})", scaled)
    return OutOfRange(f"{_text(value)} is outside the plausible range: {r.describe()}", None)
