"""Cardinality guard: caps on series and LoRA adapters per target, and a count of what it dropped.

One engine with hundreds of LoRA adapters, or a page that suddenly grows a high-cardinality
label, must not multiply the node's series in Prometheus. The guard keeps a stable subset
(sorted, so the same series survive every cycle) and counts the rest by reason. Over the series
cap every family keeps its first series before any family keeps a second, so one family flooded
with series cannot crowd the target's other families out.

`limit_series` is pure (the collector runs it in the worker thread that parsed the page);
`CardinalityGuard` holds the cumulative counts, touched only on the event loop.

The page itself is bounded earlier, in the parser: at most `max_samples_per_family` samples of
one family are read (`FAMILY_LIMIT`), and NaN/Inf values (`NONFINITE`) and repeated series
(`DUPLICATE_SAMPLE`) never reach an adapter; those are counted per target as samples, not series
(`SAMPLE_DROP_REASONS`, `llm_exporter_samples_dropped_total`).
"""

from __future__ import annotations

from collections.abc import Iterable

from exporter.config import Limits
from exporter.model import NormSample
from exporter.series import group_units
from llmslo.conventions import ALL_METRICS, LABEL_ADAPTER

SERIES_LIMIT = "series_limit"
LORA_ADAPTER_LIMIT = "lora_adapter_limit"
DUPLICATE_SERIES = "duplicate_series"  # two targets produced the same series (same identity labels)
INVALID_HISTOGRAM = "invalid_histogram"
DROP_REASONS = (SERIES_LIMIT, LORA_ADAPTER_LIMIT, DUPLICATE_SERIES, INVALID_HISTOGRAM)

# Samples of a page left out before any adapter sees them (llm_exporter_samples_dropped_total).
NONFINITE = "nonfinite"  # a NaN or +-Inf value (a summary's NaN quantile is legitimate and not counted)
DUPLICATE_SAMPLE = "duplicate"  # a series already on the page, again: the first value is kept
FAMILY_LIMIT = "family_limit"  # samples of one family beyond max_samples_per_family, never parsed
SAMPLE_DROP_REASONS = (NONFINITE, DUPLICATE_SAMPLE, FAMILY_LIMIT)

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
        """The samples within the caps; the rest counted as dropped (`limit_series`, counted here)."""
        kept, drops = limit_series(samples, self.limits)
        for reason, n in drops.items():
            self.count(target, reason, n)
        return kept


def limit_series(samples: list[NormSample], limits: Limits) -> tuple[list[NormSample], dict[str, int]]:
    """The samples within the caps, and how many were dropped by reason. Pure: safe in any thread.

    Never changes the list it is given, and returns that very list when nothing is dropped
    (the usual case), so a caller may keep what it derived from it (the collector's units).
    """
    drops: dict[str, int] = {}
    kept = _cap_lora_adapters(samples, limits.max_lora_adapters_per_target, drops)
    return _cap_series(kept, limits.max_series_per_target, drops), drops


def _cap_lora_adapters(samples: list[NormSample], cap: int, drops: dict[str, int]) -> list[NormSample]:
    adapters = sorted({s.labels[LABEL_ADAPTER] for s in samples if s.labels.get(LABEL_ADAPTER)})
    if len(adapters) <= cap:
        return samples
    keep = set(adapters[:cap])
    kept = [s for s in samples if not s.labels.get(LABEL_ADAPTER) or s.labels[LABEL_ADAPTER] in keep]
    drops[LORA_ADAPTER_LIMIT] = len(samples) - len(kept)
    return kept


def _cap_series(samples: list[NormSample], cap: int, drops: dict[str, int]) -> list[NormSample]:
    """Whole units, fairly: every family's first unit (conventions order), then every family's second, ...

    So the series a flooded family brings beyond its share are the ones dropped, and the same units
    survive every cycle while the page keeps its order.
    """
    if len(samples) <= cap:
        return samples
    other = len(_METRIC_ORDER)
    taken: dict[str, int] = {}
    ranked: list[tuple[int, int, int, list[NormSample]]] = []
    for position, (key, unit) in enumerate(group_units(samples).items()):
        family = key[0]
        rank = taken.get(family, 0)
        taken[family] = rank + 1
        ranked.append((rank, _METRIC_ORDER.get(family, other), position, unit))
    ranked.sort(key=lambda entry: entry[:3])
    kept: list[NormSample] = []
    for *_, unit in ranked:
        if len(kept) + len(unit) <= cap:  # whole histograms or nothing
            kept.extend(unit)
    drops[SERIES_LIMIT] = drops.get(SERIES_LIMIT, 0) + len(samples) - len(kept)
    return kept
