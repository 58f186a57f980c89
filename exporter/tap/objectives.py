"""What one request is held to, and the per-request objectives a trusted gateway passes in `x-slo-*` headers.

llm-d's router passes a request's own objectives as `x-slo-ttft-ms` / `x-slo-tpot-ms` (milliseconds). The tap
takes them only under `--trusted-gateway-objectives` (policy.slo_headers reads nothing otherwise), and even then
a header value is a client's text, so each one is bounded before it counts:

- read: at most MAX_VALUE_CHARS characters (`too_long`), a plain decimal number that is finite (`malformed`),
  inside the plausible range a spec's threshold is checked against, llmslo.ranges (`out_of_range`: 0, negative,
  500 s as a TTFT), given once (`repeated`: every copy of a header given twice is ignored, as a proxy that
  joined two requests' headers would send it); `x-slo-class` must name a configured class (`unknown_class`).
  Each problem is one count of conventions.TAP_SLO_HEADERS_IGNORED{reason}; the request keeps what its class
  gives for that header. Never an exception.
- snapped DOWN to the nearest edge of a fixed ladder (LADDER_MANTISSAS x powers of ten, at most 1.33x apart):
  a request is held to at least as strict an objective as it asked, never a looser one. Holding it to a looser
  one would count a request that missed its objective as good: an outage that looks healthy, the worst defect a
  goodput signal can have. The cost of the strict side is bounded by the ladder's step: a request that asked
  for 450 ms is held to 400 ms.
- folded into a bounded set of classes: a request whose snapped objectives differ from its class's counts under
  a derived class named by them, `<class>@ttft400-tpot50` (milliseconds; the TPOT part is the class's own when
  only the TTFT header came), so the class's own goodput series keep measuring its own objectives. At most
  MAX_DERIVED_CLASSES derived names per process (kept across reloads by the proxy); a request beyond them is
  still judged by its own snapped objectives, under `<class>@other` (one per configured class), and counted
  as `class_cap`.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from llmslo.ranges import RANGES

HEADER_CLASS = "x-slo-class"
HEADER_TTFT_MS = "x-slo-ttft-ms"
HEADER_TPOT_MS = "x-slo-tpot-ms"
HEADERS = (HEADER_CLASS, HEADER_TTFT_MS, HEADER_TPOT_MS)

# The reasons of conventions.SLO_HEADER_REASONS, in its order.
TOO_LONG, MALFORMED, OUT_OF_RANGE, REPEATED, UNKNOWN_CLASS, CLASS_CAP = (
    "too_long", "malformed", "out_of_range", "repeated", "unknown_class", "class_cap",
)

MAX_VALUE_CHARS = 32  # a millisecond count needs a handful; a class name is checked against the configured ones
MAX_CLASS_CHARS = 200  # the model label's bound (exporter.tap.models): longer names are not looked up
MAX_DERIVED_CLASSES = 32  # derived slo_class label values per process
OVERFLOW_SUFFIX = "@other"
DERIVED_SEPARATOR = "@"
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d{1,3})?\Z")

LADDER_MANTISSAS = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0)  # per decade; the widest step is 3 -> 4


def ladder(name: str) -> tuple[float, ...]:
    """The objective ladder (seconds) over RANGES[name]: its low end, then every mantissa x power of ten (ms)
    inside the range. Starting at the low end means every value inside the range has an edge at or below it."""
    r = RANGES[name]
    edges = {r.lo}
    for exponent in range(-3, 7):
        for m in LADDER_MANTISSAS:
            seconds = round(m * 10.0**exponent / 1000.0, 9)
            if r.lo <= seconds <= r.hi:
                edges.add(seconds)
    return tuple(sorted(edges))


TTFT_LADDER = ladder("ttft")
TPOT_LADDER = ladder("tpot")


def snap_down(seconds: float, edges: tuple[float, ...]) -> float:
    """The largest edge at or below `seconds` (a value inside the ladder's range; the lowest edge otherwise)."""
    return edges[max(bisect_right(edges, seconds) - 1, 0)]


@dataclass(frozen=True)
class Objective:
    """What one request is held to: its slo_class label value and objectives (seconds; None: not constrained).
    `ignored`: the x-slo-* problems of its headers (conventions.SLO_HEADER_REASONS), counted once it is planned;
    `configured`: the configured class a derived class comes from ("" when slo_class is one)."""

    slo_class: str
    ttft: float | None
    tpot: float | None
    ignored: tuple[str, ...] = ()
    configured: str = ""

    @property
    def base_class(self) -> str:
        """The configured class this request belongs to (what --admission-sheddable names)."""
        return self.configured or self.slo_class


@dataclass(frozen=True, slots=True)
class Asked:
    """What a trusted request's x-slo-* headers ask for, each value already bounded (None: not asked)."""

    slo_class: str = ""
    ttft: float | None = None  # seconds, inside RANGES["ttft"], not yet snapped
    tpot: float | None = None
    ignored: tuple[str, ...] = ()


NOTHING = Asked()


def _millis(text: str, range_name: str, ignored: list[str]) -> float | None:
    if len(text) > MAX_VALUE_CHARS:
        ignored.append(TOO_LONG)
        return None
    text = text.strip(" \t")
    ms = float(text) if _NUMBER.match(text) else math.nan
    if not math.isfinite(ms):
        ignored.append(MALFORMED)
        return None
    r = RANGES[range_name]
    seconds = ms / 1000.0
    if not r.lo <= seconds <= r.hi:
        ignored.append(OUT_OF_RANGE)
        return None
    return seconds


def read_asked(fields: Iterable[tuple[str, str]]) -> Asked:
    """The request's x-slo-* fields (lowercased names, decoded values; others are skipped) as an Asked."""
    values: dict[str, list[str]] = {}
    for name, value in fields:
        if name in HEADERS:
            values.setdefault(name, []).append(value)
    if not values:
        return NOTHING
    ignored: list[str] = []
    taken: dict[str, str] = {}
    for name, got in values.items():
        if len(got) > 1:
            ignored.append(REPEATED)
        else:
            taken[name] = got[0]
    cls = taken.get(HEADER_CLASS, "")
    if len(cls) > MAX_CLASS_CHARS:
        ignored.append(TOO_LONG)
        cls = ""
    ttft = _millis(taken[HEADER_TTFT_MS], "ttft", ignored) if HEADER_TTFT_MS in taken else None
    tpot = _millis(taken[HEADER_TPOT_MS], "tpot", ignored) if HEADER_TPOT_MS in taken else None
    return Asked(cls, ttft, tpot, tuple(ignored))


def _ms(seconds: float) -> str:
    return f"{seconds * 1000.0:.6g}"


def derived_name(base: str, ttft: float | None, tpot: float | None) -> str:
    """`<base>@ttft400-tpot50`: the class and the objectives (ms) its requests are held to."""
    parts = [f"{key}{_ms(v)}" for key, v in (("ttft", ttft), ("tpot", tpot)) if v is not None]
    return base + DERIVED_SEPARATOR + "-".join(parts)


class DerivedClasses:
    """The derived class names handed out in this process (at most `cap`); the proxy keeps one across reloads."""

    def __init__(self, cap: int = MAX_DERIVED_CLASSES) -> None:
        self.cap = cap
        self.names: set[str] = set()
        self._by_objectives: dict[tuple[str, float | None, float | None], str] = {}  # the names handed out, by key

    def fold(self, base: str, base_ttft: float | None, base_tpot: float | None, asked: Asked,
             ignored: tuple[str, ...], configured: Collection[str]) -> Objective:
        """The objective of a request of class `base` whose headers asked for `asked` (ttft or tpot set);
        `configured`: the configured class names, which a derived name may not take."""
        ttft = base_ttft if asked.ttft is None else snap_down(asked.ttft, TTFT_LADDER)
        tpot = base_tpot if asked.tpot is None else snap_down(asked.tpot, TPOT_LADDER)
        if ttft == base_ttft and tpot == base_tpot:
            return Objective(base, ttft, tpot, ignored)
        key = (base, ttft, tpot)
        name = self._by_objectives.get(key)
        if name is None:
            name = derived_name(base, ttft, tpot)
            if len(self.names) >= self.cap or name in configured or name in self.names:
                return Objective(base + OVERFLOW_SUFFIX, ttft, tpot, (*ignored, CLASS_CAP), base)
            self.names.add(name)
            self._by_objectives[key] = name
        return Objective(name, ttft, tpot, ignored, base)
