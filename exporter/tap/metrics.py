"""The tap's Prometheus metrics: names from llmslo.conventions, bucket edges that include every threshold.

A latency SLI computed as `bucket{le=threshold} / count` is exact only when the threshold
is a bucket edge, so each histogram's edges are a default ladder united with every threshold
configured for it (goodput classes and `llmslo/latency` SLIs with `source: tap`), as the
exact floats parsed from the SLO files. Latency histograms describe requests that completed
(`outcome="ok"`); the outcome counter covers every request.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.utils import floatToGoString

from exporter.tap.classes import SloConfig
from exporter.tap.timing import Timings
from llmslo import conventions as C

# Seconds. Chosen to resolve interactive objectives (tens to hundreds of ms) and long generations.
LATENCY_LADDER = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0,
    30.0, 60.0, 120.0, 300.0,
)
TPOT_LADDER = (
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.125, 0.15, 0.2, 0.3,
    0.5, 1.0, 2.5,
)

OVERFLOW_MODEL = "__other__"  # model label value once MAX_MODELS distinct models have been seen
MAX_MODELS = 64


def bucket_edges(ladder: Iterable[float], thresholds: Iterable[float]) -> tuple[float, ...]:
    """Sorted union of a ladder and the thresholds (exact floats, duplicates removed)."""
    return tuple(sorted(set(ladder) | set(thresholds)))


def le_label(seconds: float) -> str:
    """How a bucket edge appears in the `le` label (Go float formatting: 0.5 -> "0.5", 1 -> "1.0")."""
    return floatToGoString(seconds)


@dataclass(frozen=True)
class _Series:
    """The label children of one (model, slo_class), resolved once and reused."""

    ttft: Histogram
    tpot: Histogram
    e2e: Histogram
    ttfb: Histogram
    goodput_requests: Counter


class TapMetrics:
    """Registers the tap families on a registry and records one finished request at a time."""

    def __init__(self, slo: SloConfig, registry: CollectorRegistry | None = None, max_models: int = MAX_MODELS) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.max_models = max_models
        th = slo.thresholds
        self.edges = {
            "ttft": bucket_edges(LATENCY_LADDER, th.get("ttft", ())),
            "tpot": bucket_edges(TPOT_LADDER, th.get("tpot", ())),
            "e2e": bucket_edges(LATENCY_LADDER, th.get("e2e", ())),
            # TTFB bounds TTFT from below; TTFT thresholds are the edges worth reading it at.
            "ttfb": bucket_edges(LATENCY_LADDER, th.get("ttft", ())),
        }
        r = self.registry

        def hist(d: C.MetricDef, key: str) -> Histogram:
            return Histogram(d.name, d.help, d.labels, registry=r, buckets=self.edges[key])

        self._ttft = hist(C.TAP_TTFT, "ttft")
        self._tpot = hist(C.TAP_TPOT, "tpot")
        self._e2e = hist(C.TAP_E2E, "e2e")
        self._ttfb = hist(C.TAP_TTFB, "ttfb")
        self._requests = Counter(C.TAP_REQUESTS.name, C.TAP_REQUESTS.help, C.TAP_REQUESTS.labels, registry=r)
        self._goodput = Counter(C.GOODPUT_REQUESTS.name, C.GOODPUT_REQUESTS.help, C.GOODPUT_REQUESTS.labels, registry=r)
        self._tokens = Counter(C.OUTPUT_TOKENS.name, C.OUTPUT_TOKENS.help, C.OUTPUT_TOKENS.labels, registry=r)
        self._good_tokens = Counter(C.GOODPUT_TOKENS.name, C.GOODPUT_TOKENS.help, C.GOODPUT_TOKENS.labels, registry=r)
        self._series: dict[tuple[str, str], _Series] = {}
        # Label children of the counters with a third label, resolved once each: `labels()`
        # validates and hashes its arguments under a lock on every call.
        self._requests_by: dict[tuple[str, str, str], Counter] = {}
        self._tokens_by: dict[tuple[str, str, str], Counter] = {}
        self._good_tokens_by: dict[tuple[str, str, str], Counter] = {}
        self._models: set[str] = set()

    def model_label(self, model: str) -> str:
        """The request's model, or OVERFLOW_MODEL once too many distinct ones were seen (clients choose it)."""
        if model in self._models:
            return model
        if len(self._models) >= self.max_models:
            return OVERFLOW_MODEL
        self._models.add(model)
        return model

    def _for(self, model: str, slo_class: str) -> _Series:
        key = (model, slo_class)
        s = self._series.get(key)
        if s is None:
            s = _Series(
                self._ttft.labels(model, slo_class),
                self._tpot.labels(model, slo_class),
                self._e2e.labels(model, slo_class),
                self._ttfb.labels(model, slo_class),
                self._goodput.labels(model, slo_class),
            )
            self._series[key] = s
        return s

    def record(self, model: str, slo_class: str, outcome: str, t: Timings, good: bool) -> None:
        """Count one finished request; `model` should already have passed through model_label()."""
        _child(self._requests, self._requests_by, (model, slo_class, outcome)).inc()
        if t.n_out:
            _child(self._tokens, self._tokens_by, (model, slo_class, t.usage_source)).inc(t.n_out)
        if outcome != C.OUTCOME_OK:
            return
        s = self._for(model, slo_class)
        for hist, value in ((s.ttfb, t.ttfb), (s.ttft, t.ttft), (s.tpot, t.tpot), (s.e2e, t.e2e)):
            if value is not None:
                hist.observe(value)
        if good:
            s.goodput_requests.inc()
            if t.n_out:
                _child(self._good_tokens, self._good_tokens_by, (model, slo_class, t.usage_source)).inc(t.n_out)


def _child(counter: Counter, cache: dict[tuple[str, str, str], Counter], key: tuple[str, str, str]) -> Counter:
    """`counter.labels(*key)`, looked up once per distinct key (the model label is bounded by
    MAX_MODELS, classes and outcomes are few, so the cache stays small)."""
    child = cache.get(key)
    if child is None:
        child = cache[key] = counter.labels(*key)
    return child
