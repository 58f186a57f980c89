"""How a scenario's fixtures become promtool input series: counters grown step by step from a bad share, a
gauge saturated or not, series created at their first use, and promtool's expanding notation."""

from __future__ import annotations

import functools

from llmslo.gofloat import go_g
from slogen.model import SeriesFixture

UNITS_PER_STEP = 1000.0  # events per evaluation step in synthetic traffic


def arrivals(n: int, step: int, per_hour: int) -> list[float]:
    """Requests in each step when one arrives every hour / per_hour (the first at that time, none at 0)."""
    return list(_arrivals(n, step, per_hour))


@functools.lru_cache(maxsize=256)
def _arrivals(n: int, step: int, per_hour: int) -> tuple[float, ...]:
    """The same, made once: each low-traffic SLO of a shape asks for it at every step its tests check."""
    every = 3_600_000 // per_hour
    return (0.0, *(float(k * step // every - (k - 1) * step // every) for k in range(1, n)))


def staged(fixtures: tuple[SeriesFixture, ...], incident: str) -> list[SeriesFixture]:
    """The series a scenario writes: a "late" series only in the hang that ends in its outcome.

    Left out elsewhere, as the tap leaves it out until its first such request: every other
    scenario also proves that a missing late series costs the SLI nothing.
    """
    return [f for f in fixtures if f.role != "late" or (incident and f.incident == incident)]


# Growth of a counter per step, as a share of the step's requests, given its bad share b. In a
# failure the requests complete and fail; in a hang they never complete ("total" and "good"
# stop) and end late instead. A failure has no late series, a hang no completed bad ones.
_GROWTH = {
    False: {"total": lambda b: 1.0, "good": lambda b: 1.0 - b, "bad": lambda b: b, "late": lambda b: 0.0},
    True: {"total": lambda b: 1.0 - b, "good": lambda b: 1.0 - b, "bad": lambda b: 0.0, "late": lambda b: b},
}


def fixture_series(f: SeriesFixture, bad: list[float], hang: bool = False, traffic: list[float] | None = None,
                   born: bool = False) -> dict:
    """A fixture's samples. `born`: the user's own counters, which a client library creates at their first
    increase (a `code="500"` series at the first 5xx), so it is absent until then and first reads that 1."""
    labels = ",".join(f'{k}="{v}"' for k, v in sorted(f.labels.items()))
    key = (f.role, f.good_value, f.bad_value, tuple(bad), hang, None if traffic is None else tuple(traffic), born)
    values = _VALUES.get(key)
    if values is None:
        if len(_VALUES) >= _VALUES_LIMIT:
            _VALUES.clear()
        values = _VALUES[key] = _values(f, bad, hang, traffic, born)
    return {"series": f"{f.name}{{{labels}}}", "values": values}


# A fixture's samples depend on its role and levels and on the scenario, not on its name: SLOs of one shape
# share their scenarios, so a large build asks for the same samples thousands of times.
_VALUES: dict[tuple, str] = {}
_VALUES_LIMIT = 4096


def _values(f: SeriesFixture, bad: list[float], hang: bool, traffic: list[float] | None, born: bool) -> str:
    if f.role == "gauge":
        return encode([f.bad_value if b >= 0.5 else f.good_value for b in bad])
    per_step = _GROWTH[hang][f.role]
    values, acc = [], 0.0
    for k, b in enumerate(bad):
        if k:
            acc += per_step(b) * (UNITS_PER_STEP if traffic is None else traffic[k])
        values.append(round(acc, 6))
    if f.role == "late":
        return _from_first_use(values)
    if born:
        return _born_at_first_use(values)
    return encode(values)


def _born_at_first_use(values: list[float]) -> str:
    """A counter created at its first increase: absent (`_`) until that step, where it reads its first value
    (rate() alone would not see that increase: first_sample.py counts it)."""
    first = next((k for k in range(len(values)) if values[k] > 0), len(values))
    blanks = f"_x{first}" if first else ""
    return " ".join(x for x in (blanks, encode(values[first:])) if x)


def _from_first_use(values: list[float]) -> str:
    """A counter the tap creates on its first use: absent (`_`) until the step before it first grows,
    where it reads 0, so rate() over it is exact from the first late request on."""
    first = next((k for k in range(1, len(values)) if values[k] > 0), len(values))
    start = max(0, first - 1)
    blanks = f"_x{start}" if start else ""
    return " ".join(x for x in (blanks, encode(values[start:])) if x)


def encode(values: list[float]) -> str:
    """promtool's expanding notation: runs of constant increments as `start+stepxN`."""
    out, i, n = [], 0, len(values)
    while i < n:
        j = i
        if i + 1 < n:
            d = round(values[i + 1] - values[i], 6)
            j = i + 1
            while j + 1 < n and abs(round(values[j + 1] - values[j], 6) - d) < 1e-9:
                j += 1
            sign = "+" if d >= 0 else "-"
            out.append(f"{value_text(values[i])}{sign}{value_text(abs(d))}x{j - i}")
        else:
            out.append(value_text(values[i]))
        i = j + 1
    return " ".join(out)


def value_text(x: float) -> str:
    return go_g(round(x, 6)) if x else "0"
