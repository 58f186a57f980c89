"""The tap's /metrics page in the Prometheus text format (0.0.4), rendered without stalling the relay.

The page is rendered on the event loop that relays the streams, so its cost is paid by every
chunk due while it runs. Rendering it in one go, as prometheus_client.generate_latest does,
held the loop 1.4 ms per scrape with one model, 7 ms with 8 and 80 ms with 64 (14,000 lines);
scraped every 50 ms, that added about 20 ms to clients' TTFT. A render thread does not help:
formatting is pure Python, so the thread holds the GIL and the loop waits for it up to the
5 ms switch interval at a time (measured in BENCHMARKS.md's tap section). So:

- each (model, slo_class) series keeps its rendered lines with the count of updates they
  show (exporter.tap.metrics.Series.changes) and is rendered again only once it changed: a
  scrape costs in proportion to the series that changed since the last one;
- the series that did change are rendered one by one, and after SLICE_S of work the renderer
  yields to the loop, so a relayed chunk waits at most about one slice;
- one series is always rendered whole in one slice, so its buckets, sum, count, requests and
  goodput agree with each other; different series may be read a few milliseconds apart, as
  with any scrape of a live process.

Counts are written as integers, sums and bucket edges as prometheus_client writes them
(llmslo.gofloat.client_float); the `--workers` parent sums the workers' pages by parsing them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

from exporter.tap.metrics import HISTOGRAMS, Series, TapMetrics, le_label
from llmslo import conventions as C
from llmslo.gofloat import client_float, go_g

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SLICE_S = 0.0003  # rendering work between two turns of the event loop
PIECE_BYTES = 64 * 1024  # the page is handed to the socket this much at a time, a turn of the loop apart

# The families rendered per series, in page order (all of conventions.TAP_METRICS but the refusals).
SERIES_FAMILIES: tuple[C.MetricDef, ...] = (
    *(d for d, _ in HISTOGRAMS), C.TAP_REQUESTS, C.GOODPUT_REQUESTS, C.OUTPUT_TOKENS, C.GOODPUT_TOKENS,
    C.TAP_USAGE_REJECTED,
)
# The families rendered once per page, after the series' (the refusals, the late gauge, the configuration's).
PAGE_FAMILIES = (C.TAP_REFUSALS, C.TAP_SLO_HEADERS_IGNORED, C.TAP_IN_FLIGHT_LATE, C.TAP_CONFIG_INFO,
                 C.TAP_CONFIG_RELOAD_FAILURES)
assert set(SERIES_FAMILIES) | set(PAGE_FAMILIES) == set(C.TAP_METRICS)


def escape_label_value(value: str) -> str:
    """Backslash, double quote and line feed escaped as the text format requires; characters that
    UTF-8 cannot encode (unpaired surrogates) spelled as backslash escapes rather than breaking the page."""
    value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _header(d: C.MetricDef) -> bytes:
    help_text = d.help.replace("\\", "\\\\").replace("\n", "\\n")
    return f"# HELP {d.name} {help_text}\n# TYPE {d.name} {d.kind}\n".encode()


# One family's samples for render_families: (label name and value pairs, value); an int is written as a count, a
# float as Go writes it (NaN, +Inf, 0.5).
Samples = list[tuple[tuple[tuple[str, str], ...], int | float]]


def render_families(families: list[tuple[C.MetricDef, Samples]]) -> bytes:
    """Families rendered whole, in the order given, for the page's end (the admission gate's gauges): small and
    rendered at each scrape, with this module's one header and label escape."""
    lines: list[str] = []
    for d, samples in families:
        lines.append(_header(d).decode())
        for labels, value in samples:
            text = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels)
            lines.append(f"{d.name}{{{text}}} " if labels else f"{d.name} ")
            lines.append(f"{value}\n" if isinstance(value, int) else f"{go_g(value)}\n")
    return "".join(lines).encode()


class PageRenderer:
    """Renders one TapMetrics' page; keep one per TapMetrics (it caches per-series lines on them)."""

    def __init__(self, metrics: TapMetrics) -> None:
        self.metrics = metrics
        self._headers = [_header(d) for d in SERIES_FAMILIES]
        self._refusals_header = _header(C.TAP_REFUSALS)
        self._ignored_header = _header(C.TAP_SLO_HEADERS_IGNORED)
        self._late_header = _header(C.TAP_IN_FLIGHT_LATE)
        self._config_headers = (_header(C.TAP_CONFIG_INFO), _header(C.TAP_CONFIG_RELOAD_FAILURES))
        self._tails_for: dict[str, tuple[float, ...]] | None = None
        self._bucket_tails: list[list[str]] = []
        self._edge_labels: list[str] = []
        self._labels: dict[tuple[str, str], str] = {}
        self.extra: Callable[[], bytes] | None = None  # more lines for the page's end (the admission gate's)

    def _render_series(self, s: Series) -> None:
        """Every family's lines of one series, stored on it with the update count they show."""
        labels = self._labels.get((s.model, s.slo_class)) or self._label_text(s)
        if self._tails_for is not self.metrics.edges:  # first page, or a reload changed the edges
            self._tails_for = self.metrics.edges
            # Per histogram family: its edges' LABEL_BUCKETS label, and each bucket line's tail after the
            # series' labels: `,buckets="1a2b3c4d",le="0.5"} `.
            self._edge_labels = [f',{C.LABEL_BUCKETS}="{i}"' for i in self.metrics.bucket_ids]
            self._bucket_tails = [
                [f'{ids},le="{le_label(e)}"}} ' for e in self._tails_for[key]] + [f'{ids},le="+Inf"}} ']
                for (_, key), ids in zip(HISTOGRAMS, self._edge_labels, strict=True)
            ]
        parts: list[bytes] = []
        if s.histograms:
            for (d, _), h, tails, ids in zip(HISTOGRAMS, s.histograms, self._bucket_tails, self._edge_labels, strict=True):
                bucket = f"{d.name}_bucket{{{labels}"
                lines, total = [], 0
                for tail, n in zip(tails, h.counts, strict=True):
                    total += n
                    lines.append(f"{bucket}{tail}{total}\n")
                lines.append(f"{d.name}_sum{{{labels}{ids}}} {client_float(h.sum)}\n"
                             f"{d.name}_count{{{labels}{ids}}} {h.count}\n")
                parts.append("".join(lines).encode())
        else:
            parts += [b""] * len(HISTOGRAMS)
        name = C.TAP_REQUESTS.name
        parts.append("".join(f'{name}{{{labels},outcome="{o}"}} {n}\n' for o, n in s.requests.items()).encode())
        parts.append(f"{C.GOODPUT_REQUESTS.name}{{{labels}}} {s.goodput}\n".encode() if s.histograms else b"")
        for d, by in ((C.OUTPUT_TOKENS, s.tokens), (C.GOODPUT_TOKENS, s.good_tokens)):
            parts.append("".join(f'{d.name}{{{labels},usage_source="{u}"}} {n}\n' for u, n in by.items()).encode())
        rejected = s.usage_rejected
        parts.append(f"{C.TAP_USAGE_REJECTED.name}{{{labels}}} {rejected}\n".encode() if rejected is not None else b"")
        s.rendered = parts

    def _refresh(self, s: Series) -> None:
        at = s.changes
        self._render_series(s)
        s.rendered_at = at

    def _parts(self, series: list[Series], late: list[tuple[Series, int]]) -> list[bytes]:
        """The page's parts, in order: each family's header and its series' lines, then the page's own families."""
        parts: list[bytes] = []
        for i, header in enumerate(self._headers):
            parts.append(header)
            parts.extend([s.rendered[i] for s in series])
        name = C.TAP_REFUSALS.name
        parts.append(self._refusals_header)
        parts.append("".join(f'{name}{{reason="{r}"}} {n}\n' for r, n in self.metrics.refusals.items()).encode())
        name = C.TAP_SLO_HEADERS_IGNORED.name
        parts.append(self._ignored_header)
        parts.append("".join(f'{name}{{reason="{r}"}} {n}\n' for r, n in self.metrics.headers_ignored.items()).encode())
        parts.append(self._late_lines(late))
        info, failures = self._config_headers
        parts.append(info + f'{C.TAP_CONFIG_INFO.name}{{{C.LABEL_CONFIG_HASH}="{self.metrics.slo.hash}"}} 1\n'.encode())
        parts.append(failures + f"{C.TAP_CONFIG_RELOAD_FAILURES.name} {self.metrics.config_reload_failures}\n".encode())
        if self.metrics.genai is not None:  # --genai-names (exporter.tap.genai)
            parts.extend(self.metrics.genai.render(escape_label_value))
        if self.extra is not None:
            parts.append(self.extra())
        return parts

    def _late_lines(self, late: list[tuple[Series, int]]) -> bytes:
        """The in-flight-late gauge (one line per series; its labels are cached)."""
        name = C.TAP_IN_FLIGHT_LATE.name
        labels = self._labels
        return self._late_header + "".join(
            f"{name}{{{labels.get((s.model, s.slo_class)) or self._label_text(s)}}} {n}\n"
            for s, n in late
        ).encode()

    def _label_text(self, s: Series) -> str:
        text = self._labels[(s.model, s.slo_class)] = (
            f'model="{escape_label_value(s.model)}",slo_class="{escape_label_value(s.slo_class)}"'
        )
        return text

    async def render_parts(self) -> list[bytes]:
        """The page's parts in order (`pieces` groups them for the socket), yielding to the event loop after
        every SLICE_S of rendering."""
        self.metrics.prime()  # the series requests will count in, at 0 before their first request
        late = self.metrics.in_flight_late()  # before the series are listed: it may add a late request's
        series = list(self.metrics.series.values())
        clock = time.perf_counter
        started = clock()
        for s in series:
            if s.rendered_at != s.changes:
                self._refresh(s)
                if clock() - started > SLICE_S:
                    await asyncio.sleep(0)
                    started = clock()
        genai = self.metrics.genai
        if genai is not None:  # --genai-names: its changed series in the same slices
            for g in genai.stale():
                genai.refresh(g, escape_label_value)
                if clock() - started > SLICE_S:
                    await asyncio.sleep(0)
                    started = clock()
        return self._parts(series, late)

    async def render_pieces(self) -> list[bytes]:
        """The page in pieces of about PIECE_BYTES (render_parts(), grouped)."""
        return list(pieces(await self.render_parts()))

    async def render(self) -> bytes:
        """The page as one buffer (render_parts(), joined)."""
        return b"".join(await self.render_parts())

    def render_now(self) -> bytes:
        """The page in one go (tests, tools; on a relaying loop use render_parts())."""
        self.metrics.prime()
        late = self.metrics.in_flight_late()
        series = list(self.metrics.series.values())
        for s in series:
            if s.rendered_at != s.changes:
                self._refresh(s)
        return b"".join(self._parts(series, late))


def pieces(parts: list[bytes]) -> Iterator[bytes]:
    """`parts` joined into pieces of about PIECE_BYTES, one at a time: the caller writes each and lets the
    loop turn before the next is joined, so neither copying the page nor writing it holds the loop for long
    (joined in one go, a 1.7 MB page held it 1-5 ms a scrape, longer than all of a slice's rendering)."""
    group: list[bytes] = []
    size = 0
    for part in parts:
        group.append(part)
        size += len(part)
        if size >= PIECE_BYTES:
            yield b"".join(group)
            group, size = [], 0
    if group:
        yield b"".join(group)
