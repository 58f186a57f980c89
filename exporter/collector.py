"""One collection cycle: every target and the GPUs at once, then self-metrics, into a Snapshot.

Each target is fetched with its own deadline and byte cap, parsed once (keeping only the
families its adapter reads, at most `max_samples_per_family` samples of each, and no NaN/Inf
value or repeated series: see promtext.parse_page) and adapted; any failure marks that target
down with a reason and touches nothing else. NVML runs in a daemon thread of its own (kept between cycles), so a hung
driver call can neither block the event loop nor keep the process from exiting.

Each target's samples are grouped into units (one gauge, counter or whole histogram) once, in
the worker thread that parsed the page: the histogram check, the cardinality caps (also in that
thread, so a flooded page never stalls the event loop that answers /metrics) and the
de-duplication across targets on the event loop all work on those units.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any

from exporter import adapters, logs, procinfo, promtext
from exporter.config import AUTO_KIND, ExporterConfig, TargetConfig
from exporter.daemon_worker import DaemonWorker
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
    is_file_url,
)
from exporter.sources.fetch import fetch_page
from exporter.sources.file import FileReader
from llmslo import conventions as c

if TYPE_CHECKING:  # aiohttp costs about 0.1 s to import: only runs with an http(s) target pay it
    import aiohttp


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
class _TargetState:
    """Per-target memory between cycles (pruned when the target disappears)."""

    detected_kind: str | None = None
    parse_errors: int = 0
    samples_dropped: dict[str, int] = field(default_factory=dict)  # SAMPLE_DROP_REASONS -> count
    up: bool | None = None
    reason: str = ""
    last_error: str = ""


@dataclass
class _ScrapeResult:
    target: TargetConfig
    engine: str
    samples: list[NormSample]
    reason: str
    duration_s: float
    units: dict[UnitKey, list[NormSample]]  # the same samples by unit, in order


# NVML is one library per process, so one thread reads it for every collector in the process: never
# more than one, even with a call hung (a second collector's call would wait behind it, as it would
# inside NVML). It ends after a minute without work (longer than any usual interval, so a running
# exporter keeps it).
_GPU_WORKER = DaemonWorker("llmslo-gpu", idle_s=60.0)


class Collector:
    """Runs cycles; keeps only small per-target state (detected kind, counters) between them."""

    def __init__(
        self,
        config: ExporterConfig,
        session: aiohttp.ClientSession | None,
        gpu_provider: Any | None,
        node_name: str,
        guard: CardinalityGuard | None = None,
    ):
        self.config = config
        self.session = session  # None: opened (and owned, see `close`) when an http(s) target is first scraped
        self._owns_session = False
        self.gpu_provider = gpu_provider
        self.node_name = node_name
        self.guard = guard or CardinalityGuard(config.limits)
        self._states: dict[str, _TargetState] = {}
        self._gpu_future: asyncio.Future | None = None
        self._files = FileReader()  # file:// targets: one read in flight per target, even when one hangs
        self._last_gpu_up: list[NormSample] = []
        self._cycles = 0
        self.pod_mapper = None  # GPUs -> pods (kubelet pod-resources), when GPUs are read and the mapping is on
        if gpu_provider is not None and config.pod_resources_url:
            from exporter.gpu.podmap import PodMapClient
            from exporter.gpu.podresources import PodMapper

            client = PodMapClient(config.pod_resources_url, node_name, config.pod_resources_timeout_s)
            self.pod_mapper = PodMapper(client)
        elif gpu_provider is not None and config.pod_resources_socket != "off":
            from exporter.gpu.podresources import PodMapper, PodResourcesClient

            self.pod_mapper = PodMapper(PodResourcesClient(config.pod_resources_socket, config.pod_resources_timeout_s))

    # ---------------------------------------------------------------- cycle
    async def collect(self, targets: Sequence[TargetConfig], extra: Sequence[NormSample] = ()) -> Snapshot:
        """One cycle; `extra` are samples made elsewhere (discovery's counters) added to the self-metrics."""
        started = time.perf_counter()
        labels = [t.label for t in targets]
        for stale in set(self._states) - set(labels):
            del self._states[stale]
        self.guard.forget(labels)
        self._files.forget(labels)
        *scrapes, gpu_samples = await asyncio.gather(
            *(self._scrape(t) for t in targets), self._collect_gpus()
        )
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

    # ---------------------------------------------------------------- targets
    async def _scrape(self, target: TargetConfig) -> _ScrapeResult:
        state = self._states.setdefault(target.label, _TargetState())
        started = time.perf_counter()
        samples: list[NormSample] = []
        units: dict[UnitKey, list[NormSample]] = {}
        reason = ""
        engine = state.detected_kind or target.kind
        try:
            body = await fetch_page(
                None if is_file_url(target.url) else self._http_session(),
                target.url,
                timeout_s=self.config.target_timeout(target),
                max_bytes=self.config.target_max_bytes(target),
                files=self._files,
                key=target.label,
            )
            if body and not body.endswith(b"\n"):  # the format requires a final line feed
                raise FetchError(TRUNCATED, "page does not end with a line feed")
            pending = [body]  # the worker thread takes the only reference: the page is freed as soon as it is read
            del body
            engine, units, samples, drops = await asyncio.to_thread(self._parse_and_adapt, target, pending, state)
            for drop_reason, n in drops.items():  # guard counters are loop-only
                self.guard.count(target.label, drop_reason, n)
        except FetchError as exc:
            reason = exc.reason
        except Exception as exc:  # an adapter bug must only take its own target down
            reason = ADAPTER_ERROR
            logs.event("adapter_failed", logging.ERROR, target=target.label, error=type(exc).__name__)
        duration = time.perf_counter() - started
        self._note_transition(target, state, reason)
        if reason:
            samples, units = [], {}
        return _ScrapeResult(target, engine, samples, reason, duration, units)

    def _http_session(self) -> aiohttp.ClientSession:
        if self.session is None:
            from exporter.sources.http import new_session

            self.session = new_session()
            self._owns_session = True
        return self.session

    async def close(self) -> None:
        """Close the client session this collector opened (one passed in is the caller's to close)."""
        if self._owns_session and self.session is not None:
            await self.session.close()
            self.session = None
            self._owns_session = False
        if self.pod_mapper is not None:
            self.pod_mapper.close()

    def _parse_and_adapt(
        self, target: TargetConfig, pending: list[bytes | bytearray], state: _TargetState
    ) -> tuple[str, dict[UnitKey, list[NormSample]], list[NormSample], dict[str, int]]:
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
    def _count_samples(state: _TargetState, reason: str, n: int) -> None:
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

    def _deduplicate(self, scrapes: list[_ScrapeResult]) -> list[NormSample]:
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

    def _note_transition(self, target: TargetConfig, state: _TargetState, reason: str) -> None:
        """Log only changes (up -> down, reason changes, down -> up), never every failing cycle."""
        up = not reason
        if up and state.up is not True:
            logs.event("target_up", target=target.label, kind=target.kind)
        elif not up and (state.up is not False or state.reason != reason):
            logs.event("target_down", logging.WARNING, target=target.label, kind=target.kind, reason=reason)
        state.up, state.reason = up, reason
        if reason:
            state.last_error = reason

    # ---------------------------------------------------------------- GPUs
    async def _collect_gpus(self) -> list[NormSample]:
        if self.gpu_provider is None:
            return []
        from exporter.gpu import collect_gpus

        if self._gpu_future is not None and not self._gpu_future.done():
            logs.event("gpu_collection_hung", logging.WARNING, note="previous NVML call has not returned")
            return self._gpus_down()
        owners = await self._gpu_owners()
        future = _GPU_WORKER.submit(collect_gpus, self.gpu_provider, self.node_name, owners)
        self._gpu_future = future
        try:
            samples = await asyncio.wait_for(asyncio.shield(future), self.config.gpu_timeout_s)
        except TimeoutError:
            logs.event("gpu_collection_timeout", logging.WARNING, timeout_s=self.config.gpu_timeout_s)
            return self._gpus_down()
        except Exception as exc:  # collect_gpus promises not to raise; be safe anyway
            logs.event("gpu_collection_failed", logging.ERROR, error=type(exc).__name__)
            return self._gpus_down()
        self._last_gpu_up = [s for s in samples if s.metric.name == c.GPU_UP.name]
        return list(samples)

    async def _gpu_owners(self) -> dict | None:
        """Device ID -> owning container, listed from the kubelet this cycle (bounded by its deadline);
        None when the mapping is off or the node has no GPUs to map."""
        if self.pod_mapper is None or not self.gpu_provider.devices():
            return None
        return await asyncio.to_thread(self.pod_mapper.refresh)

    def _gpus_down(self) -> list[NormSample]:
        """`llm_gpu_up 0` for the GPUs we last saw, so a hung driver shows up as GPUs down."""
        return [NormSample(s.metric, dict(s.labels), 0.0, s.suffix) for s in self._last_gpu_up]

    # ---------------------------------------------------------------- self-metrics
    def _self_metrics(self, statuses: tuple[TargetStatus, ...], duration: float, completed_at: float) -> list[NormSample]:
        out: list[NormSample] = []
        dropped = self.guard.dropped()
        for st in statuses:
            state = self._states.get(st.target, _TargetState())
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
        out.extend(procinfo.self_samples())
        return out

