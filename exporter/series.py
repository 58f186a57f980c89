"""Helpers over normalized samples: grouping into series, histogram shape checks, Go float text.

A histogram is many samples (buckets, sum, count) that only make sense together, so caps and
de-duplication work on whole series ("units"), never on single bucket lines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from llmslo.conventions import LABEL_LE
from exporter.model import NormSample

UnitKey = tuple[str, tuple[tuple[str, str], ...]]


def unit_key(sample: NormSample) -> UnitKey:
    """Family name plus every label except `le`: one gauge, one counter or one whole histogram."""
    labels = sample.labels
    if LABEL_LE in labels:  # copy and delete: cheaper than filtering pair by pair, and this runs per sample
        labels = labels.copy()
        del labels[LABEL_LE]
    return sample.metric.name, tuple(sorted(labels.items()))


def group_units(samples: Iterable[NormSample]) -> dict[UnitKey, list[NormSample]]:
    """Samples grouped by unit, in first-appearance order."""
    units: dict[UnitKey, list[NormSample]] = {}
    for s in samples:
        key = unit_key(s)
        unit = units.get(key)
        if unit is None:
            units[key] = [s]
        else:
            unit.append(s)
    return units


def parse_le(text: str) -> float:
    return float(text)  # accepts "+Inf", "inf", "0.5", "1e-05"


def complete_histogram(unit: list[NormSample]) -> list[NormSample] | None:
    """The unit with +Inf bucket and _count filled in from each other, buckets sorted; None if broken.

    Broken means: a bucket edge that is not a number, buckets that are not cumulative, or
    neither a +Inf bucket nor a _count to complete it from. Prometheus would store such a
    series, but every histogram_quantile() over it would be wrong, so it is better dropped.
    """
    buckets: list[tuple[float, NormSample]] = []
    total_sum = count = None
    for s in unit:
        if s.suffix == "_bucket":
            try:
                buckets.append((parse_le(s.labels.get(LABEL_LE, "")), s))
            except ValueError:
                return None
        elif s.suffix == "_sum":
            total_sum = s
        elif s.suffix == "_count":
            count = s
        else:
            return None
    buckets.sort(key=lambda b: b[0])
    previous = -math.inf
    for _, b in buckets:
        if b.value < previous or math.isnan(b.value):
            return None
        previous = b.value
    has_inf = bool(buckets) and buckets[-1][0] == math.inf
    template = (buckets[0][1] if buckets else count or total_sum)
    if template is None:
        return None
    base_labels = {k: v for k, v in template.labels.items() if k != LABEL_LE}
    out = [b for _, b in buckets]
    if not has_inf:
        if count is None:
            return None
        out.append(NormSample(template.metric, {**base_labels, LABEL_LE: "+Inf"}, count.value, "_bucket"))
    if count is None:
        count = NormSample(template.metric, dict(base_labels), out[-1].value, "_count")
    if total_sum is not None:
        out.append(total_sum)
    out.append(count)
    return out


def go_float(value: float) -> str:
    """A float as Go's strconv.FormatFloat(v, 'g', -1, 64) writes it, as Prometheus itself does.

    So `le="1"` (not "1.0") and `1e+06`, matching what Prometheus 3 normalises bucket edges to.
    Every rendered value goes through here, so the common shapes come first: integers below 1e6
    (counts, bytes, ids) and numbers from 1e-4 to 1e6, which Python's shortest repr already
    writes as Go does (positional, shortest digits). The rest take the exact digit-by-digit path.
    """
    if -1e6 < value < 1e6:  # false for NaN and the infinities
        if value == int(value):
            return str(int(value))  # 0 and -0.0 included: "0"
        if value >= 1e-4 or value <= -1e-4:
            return repr(value)
    return _go_float_exact(value)


def _go_float_exact(value: float) -> str:
    """`go_float` for any value: the shortest round-trip digits (from repr) laid out by Go's rule."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    if value == int(value) and abs(value) < 1e6:
        return str(int(value))
    digit_text, exp10 = _shortest_digits(abs(value))
    prefix = "-" if value < 0 else ""
    if exp10 < -4 or exp10 >= 6:  # Go switches to exponent form at 1e+06 for shortest output
        mantissa = digit_text[0] + ("." + digit_text[1:] if len(digit_text) > 1 else "")
        return f"{prefix}{mantissa}e{'+' if exp10 >= 0 else '-'}{abs(exp10):02d}"
    if exp10 < 0:
        return f"{prefix}0.{'0' * (-exp10 - 1)}{digit_text}"
    if len(digit_text) <= exp10 + 1:
        return prefix + digit_text + "0" * (exp10 + 1 - len(digit_text))
    return f"{prefix}{digit_text[:exp10 + 1]}.{digit_text[exp10 + 1:]}"


def _shortest_digits(value: float) -> tuple[str, int]:
    """The significant digits of a positive finite float's repr, and the power of ten of the first one.

    repr writes the shortest digits that round-trip, as Go's shortest formatting does, either
    positionally (`0.00012`, `12345678.9`) or with an exponent (`1.5e-07`, `1e+16`).
    """
    mantissa, _, exponent = repr(value).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = whole + fraction
    significant = digits.lstrip("0")
    exp10 = int(exponent or 0) + len(whole) - 1 - (len(digits) - len(significant))
    return significant.rstrip("0"), exp10
