"""Prometheus text-format parser. PLACEHOLDER: delegates to prometheus_client until the fast parser lands."""

from __future__ import annotations

from collections.abc import Collection

from prometheus_client.parser import text_string_to_metric_families

from exporter.model import MetricFamily, Sample


def parse(text: str, want: Collection[str] | None = None) -> dict[str, MetricFamily]:
    """Parse an exposition page into families keyed by family name, keeping only `want` when given."""
    out: dict[str, MetricFamily] = {}
    for fam in text_string_to_metric_families(text):
        if want is not None and fam.name not in want:
            continue
        out[fam.name] = MetricFamily(
            fam.name, fam.type, fam.documentation,
            [Sample(s.name, dict(s.labels), s.value, s.timestamp) for s in fam.samples],
        )
    return out
