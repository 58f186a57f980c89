"""One row per threshold of the health and capacity alerts, written once as field metadata.

A threshold's default is its field's default; its kind follows the field's type (an int is a duration in ms, a
float a number); its flag's metavar, the alerts it tunes, what it sets and the values it accepts are the
`Knob` on the field (`knob(...)`). The `slogen build` flags, the commented thresholds.yaml (the repository's
and the one `slogen init` writes), the docs table and each value's range check all read these rows
(slogen/thresholds.py), as slogen/schema.py reads the loaders' key lists for the JSON Schema.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from llmslo.durations import MINUTE, format_prometheus_duration

KEY = "llmslo.knob"  # the field-metadata key
WHOLE_MINUTES = "a whole number of minutes, e.g. 5m"  # what every duration accepts (the tests step by a minute)


@dataclass(frozen=True)
class Knob:
    """What a threshold's field does not say itself. A number is accepted in `low < x` (`low <= x` when not
    `low_open`) and `x < high`; `accepts` says that range in words, as the error's fix and the docs' column."""

    metavar: str  # the flag's metavar, which is also the unit: DURATION, WINDOW, RATIO, PER_SECOND, SEATS, MINUTES
    alerts: str  # the alerts it tunes, "" when it is a recording rule's window
    sets: str  # what it sets, one clause without the default
    low: float = 0.0
    low_open: bool = True
    high: float = math.inf
    accepts: str = WHOLE_MINUTES


def knob(default: float, metavar: str, alerts: str, sets: str, **bounds: Any) -> Any:
    """A threshold field: `default`, and its row as metadata."""
    return dataclasses.field(default=default, metadata={KEY: Knob(metavar, alerts, sets, **bounds)})


@dataclass(frozen=True)
class Threshold:
    """One threshold of an options class: its field name, default and kind, and its row."""

    name: str
    default: float
    duration: bool  # an int field: a duration in ms, written as Prometheus writes one
    knob: Knob

    def show(self, value: float) -> str:
        """A value as the file, the flag's help and the docs write it: `10m`, `0.95`."""
        return format_prometheus_duration(int(value)) if self.duration else f"{value:g}"

    def help(self) -> str:
        """What it sets, with the alerts it tunes first: the flag's help (before the default) and the file's comment."""
        return f"{self.knob.alerts}: {self.knob.sets}" if self.knob.alerts else self.knob.sets

    def problem(self, value: float) -> str | None:
        """What is wrong with `value` and what to write, or None when it is in range."""
        k = self.knob
        if self.duration:
            bad = value <= 0 or value % MINUTE != 0
        else:
            bad = not ((k.low < value if k.low_open else k.low <= value) and value < k.high)
        return f"is {self.show(value)}; write {k.accepts}" if bad else None


def thresholds_of(cls: type) -> tuple[Threshold, ...]:
    """The threshold fields of an options dataclass, in their order (switches and build-set fields have no row)."""
    return tuple(Threshold(f.name, f.default, f.type in (int, "int"), f.metadata[KEY])  # type: ignore[arg-type]
                 for f in dataclasses.fields(cls) if KEY in f.metadata)


def problems(options: Any, prefix: str = "") -> list[tuple[str, str]]:
    """(prefix + field, what is wrong and the fix) for each threshold of `options` out of its range."""
    out = []
    for t in thresholds_of(type(options)):
        why = t.problem(getattr(options, t.name))
        if why is not None:
            out.append((prefix + t.name, why))
    return out
