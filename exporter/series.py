"""Helpers over normalized samples: grouping into series, histogram shape checks, Go float text.

A histogram is many samples (buckets, sum, count) that only make sense together, so caps and
de-duplication work on whole series ("units"), never on single bucket lines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from operator import itemgetter

from exporter.model import NormSample
from llmslo.conventions import FINISHED_REASONS, LABEL_LE, LABEL_REASON, REQUESTS_FINISHED

UnitKey = tuple[str, tuple[tuple[str, str], ...]]


def group_units(samples: Iterable[NormSample]) -> dict[UnitKey, list[NormSample]]:
    """Samples grouped by unit (family name plus every label except `le`: one gauge, one counter or one whole
    histogram), in first-appearance order.

    A histogram's parts come one after another with the same labels but `le`: a part whose family and labels
    equal the previous sample's joins its unit without the sort that makes a key (half the grouping's time)."""
    units: dict[UnitKey, list[NormSample]] = {}
    last_name = ""
    last_labels: dict[str, str] | None = None
    last_unit: list[NormSample] = []
    for s in samples:
        labels = s.labels
        name = s.metric.name
        if LABEL_LE in labels:
            labels = labels.copy()
            del labels[LABEL_LE]
        if name == last_name and labels == last_labels:
            last_unit.append(s)
            continue
        key = name, tuple(sorted(labels.items()))
        unit = units.get(key)
        if unit is None:
            unit = units[key] = [s]
        else:
            unit.append(s)
        last_name, last_labels, last_unit = name, labels, unit
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
    in_order = True  # edges rising, as an adapter's Output writes them: nothing to sort
    for s in unit:
        suffix = s.suffix
        if suffix == "_bucket":
            try:
                edge = float(s.labels.get(LABEL_LE, ""))  # parse_le's reading
            except ValueError:
                return None
            if buckets and not edge > buckets[-1][0]:  # a step back, a repeat or NaN
                in_order = False
            buckets.append((edge, s))
        elif suffix == "_sum":
            total_sum = s
        elif suffix == "_count":
            count = s
        else:
            return None
    if not in_order:
        buckets.sort(key=itemgetter(0))
    previous = -math.inf
    for _, b in buckets:
        if b.value < previous or math.isnan(b.value):
            return None
        previous = b.value
    has_inf = bool(buckets) and buckets[-1][0] == math.inf
    if (has_inf and in_order and unit[-1] is count and (total_sum is None or unit[-2] is total_sum)
            and len(unit) == len(buckets) + 1 + (total_sum is not None)):
        return unit  # complete already, and in the order made below: buckets, sum, count
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


def with_every_reason(samples: list[NormSample]) -> list[NormSample]:
    """`samples` plus, for every model (every label set) that has a finished-requests series, the other
    finished reasons (conventions.FINISHED_REASONS) at 0 where the engine does not write them.

    rate() and increase() never count a series' first sample: an engine that creates a reason's series
    with its first request (SGLang, TGI and Triton write only the reasons they have seen; vLLM writes all
    at 0) would hide that request from every availability SLI, at low traffic the only failure. Written
    at 0 from the first scrape that shows the model, the first error is an increase like any other."""
    finished = [s for s in samples if s.metric is REQUESTS_FINISHED]
    if not finished:
        return samples
    seen: dict[tuple[tuple[str, str], ...], set[str]] = {}
    for s in finished:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != LABEL_REASON))
        seen.setdefault(key, set()).add(s.labels.get(LABEL_REASON, ""))
    extra = [NormSample(REQUESTS_FINISHED, {**dict(key), LABEL_REASON: reason}, 0.0)
             for key, reasons in seen.items() for reason in FINISHED_REASONS if reason not in reasons]
    return samples + extra if extra else samples
