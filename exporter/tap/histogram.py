"""One histogram series as the tap keeps it: per-bucket counts over fixed edges, rendered cumulative.

Shared by the tap's own histograms (exporter.tap.metrics) and their GenAI copies (exporter.tap.genai).
"""

from __future__ import annotations

from bisect import bisect_left


class Histogram:
    """One histogram series: per-bucket (not cumulative) counts, the last one for +Inf."""

    __slots__ = ("edges", "counts", "sum", "count")

    def __init__(self, edges: tuple[float, ...]) -> None:
        self.edges = edges
        self.counts = [0] * (len(edges) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        # bisect_left: the first edge >= value, i.e. the bucket whose `le` the value is within.
        self.counts[bisect_left(self.edges, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[int]:
        out, total = [], 0
        for n in self.counts:
            total += n
            out.append(total)
        return out
