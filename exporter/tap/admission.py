"""KV admission (opt-in, `--admission`): refuse new completions with 429 while the engine is full.

The tap reads the engine it fronts (its vLLM-format /metrics, every `poll_s`) and keeps a gate:

- seats at p99 context = free KV tokens / p99 per-request footprint, where free KV tokens =
  (1 - vllm:kv_cache_usage_perc) x usable blocks x block_size (vllm:cache_config_info; usable is
  num_gpu_blocks - 1 on V1, whose usage leaves out its null block), and the
  footprint = p99 of vllm:request_prompt_tokens + p99 of vllm:request_generation_tokens over the
  requests that finished in the last `window_s` (the sum of the two p99s: an upper bound of the
  p99 of the sum, so the estimate errs towards fewer seats); with no request finished in the
  window the last footprint measured is kept, and before any the `fallback_footprint` flag is used;
- queue = vllm:num_requests_waiting (summed over data-parallel engines).

The gate is closed while seats < min_seats or queue > max_queue. Between two readings the tap
counts the requests it admitted since the last one: each takes one seat, so a burst cannot pour
more into the KV cache during one poll interval than the reading said was free. They join the
queue in the estimate only beyond the free seats: a request that fits in free KV starts running,
it does not wait. (Counting every admitted request as queued capped the gate at max_queue + 1
requests per poll however idle the engine: in front of a real vLLM it refused 19 of a burst of 24
short requests the engine served at once.)

The gate only decides for a new timed request (chat/completions, completions) when it arrives;
a request already admitted is never touched. When the engine's /metrics cannot be read (refused,
timed out, not a vLLM page, or the last good reading older than STALE_POLLS intervals), the gate
fails open: it admits, logs `event=tap_admission_engine_unreadable` once and shows
llm_tap_admission_engine_readable 0. A gate that refused on a blind tap would turn a broken
metrics endpoint into an outage; admitting leaves the engine's own limits (and the SLOs that
watch them) in charge, as without admission.

The poll runs on the tap's event loop as one small HTTP request with a timeout; the page is parsed
(exporter.promtext, only the few families needed) in a worker thread, so relaying never waits on it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import ssl
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp

from exporter.adapters.vllm import null_block_count
from exporter.model import MetricFamily
from exporter.promtext import parse
from llmslo import conventions as C

log = logging.getLogger("llmslo.tap")

V = C.VLLM
# 0.25 s: half the interactive TTFT objective (0.5 s), so a queue that builds is seen well before a
# queued request has lost its objective; vLLM refreshes these gauges every engine step, and a /metrics
# render four times a second is a negligible cost for the engine's API server.
DEFAULT_POLL_S = 0.25
# At least one more request of p99 context must fit in the free KV cache: below that a new request
# waits for a running one to finish (or preempts one), which is a TTFT lost.
DEFAULT_MIN_SEATS = 1.0
# A queued request waits about queue / service rate; with tens of requests a second and a 0.5 s TTFT
# objective, a handful queued is already most of the objective.
DEFAULT_MAX_QUEUE = 4
DEFAULT_WINDOW_S = 60.0  # the recent window of finished requests the p99 footprint is taken from
DEFAULT_FALLBACK_FOOTPRINT = 4096  # tokens, until the engine's histograms have a finished request
STALE_POLLS = 4  # a reading older than this many poll intervals (plus the timeout) no longer counts
FETCH_TIMEOUT_S = 2.0
MAX_PAGE_BYTES = 8 << 20
RETRY_AFTER_S = 1

WANTED = frozenset({
    V.KV_CACHE_USAGE_PERC, V.GPU_CACHE_USAGE_PERC, V.CACHE_CONFIG_INFO, V.NUM_REQUESTS_WAITING,
    V.REQUEST_PROMPT_TOKENS, V.REQUEST_GENERATION_TOKENS, *V.V0_ONLY,
})


def poll_seconds(value: str) -> float:
    """`--admission-poll-interval`: at least 0.05 s and at most 60 s."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not math.isfinite(seconds) or not 0.05 <= seconds <= 60:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds between 0.05 and 60")
    return seconds


def non_negative_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of at least 0")
    return x


def non_negative_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 0")
    return n


class EngineReadError(ValueError):
    """The engine's /metrics lacks what admission needs."""


Buckets = tuple[tuple[float, float], ...]  # (le, cumulative count), in edge order, +Inf last


@dataclass(frozen=True)
class Reading:
    """What one poll of the engine's /metrics said."""

    free_tokens: float
    waiting: float
    prompt: Buckets  # summed over the page's series
    generation: Buckets


def _buckets(fam: MetricFamily | None) -> Buckets:
    if fam is None:
        return ()
    sums: dict[float, float] = {}
    for s in fam.samples:
        if s.name.endswith("_bucket") and "le" in s.labels:
            try:
                le = float(s.labels["le"])
            except ValueError:
                continue
            sums[le] = sums.get(le, 0.0) + s.value
    return tuple(sorted(sums.items()))


def read_engine(families: Mapping[str, MetricFamily]) -> Reading:
    """The free KV tokens, the queue and the token histograms of a parsed vLLM page."""
    usage_fam = families.get(V.KV_CACHE_USAGE_PERC) or families.get(V.GPU_CACHE_USAGE_PERC)
    config = families.get(V.CACHE_CONFIG_INFO)
    if usage_fam is None or not usage_fam.samples or config is None or not config.samples:
        raise EngineReadError("no kv_cache_usage_perc or cache_config_info on the page")
    configs: dict[str, tuple[float, float]] = {}
    for s in config.samples:
        try:
            configs[s.labels.get("engine", "")] = (float(s.labels["block_size"]), float(s.labels["num_gpu_blocks"]))
        except (KeyError, ValueError):
            continue
    if not configs:
        raise EngineReadError("cache_config_info has no block_size and num_gpu_blocks")
    null_blocks = null_block_count(families)
    free = 0.0
    for s in usage_fam.samples:
        dp = s.labels.get("engine", "")
        block_size, blocks = configs.get(dp) or next(iter(configs.values()))
        free += max(0.0, 1.0 - s.value) * max(0.0, blocks - null_blocks) * block_size
    waiting_fam = families.get(V.NUM_REQUESTS_WAITING)
    waiting = sum(s.value for s in waiting_fam.samples) if waiting_fam is not None else 0.0
    return Reading(free, waiting, _buckets(families.get(V.REQUEST_PROMPT_TOKENS)),
                   _buckets(families.get(V.REQUEST_GENERATION_TOKENS)))


def _delta(now: Buckets, then: Buckets) -> Buckets:
    if not then or [le for le, _ in now] != [le for le, _ in then]:
        return now
    return tuple((le, max(0.0, a - b)) for (le, a), (_, b) in zip(now, then))


def quantile(q: float, buckets: Buckets) -> float | None:
    """Prometheus' histogram_quantile over cumulative buckets (+Inf last): linear within the bucket;
    in the +Inf bucket, the highest finite edge. None when the histogram is empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_n = 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if math.isinf(le):
                return prev_le
            if n == prev_n:
                return le
            return prev_le + (le - prev_le) * (rank - prev_n) / (n - prev_n)
        prev_le, prev_n = le, n
    return prev_le


class Admission:
    """The gate and its poller (see the module's docstring)."""

    def __init__(
        self, upstream: str, ca_file: str = "", *, min_seats: float = DEFAULT_MIN_SEATS,
        max_queue: int = DEFAULT_MAX_QUEUE, poll_s: float = DEFAULT_POLL_S, window_s: float = DEFAULT_WINDOW_S,
        fallback_footprint: int = DEFAULT_FALLBACK_FOOTPRINT, timeout_s: float = FETCH_TIMEOUT_S,
        metrics_path: str = "/metrics", clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = upstream.rstrip("/") + metrics_path
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context(cafile=ca_file or None) if upstream.startswith("https://") else None
        )
        self.min_seats = min_seats
        self.max_queue = max_queue
        self.poll_s = poll_s
        self.window_s = window_s
        self.fallback_footprint = float(fallback_footprint)
        self.timeout_s = timeout_s
        self.clock = clock
        self.retry_after_s = max(RETRY_AFTER_S, math.ceil(poll_s))
        # The last reading and what was derived from it.
        self.reading: Reading | None = None
        self.read_at: float | None = None
        self.footprint = self.fallback_footprint
        self.seats = math.inf
        self.waiting = 0.0
        self.admitted_since = 0  # requests admitted since the last reading
        self.last_error = ""
        self.polls = 0
        self.refusals = 0
        self._history: deque[tuple[float, Buckets, Buckets]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- the gate ----------------------------------------------------------------------------
    @property
    def readable(self) -> bool:
        """A recent reading exists (else the gate fails open)."""
        return self.read_at is not None and self.clock() - self.read_at <= STALE_POLLS * self.poll_s + self.timeout_s

    def is_open(self) -> bool:
        """Would a request arriving now be admitted (without counting it)?"""
        if not self.readable:
            return True
        n = self.admitted_since
        queued_since = max(0.0, n - self.seats)  # admitted since the reading that found no free seat
        return self.seats - n >= self.min_seats and self.waiting + queued_since <= self.max_queue

    def admit(self) -> bool:
        """Decide for one new request: True (admitted, and counted until the next reading) or False."""
        if self.is_open():
            self.admitted_since += 1
            return True
        self.refusals += 1
        return False

    # -- readings ----------------------------------------------------------------------------
    def update(self, reading: Reading) -> None:
        """Take a new reading: the footprint over the window, the seats, the queue."""
        now = self.clock()
        history = self._history
        history.append((now, reading.prompt, reading.generation))
        while len(history) > 1 and history[1][0] <= now - self.window_s:
            history.popleft()
        _, prompt0, gen0 = history[0]
        prompt, gen = _delta(reading.prompt, prompt0), _delta(reading.generation, gen0)
        if len(history) == 1 or not prompt or prompt[-1][1] <= 0:  # no earlier reading, or none finished since
            prompt, gen = reading.prompt, reading.generation
        p99_prompt, p99_gen = quantile(0.99, prompt), quantile(0.99, gen)
        if p99_prompt is not None:
            self.footprint = max(1.0, p99_prompt + (p99_gen or 0.0))
        self.reading = reading
        self.seats = reading.free_tokens / self.footprint
        self.waiting = reading.waiting
        self.admitted_since = 0
        self.read_at = now

    async def poll(self) -> bool:
        """Read the engine once; on failure the previous reading stays (until it is stale). Never
        raises (but for cancellation)."""
        self.polls += 1
        was_open = self.is_open()
        try:
            text = await self._fetch()
            families = await asyncio.to_thread(parse, text, WANTED)
            reading = read_engine(families)
        except Exception as e:  # noqa: BLE001  (whatever the engine answers, the tap goes on)
            error = f"{type(e).__name__}: {e}"[:200]
            if not self.last_error:
                log.warning("event=tap_admission_engine_unreadable url=%s error=%r (the gate admits while it "
                            "cannot read the engine)", self.url, error)
            self.last_error = error
            return False
        if self.last_error:
            log.info("event=tap_admission_engine_readable url=%s", self.url)
            self.last_error = ""
        self.update(reading)
        if self.is_open() != was_open:
            log.info("event=tap_admission_%s seats=%.1f footprint=%.0f waiting=%.0f", "open" if not was_open else
                     "closed", self.seats, self.footprint, self.waiting)
        return True

    async def _fetch(self) -> str:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self.ssl or True, limit=1)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=self.timeout_s), auto_decompress=True,
            )
        async with self._session.get(self.url, allow_redirects=False) as resp:
            if resp.status != 200:
                raise EngineReadError(f"HTTP status {resp.status}")
            body = bytearray()
            async for piece in resp.content.iter_chunked(64 * 1024):
                body += piece
                if len(body) > MAX_PAGE_BYTES:
                    raise EngineReadError(f"the page is larger than {MAX_PAGE_BYTES} bytes")
        return body.decode("utf-8", "replace")

    async def _run(self) -> None:
        while True:
            started = self.clock()
            await self.poll()
            await asyncio.sleep(max(0.0, self.poll_s - (self.clock() - started)))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- self-metrics ------------------------------------------------------------------------
    def render(self) -> bytes:
        """The gate's gauges for the tap's /metrics page."""
        readable = self.readable
        lines = []
        for d, value in (
            (C.TAP_ADMISSION_OPEN, 1 if self.is_open() else 0),
            (C.TAP_ADMISSION_ENGINE_READABLE, 1 if readable else 0),
            (C.TAP_ADMISSION_SEATS, self.seats if readable and math.isfinite(self.seats) else math.nan),
            (C.TAP_ADMISSION_FOOTPRINT, self.footprint),
            (C.TAP_ADMISSION_QUEUE, self.waiting if readable else math.nan),
        ):
            lines.append(f"# HELP {d.name} {d.help}\n# TYPE {d.name} {d.kind}\n{d.name} {_num(value)}\n")
        return "".join(lines).encode()


def _num(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"
