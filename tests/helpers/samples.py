"""Picking normalized samples (exporter.model.NormSample) out of an adapter's output in tests."""

from __future__ import annotations

from exporter.model import NormSample
from llmslo import conventions as c


def pick(samples: list[NormSample], metric: c.MetricDef, suffix: str = "", **labels: str) -> list[NormSample]:
    return [s for s in samples if s.metric == metric and s.suffix == suffix
            and all(s.labels.get(k) == v for k, v in labels.items())]


def one(samples: list[NormSample], metric: c.MetricDef, suffix: str = "", **labels: str) -> float:
    """The value of the single sample matching; fails when there are none or several (double counting)."""
    found = pick(samples, metric, suffix, **labels)
    assert len(found) == 1, f"{metric.name}{suffix} {labels}: {len(found)} samples"
    return found[0].value
