"""What every engine adapter shares: the Adapter record, reading parsed families, and building output.

Adapters are pure: they read families and return a fresh list of samples. The builder below sums
samples that land on the same normalized series, which is how adapters drop engine-internal labels
(SGLang's `pid` and ranks, vLLM's data-parallel `engine` index, `is_streaming`) without emitting
duplicate series.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from exporter.model import MetricFamily, NormSample, Sample
from llmslo import conventions as c
from llmslo.gofloat import client_float

LE = c.LABEL_LE
AdaptFn = Callable[[Mapping[str, MetricFamily], Mapping[str, str]], list[NormSample]]


@dataclass(frozen=True)
class Adapter:
    """One engine kind: the family names it reads (so the parser can skip the rest), its pure mapping, and the
    family names that identify it on a page (for `engine: auto`): each adapter says what is its own."""

    kind: str
    wanted: frozenset[str]
    adapt: AdaptFn
    detect_prefixes: tuple[str, ...] = ()  # family-name prefixes only this engine writes
    detect_names: frozenset[str] = frozenset()  # or whole family names, where the engine has no prefix of its own

    def claims(self, family: str) -> bool:
        """Whether a family of this name says the page is this engine's."""
        return family.startswith(self.detect_prefixes) or family in self.detect_names


# ------------------------------------------------------------------------------------------
# Reading families
# ------------------------------------------------------------------------------------------
def first_family(families: Mapping[str, MetricFamily], *names: str) -> MetricFamily | None:
    """The first of `names` the page has: how adapters prefer new names over old ones, never both."""
    for name in names:
        fam = families.get(name)
        if fam is not None and fam.samples:
            return fam
    return None


def values(fam: MetricFamily | None) -> list[Sample]:
    """The value-carrying samples of a gauge or counter family: `_created` companions are dropped.

    Suffix-agnostic on purpose: prometheus_client renames TGI's `tgi_request_count` to
    `tgi_request_count_total`, a faster parser may not; both are the family's value.
    """
    if fam is None:
        return []
    name = fam.name
    end = len(name)
    kept = ("_total",) if name.endswith("_created") else ("", "_total")  # no name ending in `_created`
    return [s for s in fam.samples if s.name[end:] in kept]


def total(fam: MetricFamily | None, where: Callable[[dict[str, str]], bool] | None = None) -> float | None:
    """Sum of a family's values (optionally only matching samples); None when there is nothing to sum."""
    picked = [s.value for s in values(fam) if where is None or where(s.labels)]
    return math.fsum(picked) if picked else None


def parse_edge(text: str | None) -> float | None:
    """A bucket's `le` as a number (+Inf included); None when missing or not a number."""
    if text is None:
        return None
    try:
        edge = float(text)
    except ValueError:
        return None
    return None if math.isnan(edge) else edge


def parse_number(text: str | None) -> float | None:
    """A label value such as num_gpu_blocks="27102" as a number; None for "None", "", infinities or garbage."""
    value = parse_edge(text)
    return value if value is not None and math.isfinite(value) else None


# Engines' own spellings of the normalized reasons. Anything else is counted as `error`: a reason the
# exporter does not know must never pass for a success (fail-safe), and `error` is what slogen's
# availability SLI counts as bad (FINISHED_BAD_REASONS), so a new failure mode burns budget at once.
_FINISHED_ALIASES: dict[str, str] = {
    c.FINISHED_STOP: c.FINISHED_STOP,
    c.FINISHED_LENGTH: c.FINISHED_LENGTH,
    c.FINISHED_ABORT: c.FINISHED_ABORT,
    c.FINISHED_ERROR: c.FINISHED_ERROR,
    c.FINISHED_COMPLETED: c.FINISHED_COMPLETED,
    # stop conditions: vLLM's `repetition` (a repetitive-pattern detector stopped the request)
    "repetition": c.FINISHED_STOP, "stop_sequence": c.FINISHED_STOP, "eos_token": c.FINISHED_STOP,
    "eos": c.FINISHED_STOP, "end_id": c.FINISHED_STOP, "stop_words": c.FINISHED_STOP,
    # cancelled by the client (trtllm-serve writes `cancelled`)
    "cancelled": c.FINISHED_ABORT, "canceled": c.FINISHED_ABORT, "aborted": c.FINISHED_ABORT,
    # failures: trtllm-serve's `timeout` is a request its executor timed out (TIMED_OUT), never an answer
    "failed": c.FINISHED_ERROR, "failure": c.FINISHED_ERROR, "timeout": c.FINISHED_ERROR,
    "timed_out": c.FINISHED_ERROR,
}


def normalize_finished_reason(raw: str, extra: Mapping[str, str] | None = None) -> str:
    """Map an engine's finish reason onto conventions.FINISHED_REASONS; `extra` adds an engine's own spellings.

    Fail-safe: an empty, unknown or new reason is `error`, never a success. Engines add reasons
    (trtllm-serve added `timeout` and `not_finished`); until the exporter is taught one, requests
    finishing that way count against availability, which is loud and safe, rather than silently good.
    """
    reason = raw.strip().lower()
    if extra and reason in extra:
        return extra[reason]
    return _FINISHED_ALIASES.get(reason, c.FINISHED_ERROR)


def bounded(raw: str | None, known: Mapping[str, str]) -> str:
    """A label value read from a page, as one of the values we know (`known`: the engine's spelling -> ours), else
    conventions.OTHER: a page (a new release, or a hostile one) cannot add series by writing new values."""
    return known.get(raw or "", c.OTHER)


def position(raw: str | None) -> str:
    """A draft position read from a page: "0" .. SPEC_POSITIONS - 1 written canonically, else conventions.OTHER."""
    text = (raw or "").strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 3 or int(text) >= c.SPEC_POSITIONS:
        return c.OTHER
    return str(int(text))


# ------------------------------------------------------------------------------------------
# Building output
# ------------------------------------------------------------------------------------------
_EDGE_TEXTS: dict[float, str] = {}  # bucket edge -> its `le` text; engines use a few dozen edges


def _edge_text(edge: float) -> str:
    """`le` text of a bucket edge (prometheus_client's float text), remembered: every cycle asks again."""
    if edge == 0:  # 0.0 and -0.0 are one dictionary key but two texts
        return client_float(edge)
    text = _EDGE_TEXTS.get(edge)
    if text is None:
        if len(_EDGE_TEXTS) >= 4096:  # edges that are not engine constants (unit-converted oddities)
            _EDGE_TEXTS.clear()
        text = _EDGE_TEXTS[edge] = client_float(edge)
    return text


@dataclass
class _Histogram:
    buckets: dict[float, float] = field(default_factory=dict)
    sum: float | None = None
    count: float | None = None


class Output:
    """Collects normalized samples for one page; same series added twice are summed."""

    def __init__(self, identity: Mapping[str, str], kind: str) -> None:
        self._identity = identity
        self._kind = kind
        # Identity label values, looked up once: labels() runs for every value the adapter adds.
        self._engine = identity.get(c.LABEL_ENGINE) or kind
        self._default_model = identity.get(c.LABEL_MODEL, "")
        self._pod = identity.get(c.LABEL_POD, "")
        self._namespace = identity.get(c.LABEL_NAMESPACE, "")
        self._node = identity.get(c.LABEL_NODE, "")
        self._scalars: dict[tuple, tuple[c.MetricDef, dict[str, str], float]] = {}
        self._histograms: dict[tuple, tuple[c.MetricDef, dict[str, str], _Histogram]] = {}

    def model(self, page_model: str | None) -> str:
        """The model label: the page's own when it names one, else the identity's."""
        return page_model or self._default_model

    def labels(self, model: str | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        out = {
            c.LABEL_ENGINE: self._engine,
            c.LABEL_MODEL: model or self._default_model,
            c.LABEL_POD: self._pod,
            c.LABEL_NAMESPACE: self._namespace,
            c.LABEL_NODE: self._node,
        }
        if extra:
            out.update(extra)
        return out

    @staticmethod
    def _key(metric: c.MetricDef, labels: Mapping[str, str]) -> tuple:
        return (metric.name, tuple(sorted(labels.items())))

    def add(self, metric: c.MetricDef, value: float | None, model: str | None = None,
            extra: Mapping[str, str] | None = None) -> None:
        """Add a gauge or counter value; a second value for the same series is summed with the first."""
        if value is None:
            return
        labels = self.labels(model, extra)
        key = self._key(metric, labels)
        value = float(value)
        if key in self._scalars:
            value += self._scalars[key][2]
        self._scalars[key] = (metric, labels, value)

    def put(self, metric: c.MetricDef, value: float | None, model: str | None = None,
            extra: Mapping[str, str] | None = None) -> None:
        """Set a value, replacing any earlier one (for ratios and sizes, which must not be summed)."""
        if value is None:
            return
        labels = self.labels(model, extra)
        self._scalars[self._key(metric, labels)] = (metric, labels, float(value))

    def histogram_part(self, metric: c.MetricDef, model: str | None, extra: Mapping[str, str] | None = None, *,
                       bucket: tuple[float, float] | None = None, sum: float | None = None,
                       count: float | None = None) -> None:
        """Add a bucket (edge, cumulative count), a sum or a count to a histogram series.

        Parts of the same series are summed, so series that differ only in dropped labels merge.
        """
        hist = self._histogram(metric, model, extra)
        if bucket is not None:
            edge, cumulative = bucket
            hist.buckets[edge] = hist.buckets.get(edge, 0.0) + float(cumulative)
        if sum is not None:
            hist.sum = (hist.sum or 0.0) + sum
        if count is not None:
            hist.count = (hist.count or 0.0) + count

    def _histogram(self, metric: c.MetricDef, model: str | None, extra: Mapping[str, str] | None) -> _Histogram:
        """The histogram series these labels name, created empty on first use."""
        labels = self.labels(model, extra)
        key = self._key(metric, labels)
        entry = self._histograms.get(key)
        if entry is None:
            entry = self._histograms[key] = (metric, labels, _Histogram())
        return entry[2]

    def histogram(self, metric: c.MetricDef, fam: MetricFamily | None, *, divisor: float = 1.0,
                  model_label: str | None = None, keep: Iterable[str] = (),
                  where: Callable[[dict[str, str]], bool] | None = None,
                  model_of: Callable[[dict[str, str]], str | None] | None = None) -> None:
        """Re-emit an engine histogram under a normalized name, keeping its bucket edges.

        `divisor` converts units (1000 for milliseconds, 1e6 for microseconds): bucket edges and the
        sum are divided, counts are not. Labels other than the model and `keep` are summed away.
        """
        if fam is None:
            return
        keep = tuple(keep)
        # A histogram's many lines name few series: resolve each (model, kept labels) once, not per bucket.
        series: dict[tuple, _Histogram] = {}
        name_end = len(fam.name)
        for s in fam.samples:
            labels = s.labels
            if where is not None and not where(labels):
                continue
            suffix = s.name[name_end:]
            if suffix == "_bucket":
                try:  # parse_edge's reading, in line: this runs for every bucket line
                    edge = float(labels[LE])
                except (KeyError, ValueError):
                    continue
                if edge != edge:  # NaN
                    continue
            elif suffix != "_sum" and suffix != "_count":
                continue
            model = model_of(labels) if model_of else (labels.get(model_label) if model_label else None)
            kept = tuple([labels.get(k, "") for k in keep]) if keep else ()
            hist = series.get((model, kept))
            if hist is None:
                hist = series[(model, kept)] = self._histogram(metric, model, dict(zip(keep, kept, strict=True)))
            if suffix == "_bucket":
                edge /= divisor
                hist.buckets[edge] = hist.buckets.get(edge, 0.0) + float(s.value)
            elif suffix == "_sum":
                hist.sum = (hist.sum or 0.0) + s.value / divisor
            else:
                hist.count = (hist.count or 0.0) + s.value

    def samples(self) -> list[NormSample]:
        out = [NormSample(metric, labels, value) for metric, labels, value in self._scalars.values()]
        for metric, labels, hist in self._histograms.values():
            buckets = dict(hist.buckets)
            if math.inf not in buckets and hist.count is not None:
                buckets[math.inf] = hist.count  # the text format requires +Inf; it equals _count
            edge_texts = _EDGE_TEXTS
            for edge in sorted(buckets):
                text = edge_texts.get(edge) if edge else None  # 0.0 and -0.0: one key, two texts
                out.append(NormSample(metric, {**labels, LE: text or _edge_text(edge)}, buckets[edge], "_bucket"))
            if hist.sum is not None:
                out.append(NormSample(metric, dict(labels), hist.sum, "_sum"))
            count = hist.count if hist.count is not None else buckets.get(math.inf)
            if count is not None:
                out.append(NormSample(metric, dict(labels), count, "_count"))
        return out
