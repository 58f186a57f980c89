"""Prometheus' histogram_quantile over cumulative buckets: one function for the tap, the simulator's checks and the tests."""

from __future__ import annotations

import math
from collections.abc import Sequence

Buckets = Sequence[tuple[float, float]]  # (le, cumulative count), in edge order, +Inf last


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile as Prometheus' histogram_quantile estimates it: linear within the bucket the rank
    falls in (the first bucket starting at 0); in the +Inf bucket, the highest finite edge. None when
    the histogram is empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_n = 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if math.isinf(le):
                return prev_le
            if n == prev_n:
                return le
            return prev_le + (le - prev_le) * (rank - prev_n) / (n - prev_n)
        prev_le, prev_n = le, n
    return prev_le
