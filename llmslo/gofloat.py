"""Floats as Go and the Prometheus clients print them: the one formatter every package uses.

Why it matters: a bucket's `le`, a sample's value and a rule's threshold are compared as text by
tests, promtool and Sloth-compatible output, so each writer must spell a float exactly as its peer
does. Three spellings exist, one function each:

* `go_g`: Go's `strconv.FormatFloat(x, 'g', -1, 64)` / fmt `%v`, what Prometheus itself and Go clients
  write (`1`, `0.5`, `1e+06`, `+Inf`);
* `go_f`: `strconv.FormatFloat(x, 'f', -1, 64)`, never an exponent (Sloth writes some values so);
* `client_float`: prometheus_client's `floatToGoString` (`1.0`, `0.5`, `1e+06`), what the tap, the
  simulator and Python-served engines write; kept here so the exporter need not import prometheus_client
  (about 40 ms of start-up) to match it.

All three start from Python's repr, which already holds the shortest round-trip digits that Go's
shortest formatting chooses; only the layout differs.
"""

from __future__ import annotations

import math

__all__ = ["go_g", "go_f", "client_float"]


def _shortest_digits(value: float) -> tuple[str, int]:
    """The significant digits of a positive finite float's repr, and the power of ten of the first one.

    repr writes the shortest digits that round-trip, either positionally (`0.00012`, `12345678.9`) or
    with an exponent (`1.5e-07`, `1e+16`).
    """
    mantissa, _, exponent = repr(value).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    significant = digits.lstrip("0")
    exp10 = int(exponent or 0) + len(whole) - 1 - (len(digits) - len(significant))
    return significant.rstrip("0"), exp10


def _positional(prefix: str, digits: str, exp10: int) -> str:
    if exp10 < 0:
        return f"{prefix}0.{'0' * (-exp10 - 1)}{digits}"
    if len(digits) <= exp10 + 1:
        return prefix + digits + "0" * (exp10 + 1 - len(digits))
    return f"{prefix}{digits[:exp10 + 1]}.{digits[exp10 + 1:]}"


def go_g(value: float) -> str:
    """`strconv.FormatFloat(v, 'g', -1, 64)`: `le="1"` (not "1.0"), `1e+06`, as Prometheus 3 writes edges.

    Every value the exporter renders goes through here, so the common shapes come first: integers below
    1e6 and numbers from 1e-4 to 1e6, which repr already writes as Go does. The rest take the exact path.
    """
    if -1e6 < value < 1e6:  # false for NaN and the infinities
        if value == int(value):
            return str(int(value))  # 0 and -0.0 included: "0"
        if value >= 1e-4 or value <= -1e-4:
            return repr(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    digits, exp10 = _shortest_digits(abs(value))
    prefix = "-" if value < 0 else ""
    if exp10 < -4 or exp10 >= 6:  # Go switches to exponent form at 1e+06 for shortest output
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{prefix}{mantissa}e{'+' if exp10 >= 0 else '-'}{abs(exp10):02d}"
    return _positional(prefix, digits, exp10)


def go_f(value: float) -> str:
    """`strconv.FormatFloat(v, 'f', -1, 64)`: the shortest digits, never an exponent (`0.00001`, `1000000`)."""
    if value == int(value) and abs(value) < 1e16:
        return str(int(value))
    digits, exp10 = _shortest_digits(abs(value))
    return _positional("-" if value < 0 else "", digits, exp10)


def client_float(d: float) -> str:
    """prometheus_client.utils.floatToGoString: repr, `+Inf`/`-Inf`/`NaN`, and an exponent from 1e+06 up
    for positive values (a test holds the two equal)."""
    d = float(d)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    # Go switches to exponents sooner than Python; only positive values matter for `le`.
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s
