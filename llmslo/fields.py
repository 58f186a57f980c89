"""The one field reader: a typed value out of one mapping of an input file, each problem written the one way.

SLO specs (slogen's loaders), autoscaling specs, the thresholds file, the exporter's config and the `llmslo/*`
plugin options all read their fields through this module. A reader (`text`, `boolean`, `number(...)`,
`duration`) turns one value into its type or raises `FieldError(what is wrong, fix)`; `Fields` is one mapping
with its place in the file, whose `get` runs a reader on a key and records a problem (`file:line: field F:
what (fix: ...)`, llmslo/problems.py) instead of stopping, so one run reports every problem of a file.
Imports nothing heavy: the exporter reads its config through it at start-up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from llmslo.durations import parse_prometheus_duration
from llmslo.problems import describe
from llmslo.suggest import closest

T = TypeVar("T")


class FieldError(ValueError):
    """One value a reader refuses: what is wrong (`str()`) and what to write instead (`fix`, may be empty)."""

    def __init__(self, message: str, fix: str = ""):
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class Problem:
    """One problem of an input file, where it is and the fix; `str()` is llmslo.problems' one shape."""

    file: str
    message: str
    field: str = ""
    line: int | None = None
    fix: str = ""

    def __str__(self) -> str:
        return describe(self.file, self.message, line=self.line, field=self.field, fix=self.fix)


def yaml_float(value: float) -> str:
    """A non-finite float as YAML spells it (`.nan`, `.inf`, `-.inf`), a finite one as `repr`."""
    if math.isnan(value):
        return ".nan"
    if math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    return repr(value)


# ------------------------------------------------------------------------------------------- readers


def text(value: Any) -> str:
    """A scalar as text (a YAML number is its digits); a mapping, a list or a boolean is refused."""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise FieldError(f"expected a string, got {value!r}")
    return str(value)


def scalar(value: Any) -> str:
    """Any YAML scalar as text, a boolean as YAML writes it (`true`); a mapping or a list is refused."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None or isinstance(value, (Mapping, list, tuple, set)):
        raise FieldError(f"expected a string, got {type(value).__name__}")
    return str(value)


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise FieldError(f"expected true or false, got {value!r}", "write true or false")
    return value


def finite(value: Any, write: str = "e.g. 0.95", *, strings: bool = False) -> float:
    """A finite number (YAML's .nan and .inf, and booleans, refused); with `strings`, also text holding one
    (`"99.9"`). `write` is what the fix tells to write."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            if not strings or isinstance(value, bool):
                raise ValueError
            out = float(str(value))
        except ValueError:
            raise FieldError(f"expected a number, got {value!r}", f"write {write}") from None
    else:
        out = float(value)
    if not math.isfinite(out):
        shown = repr(value) if isinstance(value, str) else yaml_float(out)
        raise FieldError(f"{shown} is not a finite number",
                         f"write {write} (YAML reads .nan and .inf, and float() reads \"nan\" and \"inf\", as "
                         "not-a-number and infinity, which no comparison or rule can use)")
    return out


def number(low: float, high: float | None = None, *, integer: bool = False) -> Callable[[Any], float]:
    """A reader of a number in [low, high] (a whole number with `integer`), the bounds said in its error."""
    kind = "a whole number" if integer else "a number"
    bound = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"

    def read(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
            raise FieldError(f"expected {kind} {bound}, got {value!r}", f"write {kind} {bound}")
        if not math.isfinite(value):
            raise FieldError(f"{yaml_float(value)} is not a finite number",
                             f"write a number {bound if high is not None else 'of ' + bound} (YAML reads .nan and "
                             ".inf as not-a-number and infinity)")
        if value < low or (high is not None and value > high):
            raise FieldError(f"expected {kind} {bound}, got {value!r}", f"write {kind} {bound}")
        return value

    return read


def positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise FieldError(f"expected a whole number above zero, got {value!r}")
    return value


def seconds(high: int) -> Callable[[Any], int]:
    """A reader of a Prometheus duration in whole seconds, at most `high`: the seconds."""

    def read(value: Any) -> int:
        try:
            ms = parse_prometheus_duration(str(value))
        except ValueError:
            ms = -1
        if ms < 0 or ms % 1000:
            raise FieldError(f"{value!r} is not a duration in whole seconds", "write e.g. 30s, 5m or 1h")
        if ms // 1000 > high:
            raise FieldError(f"{value!r} is out of range", f"use at most {high}s")
        return ms // 1000

    return read


def duration(value: Any) -> int:
    """A Prometheus duration (`10m`, `1h30m`) in milliseconds."""
    try:
        return parse_prometheus_duration(str(value))
    except ValueError:
        raise FieldError(f"{value!r} is not a duration", "write e.g. 10m") from None


# ------------------------------------------------------------------------------------------ a mapping


class Fields:
    """One mapping of an input file, knowing its place (file, field path, line) for its problems, which go to
    `problems` (shared by every mapping of one file). `problem` makes the record: a reader whose callers keep
    their own error type (slogen's SpecError) overrides it. A null value is absent unless `NULL_IS_ABSENT` is
    off (then the reader refuses it)."""

    NULL_IS_ABSENT = True

    def __init__(self, file: str, where: str, data: Any, problems: list | None = None, line: int | None = None):
        self.file, self.where = file, where
        self.problems: list = problems if problems is not None else []
        self.line = getattr(data, "line", None) or line
        self.data: Mapping[str, Any] = data if isinstance(data, Mapping) else {}
        if data is not None and not isinstance(data, Mapping):
            self.error("", f"expected a mapping, got {type(data).__name__}", "write key: value pairs here")

    def field(self, key: str = "") -> str:
        return f"{self.where}.{key}" if self.where and key else (key or self.where)

    def line_of(self, key: str) -> int | None:
        line_of = getattr(self.data, "line_of", None)  # llmslo.specfile.LineDict
        return (line_of(key) or self.line) if key and line_of else self.line

    def problem(self, key: str, message: str, fix: str) -> Any:
        return Problem(self.file, message, self.field(key) or "(top level)", self.line_of(key), fix)

    def error(self, key: str, message: str, fix: str = "") -> Any:
        """Record a problem at `key` (the mapping itself for ""); the record is returned."""
        record = self.problem(key, message, fix)
        self.problems.append(record)
        return record

    def check_keys(self, allowed: tuple[str, ...], what: str = "unknown setting") -> None:
        for key in self.data:
            if key not in allowed:
                close = closest(str(key), allowed)
                hint = f"did you mean {close!r}?" if close else f"known keys: {', '.join(allowed)}"
                self.error(str(key), what, f"remove it or correct the name ({hint})")

    def get(self, key: str, read: Callable[[Any], T], default: T, fix: str = "") -> T:
        """`read(data[key])`, or `default` when the key is absent (or null) or its value refused (recorded,
        with the reader's fix, else `fix`)."""
        if key not in self.data or (self.NULL_IS_ABSENT and self.data[key] is None):
            return default
        try:
            return read(self.data[key])
        except (ValueError, TypeError) as e:
            self.error(key, str(e), getattr(e, "fix", "") or fix)
            return default

    def child(self, key: str) -> Fields:
        """The mapping at `key`, as a reader of its own sharing the problems."""
        return type(self)(self.file, self.field(key), self.data.get(key), self.problems, self.line_of(key))


__all__ = ["FieldError", "Fields", "Problem", "boolean", "duration", "finite", "number", "positive_int", "scalar",
           "seconds", "text", "yaml_float"]
