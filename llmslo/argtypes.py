"""Numbers with a range and a reason: argparse `type=` validators that also check JSON fields and document themselves.

A flag that takes any float takes nan, inf and 1e308 too, and a simulator or planner fed those runs forever or
until memory runs out. One `Bound` per flag says what it accepts and why; the same object parses the command
line (argparse then exits 2 naming the flag), checks a number from a JSON body or a config (the error names the
field), and writes the range and the reason into the flag's `--help`, so the three never disagree.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

N = TypeVar("N", int, float)


@dataclass(frozen=True)
class Bound:
    """`low <= value <= high` (or `low < value` with `low_open`); integers only with `integer`; `words` are
    spellings accepted besides the range (e.g. "inf" for "no end"), returned as float(word)."""

    low: float
    high: float
    why: str
    integer: bool = False
    low_open: bool = False
    words: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.low <= self.high:
            raise ValueError(f"Bound: low {self.low} above high {self.high}")

    @property
    def __name__(self) -> str:  # argparse names the type in some messages
        return "integer" if self.integer else "number"

    def describe(self) -> str:
        """The accepted values in words, e.g. `a number above 0 and at most 10000`."""
        kind = "a whole number" if self.integer else "a number"
        low, high = _show(self.low), _show(self.high)
        text = f"{kind} above {low} and at most {high}" if self.low_open else f"{kind} from {low} to {high}"
        return text + "".join(f", or {w}" for w in self.words)

    def accepts(self, value: float) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if isinstance(value, float) and math.isinf(value) and any(float(w) == value for w in self.words):
            return True
        if not math.isfinite(value) or (self.integer and value != int(value)):
            return False
        return (self.low < value if self.low_open else self.low <= value) and value <= self.high

    def parse(self, text: str) -> float:
        """The value a command-line string stands for; ValueError saying what is accepted and why."""
        text = text.strip()
        if text.lower() in self.words:
            return float(text.lower())
        try:
            value: float = int(text) if self.integer else float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not {self.describe()} ({self.why})") from None
        if not self.accepts(value):
            raise ValueError(f"{text!r} is out of range: give {self.describe()} ({self.why})")
        return value

    def __call__(self, text: str) -> float:
        """argparse's `type=`: argparse turns the error into `argument --flag: ...` and exit status 2."""
        try:
            return self.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    def check(self, value: object, field: str) -> float:
        """A number from JSON or a config: returned as is, or ValueError naming `field`."""
        if isinstance(value, str) and value.strip().lower() in self.words:
            return float(value.strip().lower())
        if not self.accepts(value):  # type: ignore[arg-type]
            raise ValueError(f"{field}: {value!r} is not {self.describe()} ({self.why})")
        return value  # type: ignore[return-value]

    def help(self, text: str) -> str:
        """`text` followed by the range and its reason, for `add_argument(help=...)` (`%` kept literal)."""
        return f"{text}; {self.describe()}: {self.why}".replace("%", "%%").replace("%%(default)s", "%(default)s")


def number_arg(convert: Callable[[str], N], accept: Callable[[N], bool], what: str,
               out_of_range: str = "") -> Callable[[str], N]:
    """A plain argparse `type=`: `convert(text)` when `accept` allows it, else `'text' is not <what>` (or, for a
    number out of range, `<out_of_range>` when given). For a flag whose range needs no reason; else `Bound`."""

    def parse(text: str) -> N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {out_of_range or what}")
        return value

    return parse


def _show(x: float) -> str:
    return f"{int(x):,}" if x == int(x) else f"{x:g}"
