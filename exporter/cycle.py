"""What a collection cycle does with its pages once read, apart from any event loop; and `--once`'s cycle over
file:// pages, run in the calling thread.

Each page is parsed once (keeping only the families its adapter reads, at most `max_samples_per_family`
samples of each, and no NaN/Inf value or repeated series: see promtext.parse_page) and adapted, and its
samples grouped into units (one gauge, counter or whole histogram): the histogram check, the cardinality caps
and the de-duplication across targets work on those units. `exporter.collector.Collector` adds the fetching
(HTTP, files, NVML) on an event loop; `PageCycle.collect_files` reads saved pages with a thread each and no
loop, so `--once` over files never imports asyncio (a third of its start-up).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING

from exporter import adapters, logs, procinfo, promtext
from exporter.config import AUTO_KIND, ExporterConfig, TargetConfig
from exporter.guard import (
    DROP_REASONS,
    DUPLICATE_SAMPLE,
    DUPLICATE_SERIES,
    FAMILY_LIMIT,
    INVALID_HISTOGRAM,
    NONFINITE,
    SAMPLE_DROP_REASONS,
    CardinalityGuard,
    limit_series,
)
from exporter.model import NormSample
from exporter.series import UnitKey, complete_histogram, group_units, with_every_reason
from exporter.sources import (
    ADAPTER_ERROR,
    NO_ENGINE_METRICS,
    PARSE_ERROR,
    TRUNCATED,
    UNKNOWN_ENGINE,
    FetchError,
)
from llmslo import conventions as c

if TYPE_CHECKING:  # the kubelet side is the collector's, with GPUs: never imported here
    from exporter.gpu.podresources import PodMapper

Parsed = tuple[str, dict[UnitKey, list[NormSample]], list[NormSample], dict[str, int]]


@dataclass(frozen=True)
class TargetStatus:
    """What the last cycle learned about one target."""

    target: str
    engine: str
    up: bool
    reason: str  # why it is down; "" when up
    duration_s: float
    series: int


@dataclass(frozen=True)
class Snapshot:
    """Everything one completed cycle produced; /metrics renders exactly this."""

    samples: tuple[NormSample, ...]
    targets: tuple[TargetStatus, ...]
    gpus_up: int
    cycle: int
    completed_at: float
    duration_s: float

    @property
    def any_source_read(self) -> bool:
        return self.gpus_up > 0 or any(t.up for t in self.targets)


@dataclass
class TargetState:
    """Per-target memory between cycles (pruned when the target disappears)."""

    detected_kind: str | None = None
    parse_errors: int = 0
    samples_dropped: dict[str, int] = field(default_factory=dict)  # SAMPLE_DROP_REASONS -> count
    up: bool | None = None
    reason: str = ""
    last_error: str = ""


@dataclass
class ScrapeResult:
    target: TargetConfig
    engine: str
    samples: list[NormSample]
    reason: str
    duration_s: float
    units: dict[UnitKey, list[NormSample]]  # the same samples by unit, in order


class PageCycle:
    """A cycle's work on pages already read, and the small per-target state (detected kind, counters) kept
    between cycles."""

    def __init__(self, config: ExporterConfig, node_name: str, guard: CardinalityGuard | None = None):
        self.config = config
        self.node_name = node_name
        self.guard = guard or CardinalityGuard(config.limits)
        self._states: dict[str, TargetState] = {}
        self._cycles = 0
        self.pod_mapper: PodMapper | None = None  # GPUs -> pods (kubelet pod-resources): the collector's, with GPUs
        self.node_pool = ""  # the node's pool (config.node_pool): the collector's, with GPUs; "" writes no info series

    def collect_files(self, targets: Sequence[TargetConfig], extra: Sequence[NormSample] = ()) -> Snapshot:
        """One cycle over file:// targets in the calling thread: the files read ahead by a daemon thread
        (`SavedPages`: a hung read is `timeout` at its target's deadline), each page parsed and adapted here,
        one after another. No GPUs: the caller has none."""
        from exporter.sources.file import SavedPages

        started = time.perf_counter()
        self._forget(targets)
        pages = SavedPages([(t.url, self.config.target_max_bytes(t)) for t in targets])
        scrapes = []
        for i, target in enumerate(targets):
            state = self._states.setdefault(target.label, TargetState())
            begun = read = time.perf_counter()
            result: Parsed | Exception
            try:
                body, read = pages.result(i, started, self.config.target_timeout(target))
                pending = [complete_page(body)]
                del body
                result = self._parse_and_adapt(target, pending, state)  # it takes the page's only reference
            except Exception as exc:
                result = exc
            # as long as the read took from the cycle's start, plus this page's own parse
            duration = time.perf_counter() - max(begun, read) + read - started
            scrapes.append(self._scraped(target, state, result, duration))
        return self._snapshot(started, scrapes, [], extra)

    def _forget(self, targets: Sequence[TargetConfig]) -> list[str]:
        """Drop the state of targets that are gone; the labels of this cycle's."""
        labels = [t.label for t in targets]
        for stale in set(self._states) - set(labels):
            del self._states[stale]
        self.guard.forget(labels)
        return labels

    def _scraped(self, target: TargetConfig, state: TargetState, result: Parsed | Exception,
                 duration: float) -> ScrapeResult:
        """One target's outcome: its samples, or the reason it is down (an adapter's bug takes down only its own
        target)."""
        engine = state.detected_kind or target.kind
        samples: list[NormSample] = []
        units: dict[UnitKey, list[NormSample]] = {}
        reason = ""
        if isinstance(result, FetchError):
            reason = result.reason
        elif isinstance(result, Exception):
            reason = ADAPTER_ERROR
            logs.event("adapter_failed", logging.ERROR, target=target.label, error=type(result).__name__)
        else:
            engine, units, samples, drops = result
            for drop_reason, n in drops.items():  # guard counters are the loop's (or the one thread's)
                self.guard.count(target.label, drop_reason, n)
        self._note_transition(target, state, reason)
        return ScrapeResult(target, engine, samples, reason, duration, units)

    def _snapshot(self, started: float, scrapes: list[ScrapeResult], gpu_samples: list[NormSample],
                  extra: Sequence[NormSample]) -> Snapshot:
        engine_samples = self._deduplicate(scrapes)
        self._cycles += 1
        duration = time.perf_counter() - started
        completed_at = time.time()
        statuses = tuple(
            TargetStatus(r.target.label, r.engine, not r.reason, r.reason, r.duration_s, len(r.samples)) for r in scrapes
        )
        gpus_up = sum(1 for s in gpu_samples if s.metric.name == c.GPU_UP.name and s.value == 1)
        samples = engine_samples + gpu_samples + self._self_metrics(statuses, duration, completed_at) + list(extra)
        return Snapshot(tuple(samples), statuses, gpus_up, self._cycles, completed_at, duration)

    def _parse_and_adapt(
        self, target: TargetConfig, pending: list[bytes | bytearray], state: TargetState
    ) -> Parsed:
        """CPU work, run in a worker thread so /metrics keeps answering while big pages parse.

        `pending` holds the page's bytes, the only reference to them: they are decoded (and freed) here,
        and the text is freed once parsed, so a large page is never held twice for long.

        Returns the engine kind, the samples within the caps by unit (histograms complete) and as
        one list, and the series left out by guard reason (counted by the caller: guard counters
        are loop-only). The page's own drops (parse errors, NaN, repeats, family limit) are
        counted here, in the target's state: one scrape of a target runs at a time.
        """
        kind = target.kind if target.kind != AUTO_KIND else state.detected_kind
        want = adapters.WANT_ALL if kind is None else adapters.get(kind).wanted
        text = pending.pop().decode("utf-8", errors="replace")
        page = promtext.parse_page(text, want, checked=True, family_limit=self.guard.limits.max_samples_per_family)
        del text
        families, bad_lines = page.families, page.errors
        state.parse_errors += bad_lines
        self._count_samples(state, NONFINITE, page.nonfinite)
        self._count_samples(state, DUPLICATE_SAMPLE, page.duplicates)
        self._count_samples(state, FAMILY_LIMIT, page.over_limit)
        if kind is None:
            kind = adapters.detect(families)
            if kind is None:
                raise FetchError(PARSE_ERROR if bad_lines else UNKNOWN_ENGINE)
            state.detected_kind = kind
            logs.event("engine_detected", target=target.label, engine=kind)
        adapter = adapters.get(kind)
        if not any(name in families for name in adapter.wanted):
            if target.kind == AUTO_KIND:
                state.detected_kind = None  # the engine behind the URL may have changed; detect again
            raise FetchError(PARSE_ERROR if bad_lines else NO_ENGINE_METRICS)
        identity = {
            c.LABEL_ENGINE: kind,
            c.LABEL_MODEL: target.model,
            c.LABEL_POD: target.pod,
            c.LABEL_NAMESPACE: target.namespace,
            c.LABEL_NODE: self.node_name,
        }
        adapted = with_every_reason(adapter.adapt(families, identity))  # the first error counts
        del families, page
        finite = [s for s in adapted if not s.value - s.value]  # NaN - NaN and Inf - Inf are NaN, true
        if len(finite) != len(adapted):  # an adapter computed one from finite inputs (an overflow)
            self._count_samples(state, NONFINITE, len(adapted) - len(finite))
        units, invalid = self._checked_units(finite)
        checked = list(chain.from_iterable(units.values()))
        samples, drops = limit_series(checked, self.guard.limits)
        if samples is not checked:  # the guard dropped some: group what it kept
            units = group_units(samples)
        if invalid:
            drops[INVALID_HISTOGRAM] = invalid
        return kind, units, samples, drops

    @staticmethod
    def _count_samples(state: TargetState, reason: str, n: int) -> None:
        if n:
            state.samples_dropped[reason] = state.samples_dropped.get(reason, 0) + n

    @staticmethod
    def _checked_units(samples: list[NormSample]) -> tuple[dict[UnitKey, list[NormSample]], int]:
        """The samples by unit, histograms completed (+Inf, _count) and broken ones left out and counted."""
        units = group_units(samples)
        if not any(s.suffix for s in samples):  # no histogram parts: nothing to check
            return units, 0
        checked: dict[UnitKey, list[NormSample]] = {}
        invalid = 0
        for key, unit in units.items():
            if unit[0].metric.kind != "histogram":
                checked[key] = unit
                continue
            fixed = complete_histogram(unit)
            if fixed is None:
                invalid += len(unit)
            else:
                checked[key] = fixed
        return checked, invalid

    def _deduplicate(self, scrapes: list[ScrapeResult]) -> list[NormSample]:
        """Engine samples of all targets; a series two targets both produce is kept once and counted."""
        seen: set[UnitKey] = set()
        out: list[NormSample] = []
        for r in scrapes:
            duplicates = 0
            for key, unit in r.units.items():
                if key in seen:
                    duplicates += len(unit)
                    continue
                seen.add(key)
                out.extend(unit)
            self.guard.count(r.target.label, DUPLICATE_SERIES, duplicates)
        return out

    def _note_transition(self, target: TargetConfig, state: TargetState, reason: str) -> None:
        """Log only changes (up -> down, reason changes, down -> up), never every failing cycle."""
        up = not reason
        if up and state.up is not True:
            logs.event("target_up", target=target.label, kind=target.kind)
        elif not up and (state.up is not False or state.reason != reason):
            logs.event("target_down", logging.WARNING, target=target.label, kind=target.kind, reason=reason)
        state.up, state.reason = up, reason
        if reason:
            state.last_error = reason

    # ---------------------------------------------------------------- self-metrics
    def _self_metrics(self, statuses: tuple[TargetStatus, ...], duration: float, completed_at: float) -> list[NormSample]:
        out: list[NormSample] = []
        dropped = self.guard.dropped()
        for st in statuses:
            state = self._states.get(st.target, TargetState())
            labels = {c.LABEL_TARGET: st.target, c.LABEL_ENGINE: st.engine}
            out.append(NormSample(c.EXPORTER_TARGET_UP, dict(labels), 1.0 if st.up else 0.0))
            out.append(NormSample(c.EXPORTER_SCRAPE_DURATION, dict(labels), st.duration_s))
            if state.last_error:
                out.append(NormSample(c.EXPORTER_LAST_ERROR, {**labels, c.LABEL_REASON: state.last_error}, 0.0 if st.up else 1.0))
            out.append(NormSample(c.EXPORTER_PARSE_ERRORS, {c.LABEL_TARGET: st.target}, float(state.parse_errors)))
            for reason in SAMPLE_DROP_REASONS:
                out.append(
                    NormSample(
                        c.EXPORTER_SAMPLES_DROPPED,
                        {c.LABEL_TARGET: st.target, c.LABEL_REASON: reason},
                        float(state.samples_dropped.get(reason, 0)),
                    )
                )
            for reason in DROP_REASONS:
                out.append(
                    NormSample(
                        c.EXPORTER_SERIES_DROPPED,
                        {c.LABEL_TARGET: st.target, c.LABEL_REASON: reason},
                        float(dropped.get((st.target, reason), 0)),
                    )
                )
        out.append(NormSample(c.EXPORTER_CYCLE_DURATION, {}, duration))
        out.append(NormSample(c.EXPORTER_CYCLES, {}, float(self._cycles)))
        out.append(NormSample(c.EXPORTER_LAST_CYCLE, {}, completed_at))
        if self.pod_mapper is not None:
            out.extend(self.pod_mapper.samples())
        if self.node_pool:
            out.append(NormSample(c.EXPORTER_NODE_POOL_INFO,
                                  {c.LABEL_HOSTNAME: self.node_name, c.LABEL_NODE_POOL: self.node_pool}, 1.0))
        out.extend(procinfo.self_samples())
        return out


def complete_page(body: bytes | bytearray) -> bytes | bytearray:
    """The page, if it ends as the format requires (with a line feed); else it was cut short."""
    if body and not body.endswith(b"\n"):
        raise FetchError(TRUNCATED, "page does not end with a line feed")
    return body
