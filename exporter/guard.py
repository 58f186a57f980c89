"""Cardinality guard: caps on series and LoRA adapters per target, and a count of what it dropped.

One engine with hundreds of LoRA adapters, or a page that suddenly grows a high-cardinality
label, must not multiply the node's series in Prometheus. The guard keeps a stable subset
(sorted, so the same series survive every cycle) and counts the rest by reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from llmslo.conventions import ALL_METRICS, LABEL_ADAPTER
from exporter.config import Limits
from exporter.model import NormSample
from exporter.series import UnitKey, group_units

SERIES_LIMIT = "series_limit"
LORA_ADAPTER_LIMIT = "lora_adapter_limit"
DUPLICATE_SERIES = "duplicate_series"  # two targets produced the same series (same identity labels)
INVALID_HISTOGRAM = "invalid_histogram"
DROP_REASONS = (SERIES_LIMIT, LORA_ADAPTER_LIMIT, DUPLICATE_SERIES, INVALID_HISTOGRAM)

_METRIC_ORDER = {m.name: i for i, m in enumerate(ALL_METRICS)}


class CardinalityGuard:
    """Applies the limits and accumulates `llm_exporter_series_dropped_total` per (target, reason)."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self._dropped: dict[tuple[str, str], int] = {}

    def count(self, target: str, reason: str, series: int) -> None:
        if series:
            self._dropped[(target, reason)] = self._dropped.get((target, reason), 0) + series

    def dropped(self) -> dict[tuple[str, str], int]:
        """A copy of the cumulative drop counts."""
        return dict(self._dropped)

    def forget(self, live_targets: Iterable[str]) -> None:
        """Drop counters of targets that went away (pod churn must not grow memory forever)."""
        live = set(live_targets)
        for key in [k for k in self._dropped if k[0] not in live]:
            del self._dropped[key]

    def apply(self, target: str, samples: list[NormSample]) -> list[NormSample]:
        """The samples within the caps; the rest counted as dropped.

        Never changes the list it is given, and returns that very list when nothing is dropped
        (the usual case), so a caller may keep what it derived from it (the collector's units).
        """
        samples = self._cap_lora_adapters(target, samples)
        return self._cap_series(target, samples)

    def _cap_lora_adapters(self, target: str, samples: list[NormSample]) -> list[NormSample]:
        adapters = sorted({s.labels[LABEL_ADAPTER] for s in samples if s.labels.get(LABEL_ADAPTER)})
        cap = self.limits.max_lora_adapters_per_target
        if len(adapters) <= cap:
            return samples
        keep = set(adapters[:cap])
        kept = [s for s in samples if not s.labels.get(LABEL_ADAPTER) or s.labels[LABEL_ADAPTER] in keep]
        self.count(target, LORA_ADAPTER_LIMIT, len(samples) - len(kept))
        return kept

    def _cap_series(self, target: str, samples: list[NormSample]) -> list[NormSample]:
        cap = self.limits.max_series_per_target
        if len(samples) <= cap:
            return samples
        units = group_units(samples)
        # Normalized families in conventions order (capacity gauges first), then page order.
        ordered: list[tuple[UnitKey, list[NormSample]]] = sorted(
            units.items(), key=lambda item: _METRIC_ORDER.get(item[0][0], len(_METRIC_ORDER))
        )
        kept: list[NormSample] = []
        for _, unit in ordered:
            if len(kept) + len(unit) <= cap:  # whole histograms or nothing
                kept.extend(unit)
        self.count(target, SERIES_LIMIT, len(samples) - len(kept))
        return kept
