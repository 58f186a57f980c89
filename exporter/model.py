"""The exporter's two data shapes: parsed exposition families (input) and normalized samples (output)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmslo.conventions import MetricDef


@dataclass(slots=True)
class Sample:
    """One parsed exposition line. `name` is the full series name (with _bucket/_total/... suffix)."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


@dataclass(slots=True)
class MetricFamily:
    """A parsed family. Counter family names have `_total` stripped, as prometheus_client's parser does."""

    name: str
    type: str  # counter | gauge | histogram | summary | info | stateset | untyped | unknown
    help: str = ""
    samples: list[Sample] = field(default_factory=list)


@dataclass(slots=True)
class NormSample:
    """One normalized output series: a conventions family, a suffix, labels and a value."""

    metric: MetricDef
    labels: dict[str, str]
    value: float
    suffix: str = ""  # "" for gauges and counters, or "_bucket" | "_sum" | "_count" for histograms

    @property
    def name(self) -> str:
        return self.metric.name + self.suffix
