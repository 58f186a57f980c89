"""The tap's metrics: names from llmslo.conventions, bucket edges that include every threshold.

A latency SLI computed as `bucket{le=threshold} / count` is exact only when the threshold
is a bucket edge, so each histogram's edges are a default ladder united with every threshold
configured for it (goodput classes and `llmslo/latency` SLIs with `source: tap`), as the
exact floats parsed from the SLO files. Latency histograms describe requests that completed
(`outcome="ok"`); the outcome counter covers every request.

Each histogram series carries its edges' short hash (conventions.LABEL_BUCKETS). A reload that changes
a threshold changes the edges, so a new set of series starts, `_count` and every `_bucket` at 0 together,
and the old set leaves the page (Prometheus keeps its history). Without it the new threshold's bucket
would be born at the reload while `_count` went on counting the requests before it, and the SLI's
`count - bucket{le=threshold}` would take every one of them for a slow request.

The values live in plain Python objects, one `Series` per (model, slo_class), rather than in
prometheus_client's metric objects: recording is a few list and dict updates with no locks,
and the page is rendered by exporter.tap.exposition in slices that never hold the event loop
for long (prometheus_client renders a whole registry in one call: up to 80 ms for 64 models,
during which no relayed chunk moves). `registry` still offers the same families to
prometheus_client (tests, tools) through a collector over these values.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from exporter.tap.classes import SloConfig
from exporter.tap.genai import GenAIHistograms
from exporter.tap.histogram import Histogram
from exporter.tap.models import MAX_LABEL_CHARS, ModelNames
from exporter.tap.timing import Timings
from llmslo import conventions as C
from llmslo.bucket_edges import TAP_LATENCY_LADDER, TAP_TPOT_LADDER
from llmslo.gofloat import client_float

# Seconds; defined in llmslo/bucket_edges.py, which slogen's generated dashboard tests read too.
LATENCY_LADDER, TPOT_LADDER = TAP_LATENCY_LADDER, TAP_TPOT_LADDER

OVERFLOW_MODEL = "__other__"  # the model label of every request whose model may not be a label value
RESERVED_PREFIX = "__"  # label values of this form are the tap's own (OVERFLOW_MODEL)


def served_label(name: str) -> str:
    """The label value of an admitted model name: the name itself, but a name starting with two
    underscores gets one more, so that an upstream model called `__other__` is not merged into the
    overflow bucket (it is `___other__`). Injective: no two names share a value, none is OVERFLOW_MODEL."""
    return "_" + name if name.startswith(RESERVED_PREFIX) else name
MAX_MODELS = 64  # distinct model label values at most, the last guard behind exporter.tap.models

# The histogram families, in page order, and the SLO thresholds each must have as bucket edges.
HISTOGRAMS: tuple[tuple[C.MetricDef, str], ...] = (
    (C.TAP_TTFT, "ttft"), (C.TAP_TPOT, "tpot"), (C.TAP_E2E, "e2e"), (C.TAP_TTFB, "ttfb"),
)


def bucket_edges(ladder: Iterable[float], thresholds: Iterable[float]) -> tuple[float, ...]:
    """Sorted union of a ladder and the thresholds (exact floats, duplicates removed)."""
    return tuple(sorted(set(ladder) | set(thresholds)))


def histogram_edges(slo: SloConfig) -> dict[str, tuple[float, ...]]:
    """Each histogram's bucket edges (HISTOGRAMS' keys): its ladder and every threshold configured for it."""
    th = slo.thresholds
    return {
        "ttft": bucket_edges(LATENCY_LADDER, th.get("ttft", ())),
        "tpot": bucket_edges(TPOT_LADDER, th.get("tpot", ())),
        "e2e": bucket_edges(LATENCY_LADDER, th.get("e2e", ())),
        # TTFB bounds TTFT from below; TTFT thresholds are the edges worth reading it at.
        "ttfb": bucket_edges(LATENCY_LADDER, th.get("ttft", ())),
    }


def le_label(seconds: float) -> str:
    """How a bucket edge appears in the `le` label (Go float formatting: 0.5 -> "0.5", 1 -> "1.0")."""
    return client_float(seconds)


def edges_id(edges: Iterable[float]) -> str:
    """The LABEL_BUCKETS value of a histogram with these edges: 8 hex digits of a SHA-256 of their `le`
    spellings. Equal edges give equal values (a reload that keeps them keeps the series); 32 bits keep
    the label short while two configurations a tap runs one after the other almost never collide."""
    return hashlib.sha256(",".join(le_label(e) for e in edges).encode()).hexdigest()[:8]


class Series:
    """Everything counted for one (model, slo_class).

    `changes` goes up on every update; the renderer keeps this series' rendered lines with the
    `changes` they were rendered at and renders again only when it moved, so a scrape costs in
    proportion to the series that changed since the last one.
    """

    __slots__ = (
        "model", "slo_class", "histograms", "goodput", "requests", "tokens", "good_tokens", "usage_rejected",
        "changes", "rendered", "rendered_at",
    )

    def __init__(self, model: str, slo_class: str, hist_edges: tuple[tuple[float, ...], ...] = ()) -> None:
        self.model = model
        self.slo_class = slo_class
        # ttft, tpot, e2e, ttfb (HISTOGRAMS order), goodput and every outcome: at 0 from the series' birth,
        # so that the first request of each kind is an increase that rate() and increase() count (a series
        # born at 1 is not: its first sample has nothing before it).
        self.histograms: tuple[Histogram, ...] = tuple(Histogram(edges) for edges in hist_edges)
        self.goodput = 0
        self.requests: dict[str, int] = dict.fromkeys(C.OUTCOMES, 0)  # outcome -> requests
        self.tokens: dict[str, int] = {}  # usage_source -> output tokens
        self.good_tokens: dict[str, int] = {}
        self.usage_rejected: int | None = None  # None: never counted, so no series yet
        self.changes = 0
        self.rendered: Any = None  # the renderer's cache (exporter.tap.exposition)
        self.rendered_at = -1


class TapMetrics:
    """The tap's counters and histograms, one request at a time, plus its self-metrics."""

    def __init__(
        self, slo: SloConfig, registry: CollectorRegistry | None = None, max_models: int = MAX_MODELS,
        names: ModelNames | None = None, genai: bool = False,
    ) -> None:
        """`names` decides which models may be label values (default: only the classes' model globs); `genai`: also
        keep the OpenTelemetry GenAI histograms (--genai-names, exporter.tap.genai)."""
        self.genai = GenAIHistograms() if genai else None
        self.max_models = max_models
        self.names = names if names is not None else ModelNames(slo)
        self.edges = histogram_edges(slo)
        self._hist_edges = tuple(self.edges[key] for _, key in HISTOGRAMS)
        self.bucket_ids = tuple(edges_id(e) for e in self._hist_edges)  # LABEL_BUCKETS, in HISTOGRAMS order
        self.series: dict[tuple[str, str], Series] = {}
        self.slo = slo
        self.config_reload_failures = 0  # conventions.TAP_CONFIG_RELOAD_FAILURES
        self._primed_from: frozenset[str] | None = None
        self.refusals: dict[str, int] = dict.fromkeys(C.REFUSED_REASONS, 0)  # every reason's series from the start
        self.headers_ignored: dict[str, int] = dict.fromkeys(C.SLO_HEADER_REASONS, 0)  # TAP_SLO_HEADERS_IGNORED
        self._models: dict[str, str] = {}  # admitted name -> its label value (served_label)
        self._label_values: set[str] = set()
        # Timed requests in flight whose objective is already lost, by (model, slo_class): the proxy's
        # TapProxy.in_flight_late, asked at scrape time; None (no proxy): every series at 0.
        self.late_source: Callable[[], Mapping[tuple[str, str], int]] | None = None
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.registry.register(_Collector(self))

    def set_slo(self, slo: SloConfig) -> list[str]:
        """Count by a reloaded configuration from now on; returns the histogram families whose bucket
        edges changed. In those, every series is replaced by a new one at 0 with the new edges and their
        LABEL_BUCKETS value, so the page shows the new set (its first request an increase) and no longer
        the old one; the other histograms and every counter go on. Classes the new files add get their
        series at the next page; a removed class's series stay, no longer counting."""
        edges = histogram_edges(slo)
        changed = [key for _, key in HISTOGRAMS if edges[key] != self.edges[key]]
        self.edges, self.slo = edges, slo
        self._hist_edges = tuple(edges[key] for _, key in HISTOGRAMS)
        self.bucket_ids = tuple(edges_id(e) for e in self._hist_edges)
        self.names.set_classes(slo)
        self._primed_from = None  # prime() again: the new classes' series
        if changed:
            fresh = [i for i, (_, key) in enumerate(HISTOGRAMS) if key in changed]
            for series in self.series.values():
                if series.histograms:
                    hists = list(series.histograms)
                    for i in fresh:
                        hists[i] = Histogram(self._hist_edges[i])
                    series.histograms = tuple(hists)
                    series.changes += 1
        return [d.name for d, key in HISTOGRAMS if key in changed]

    # -- label values ------------------------------------------------------------------------
    def model_label(self, model: str) -> str:
        """The request's model as a label value, or OVERFLOW_MODEL: a name the upstream does not serve
        and no class glob matches, a name too long, or one past max_models (clients choose it)."""
        if len(model) > MAX_LABEL_CHARS:  # before hashing it: a client may send megabytes
            return OVERFLOW_MODEL
        label = self._models.get(model)
        if label is not None:
            return label
        if len(self._models) >= self.max_models or not self.names.admits(model):
            return OVERFLOW_MODEL
        label = self._models[model] = served_label(model)
        self._label_values.add(label)
        return label

    def _for(self, model: str, slo_class: str) -> Series:
        key = (model, slo_class)
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = Series(model, slo_class, self._hist_edges)
        return s

    def prime(self) -> None:
        """Create, at 0, the series that requests will count in, before their first request: every class's
        under OVERFLOW_MODEL, and each model the upstream serves (as it is admitted to the label set) under
        the class its name maps to. Called before each page is rendered; it costs nothing unless the
        served list changed. A class chosen by a header for another model gets its series on first use
        (at 0 for every outcome but that one)."""
        if self._primed_from is None:
            self._primed_from = frozenset()
            for cls in self.slo.class_names:
                self._for(OVERFLOW_MODEL, cls)
        served = getattr(self.names.served, "names", None)
        if not served or served is self._primed_from:
            return
        self._primed_from = served
        for name in sorted(served):  # sorted: which names get the max_models slots does not vary
            if len(self._models) >= self.max_models:
                break
            label = self.model_label(name)
            if label != OVERFLOW_MODEL:
                self._for(label, self.slo.class_for_model(name).name)

    def in_flight_late(self) -> list[tuple[Series, int]]:
        """The in-flight-late gauge: every series' count (0 for most), read from late_source now. A late
        request's (model, class) gets its series here if it has none yet (the label limits hold)."""
        late = self.late_source() if self.late_source is not None else {}
        for key in late:
            self._for(*key)
        return [(s, late.get((s.model, s.slo_class), 0)) for s in self.series.values()]

    # -- recording ---------------------------------------------------------------------------
    def record(self, model: str, slo_class: str, outcome: str, t: Timings, good: bool, path: str = "") -> None:
        """Count one finished request; `model` should already have passed through model_label(); `path`: the
        request's (the GenAI operation, with --genai-names)."""
        if self.genai is not None:
            self.genai.record(model, path, outcome, t)
        s = self._for(model, slo_class)
        s.changes += 1
        s.requests[outcome] = s.requests.get(outcome, 0) + 1
        n_out = t.n_out
        if n_out:
            s.tokens[t.usage_source] = s.tokens.get(t.usage_source, 0) + n_out
        if outcome != C.OUTCOME_OK:
            return
        ttft, tpot, e2e, ttfb = s.histograms
        if t.ttft is not None:
            ttft.observe(t.ttft)
        if t.tpot is not None:
            tpot.observe(t.tpot)
        if t.e2e is not None:
            e2e.observe(t.e2e)
        if t.ttfb is not None:
            ttfb.observe(t.ttfb)
        if good:
            s.goodput += 1
            if n_out:
                s.good_tokens[t.usage_source] = s.good_tokens.get(t.usage_source, 0) + n_out

    def usage_rejected(self, model: str, slo_class: str) -> None:
        """The engine's usage.completion_tokens was ignored as implausible for one request. `model`
        may be the request's own (it goes through model_label() here) or a label it returned."""
        label = model if model == OVERFLOW_MODEL or model in self._label_values else self.model_label(model)
        s = self._for(label, slo_class)
        s.changes += 1
        s.usage_rejected = (s.usage_rejected or 0) + 1

    def refused(self, reason: str) -> None:
        """The tap refused a connection or a request itself; `reason` is one of conventions.REFUSED_REASONS."""
        if reason not in self.refusals:
            raise ValueError(f"{reason!r} is not one of conventions.REFUSED_REASONS")
        self.refusals[reason] += 1


    def slo_headers_ignored(self, reasons: Iterable[str]) -> None:
        """A trusted request's x-slo-* headers not taken as they came (exporter.tap.objectives), one per reason."""
        for reason in reasons:
            if reason not in self.headers_ignored:
                raise ValueError(f"{reason!r} is not one of conventions.SLO_HEADER_REASONS")
            self.headers_ignored[reason] += 1


class _Collector:
    """The same values as prometheus_client families, for `generate_latest(metrics.registry)`
    (tests and tools; the tap serves its page through exporter.tap.exposition instead)."""

    def __init__(self, metrics: TapMetrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        self.m.prime()
        late = self.m.in_flight_late()
        series = list(self.m.series.values())
        for i, (d, _) in enumerate(HISTOGRAMS):
            fam = HistogramMetricFamily(d.name, d.help, labels=d.labels)
            for s in series:
                if s.histograms:
                    h = s.histograms[i]
                    les = [le_label(e) for e in h.edges] + ["+Inf"]
                    fam.add_metric([s.model, s.slo_class, self.m.bucket_ids[i]], list(zip(les, h.cumulative(), strict=True)),
                                   h.sum)
            yield fam
        yield self._counter(C.TAP_REQUESTS, ((s, (o,), n) for s in series for o, n in s.requests.items()))
        yield self._counter(C.GOODPUT_REQUESTS, ((s, (), s.goodput) for s in series if s.histograms))
        yield self._counter(C.OUTPUT_TOKENS, ((s, (u,), n) for s in series for u, n in s.tokens.items()))
        yield self._counter(C.GOODPUT_TOKENS, ((s, (u,), n) for s in series for u, n in s.good_tokens.items()))
        yield self._counter(
            C.TAP_USAGE_REJECTED, ((s, (), s.usage_rejected) for s in series if s.usage_rejected is not None)
        )
        fam = CounterMetricFamily(C.TAP_REFUSALS.name, C.TAP_REFUSALS.help, labels=C.TAP_REFUSALS.labels)
        for reason, n in self.m.refusals.items():
            fam.add_metric([reason], n)
        yield fam
        fam = CounterMetricFamily(C.TAP_SLO_HEADERS_IGNORED.name, C.TAP_SLO_HEADERS_IGNORED.help,
                                  labels=C.TAP_SLO_HEADERS_IGNORED.labels)
        for reason, n in self.m.headers_ignored.items():
            fam.add_metric([reason], n)
        yield fam
        d = C.TAP_IN_FLIGHT_LATE
        gauge = GaugeMetricFamily(d.name, d.help, labels=d.labels)
        for s, n in late:
            gauge.add_metric([s.model, s.slo_class], n)
        yield gauge
        d = C.TAP_CONFIG_INFO
        info = GaugeMetricFamily(d.name, d.help, labels=d.labels)
        info.add_metric([self.m.slo.hash], 1)
        yield info
        d = C.TAP_CONFIG_RELOAD_FAILURES
        fam = CounterMetricFamily(d.name, d.help)
        fam.add_metric([], self.m.config_reload_failures)
        yield fam
        if self.m.genai is not None:
            yield from self.m.genai.collect()

    @staticmethod
    def _counter(d: C.MetricDef, values: Iterable[tuple[Series, tuple[str, ...], int]]) -> Metric:
        fam = CounterMetricFamily(d.name, d.help, labels=d.labels)
        for s, extra, n in values:
            fam.add_metric([s.model, s.slo_class, *extra], n)
        return fam
