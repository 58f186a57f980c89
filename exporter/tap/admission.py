"""Admission (opt-in, `--admission`): refuse a new completion with 429 when the engine would not serve it
within its class's objectives.

The tap reads the engine it fronts (its /metrics, every `poll_s`) through the exporter's own adapters
(exporter.adapters: the same reading of each engine's families as the node exporter's), so every
engine kind whose adapter gives free KV blocks and the block size can be gated (`--admission-engine`,
detected from the page by default), and keeps a gate:

- seats at p99 context = exporter.tap.seats.estimate: more p99-sized requests the free KV tokens take now and
  as they grow, net of what the tap's requests in flight will still take, where free KV tokens =
  llm_kv_cache_free_blocks x llm_kv_cache_block_size_tokens (for vLLM: (1 - kv_cache_usage_perc) x
  usable blocks, num_gpu_blocks - 1 on V1 for its null block, in whole blocks, per data-parallel engine), and the
  request sizes are the exact usage counts of the requests that finished through this tap once it has
  seen enough, else p99 of llm_request_prompt_tokens + p99 of llm_request_generation_tokens over the
  requests that finished in the last `window_s` (the sum of the two p99s: an upper bound of the p99 of the
  sum); with neither the last sizes are kept, and before any the `fallback_footprint` flag is used;
- queue = llm_requests_waiting (summed over the engine's models and data-parallel engines);
- the cached share = llm_prefix_cache_hits / llm_prefix_cache_queries over `window_s`, capped at
  MAX_CACHED_SHARE: a prompt takes free KV only for what the prefix cache does not serve (cached blocks nobody
  references already count as free in the engine's own count), in the start condition and the seats.

With `taps` > 1 (`--workers N`: each worker a gate of its own) a gate counts what it admitted that the engine
does not show yet, and its in-flight requests, `taps` times: the others are taken to have done as much.

The decision is by objective (exporter.tap.predict, a pure function of what is kept here): a request is
refused only when the engine would not start it within its class's TTFT objective, when the running requests
miss the TPOT objective because of the load, or when its class is sheddable and past the shed margin. For it
the gate also keeps the requests it admitted that the engine's page does not show yet (exporter.tap.reservations:
each takes one start seat, a median prompt of free KV, and those beyond the p99 seats wait for a finish; a reading
mid-burst used to forget them), the engine's queue as persisted over two readings and whether it keeps growing, and the rates learned from the page's
counter deltas (finishes, TTFT less queue time, ITL, service time, the batch sizes served within each ITL).
The old fixed floors, `min_seats` and `max_queue`, are operator overrides, off unless given (the default
max_queue of 4 capped an idle engine at 5 requests a poll: in front of a real vLLM it refused 19 of a burst of
24 short requests the engine served at once).

The gate only decides for a new timed request (chat/completions, completions) when it arrives;
a request already admitted is never touched. When the engine's /metrics cannot be read (refused,
timed out, not a vLLM page, or the last good reading older than STALE_POLLS intervals), the gate
fails open: it admits, logs `event=tap_admission_engine_unreadable` once and shows
llm_tap_admission_engine_readable 0. A gate that refused on a blind tap would turn a broken
metrics endpoint into an outage; admitting leaves the engine's own limits (and the SLOs that
watch them) in charge, as without admission.

The page is fetched (with a timeout, at most MAX_PAGE_BYTES) and parsed (exporter.promtext, only the families the
adapters read) and adapted in a child process (exporter.tap.page_reader), which gives the poll only the small
reading: the event loop relaying streams never holds the page, nor shares the GIL with its parse (issue 34).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import ssl
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from exporter import adapters
from exporter.logs import TAP_LOGGER, event
from exporter.model import MetricFamily
from exporter.promtext import parse_page
from exporter.tap import seats
from exporter.tap.background import cancel_and_wait
from exporter.tap.classes import Objective, SloConfig
from exporter.tap.page_reader import STAGE_FETCH, EngineUnreachable, PageReader, PageSource
from exporter.tap.predict import (
    DECODE_MEMORY_S,
    DEFAULT_SHED_MARGIN,
    FINISH_WINDOW_S,
    RATE_WINDOW_S,
    Counters,
    Outlook,
    Policy,
    Rates,
    drain_rate,
    finish_rate,
    predicted_wait,
    queue_growing,
    rates_between,
    seconds_to_seat,
)
from exporter.tap.predict import refusal as predicted_refusal
from exporter.tap.reservations import Reservations
from exporter.tap.turns import ClientKeys, Turns
from llmslo import conventions as C
from llmslo.gofloat import go_g
from llmslo.histograms import Buckets, histogram_quantile

# 0.25 s: half the interactive TTFT objective (0.5 s), so a queue that builds is seen well before a
# queued request has lost its objective; vLLM refreshes these gauges every engine step, and a /metrics
# render four times a second is a negligible cost for the engine's API server.
DEFAULT_POLL_S = 0.25
# The old fixed floors are operator overrides now, off unless given (--admission-min-seats, --admission-max-queue):
# the gate decides by each class's objective (exporter.tap.predict). Fixed floors refused below capacity.
DEFAULT_MIN_SEATS: float | None = None
DEFAULT_MAX_QUEUE: int | None = None
MIN_DECODE_STEP_S = 0.001  # the fastest decode step the start seats believe (Admission._start_seats)
DEFAULT_WINDOW_S = 60.0  # the recent window of finished requests the p99 footprint is taken from
DEFAULT_FALLBACK_FOOTPRINT = 4096  # tokens, until the engine's histograms have a finished request
STALE_POLLS = 4  # a reading older than this many poll intervals (plus the timeout) no longer counts
FETCH_TIMEOUT_S = 2.0
PARSE_DEADLINE_S = 10.0  # beyond the fetch's timeout, for the page reader's answer (a MAX_PAGE_BYTES page: 0.3 s CPU)
MAX_PAGE_BYTES = 8 << 20
FAMILY_LIMIT = 10_000  # samples of one family read from a page (the exporter's max_samples_per_family default)
# Retry-After (whole seconds, RFC 9110) is when a seat is expected (exporter.tap.predict.seconds_to_seat), at least
# a second (and a poll: the gate changes its mind only at a reading) and at most MAX_RETRY_AFTER_S.
RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 30
# The most of a prompt the prefix cache is taken to serve (the engine's hit ratio over the window, capped): a page
# that claims every token is cached still charges each request a tenth of its prompt, never nothing.
MAX_CACHED_SHARE = 0.9

# The engine kinds admission can read: every adapter's but the tap's own (a tap in front of a tap has no KV cache).
ENGINE_KINDS = tuple(sorted(kind for kind in adapters.ADAPTERS if kind != adapters.tap.KIND))
AUTO = "auto"
WANTED = adapters.WANT_ALL  # what a page is parsed for when the kind is detected from it


def wanted(kind: str) -> frozenset[str]:
    """The families a page of this engine kind (or AUTO) is parsed for."""
    return WANTED if kind == AUTO else adapters.get(kind).wanted


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


def shed_margin(value: str) -> float:
    """`--admission-shed-margin`: a share of the objectives, more than 0 and at most 1."""
    try:
        x = float(value)
    except ValueError:
        x = -1.0
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a share of the objectives above 0 and at most 1")
    return x


def warn_unguarded(slo: SloConfig) -> bool:
    """Log a WARNING at start when no class gives the gate a TTFT (or TPOT) objective to decide by: without one
    it refuses nothing for the wait, and a prefill-bound overload is admitted whole (issue 34: 11 req/s on an
    engine good for 5, nothing refused, good requests down to 0 within 10 s). True when it warned."""
    ttft, tpot = slo.tightest
    missing = [name for name, objective in (("ttft", ttft), ("tpot", tpot)) if objective is None]
    if not missing:
        return False
    guards = {"ttft": "the wait to start (queue, KV, prefill-bound overload)", "tpot": "decode overload"}
    event("tap_admission_unguarded", logging.WARNING, logger=TAP_LOGGER, missing_objectives=",".join(missing),
          protects="nothing by wait" if ttft is None else "the wait to start",
          does_not_protect="; ".join(guards[m] for m in missing),
          fix="give --slo files whose goodput classes set the ttft (and tpot) objectives the gate admits by")
    return True


class EngineReadError(ValueError):
    """The engine's /metrics lacks what admission needs, or says something impossible (`reason`: one of
    conventions.ADMISSION_READ_REASONS)."""

    def __init__(self, message: str, reason: str = C.ADMISSION_READ_NOT_ENGINE) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Reading:
    """What one poll of the engine's /metrics said."""

    free_tokens: float
    waiting: float
    prompt: Buckets  # summed over the page's series
    generation: Buckets
    block_size: float = 1.0  # tokens per KV block (the largest of the page's engines): a request takes whole blocks
    bad_histogram: str = ""  # why the request-size histograms were not taken (their buckets are then empty)
    counters: Counters = Counters()  # what the rates are learned from (exporter.tap.predict)
    prefix_hits: float = 0.0  # cumulative prompt tokens found in the prefix cache (llm_prefix_cache_hits_total)
    prefix_queries: float = 0.0  # cumulative prompt tokens looked up in it
    total_tokens: float = 0.0  # the KV cache's size in tokens (0: the page does not say)


# The adapters' gauges a reading is built from, each a count or a ratio that must be finite and in range.
_CHECKED = {C.KV_BLOCKS_FREE.name: math.inf, C.KV_BLOCKS_TOTAL.name: math.inf, C.KV_BLOCK_SIZE.name: math.inf,
            C.REQUESTS_WAITING.name: math.inf, C.KV_CACHE_USAGE.name: 1.0, C.REQUESTS_RUNNING.name: math.inf}
# The histograms whose _sum and _count the rates are learned from (the page's non-finite values are refused whole).
_TIMED = (C.TTFT.name, C.QUEUE_TIME.name, C.ITL.name, C.E2E.name)


def _check(name: str, model: str, value: float) -> None:
    where = f"{name}{{model={model!r}}}"
    if not math.isfinite(value):
        raise EngineReadError(f"{where} is {value}", C.ADMISSION_READ_NON_FINITE)
    if value < 0 or value > _CHECKED[name] or (name == C.KV_BLOCK_SIZE.name and value < 1):
        raise EngineReadError(f"{where} is {value}, outside what it can be", C.ADMISSION_READ_OUT_OF_RANGE)


def _histogram(per_model: dict[str, dict[float, float]]) -> tuple[Buckets, str]:
    """The buckets summed over models, or () and why when any model's are not a cumulative histogram."""
    summed: dict[float, float] = {}
    for model, buckets in per_model.items():
        ladder = sorted(buckets.items())
        counts = [n for _, n in ladder]
        if not all(math.isfinite(n) and n >= 0 for n in counts) or any(b < a for a, b in zip(counts, counts[1:], strict=False)) \
                or not ladder or ladder[-1][0] != math.inf or any(math.isnan(le) for le, _ in ladder):
            return (), f"model {model!r}: buckets not cumulative, finite and ending at +Inf"
        for le, n in ladder:
            summed[le] = summed.get(le, 0.0) + n
    return tuple(sorted(summed.items())), ""


def read_engine(families: Mapping[str, MetricFamily], kind: str = AUTO) -> Reading:
    """The free KV tokens, the queue and the request-size histograms of a parsed page, read through the
    engine kind's adapter (AUTO: the kind detected from the page). Each model's series is taken once (a
    duplicate does not add up), and every count and ratio must be finite and possible: a page that says
    otherwise raises EngineReadError with its reason, and the gate fails open rather than believe it."""
    if kind == AUTO:
        detected = adapters.detect(families)
        if detected is None or detected == adapters.tap.KIND:
            raise EngineReadError("no engine's families on the page")
        kind = detected
    gauges: dict[str, dict[str, float]] = {name: {} for name in _CHECKED}
    histograms: dict[str, dict[str, dict[float, float]]] = {
        C.REQUEST_PROMPT_TOKENS.name: {}, C.REQUEST_GENERATION_TOKENS.name: {}}
    timed: dict[str, float] = {}
    prefix = {C.PREFIX_CACHE_HITS.name: 0.0, C.PREFIX_CACHE_QUERIES.name: 0.0}
    for s in adapters.get(kind).adapt(families, {}):
        name, model = s.metric.name, s.labels.get(C.LABEL_MODEL, "")
        if name in gauges:
            _check(name, model, s.value)
            gauges[name][model] = s.value
        elif name in histograms and s.suffix == "_bucket":
            histograms[name].setdefault(model, {})[float(s.labels[C.LABEL_LE])] = s.value
        elif name in _TIMED and s.suffix in ("_sum", "_count") and math.isfinite(s.value) and s.value >= 0:
            timed[name + s.suffix] = timed.get(name + s.suffix, 0.0) + s.value
        elif name in prefix and math.isfinite(s.value) and s.value >= 0:
            prefix[name] += s.value
    free_blocks, totals, sizes = (gauges[m.name] for m in (C.KV_BLOCKS_FREE, C.KV_BLOCKS_TOTAL, C.KV_BLOCK_SIZE))
    sized = [(blocks, sizes[m]) for m, blocks in free_blocks.items() if m in sizes]
    if not sized:
        raise EngineReadError(f"no free KV blocks and block size on the {kind} page")
    for model, blocks in free_blocks.items():
        if model in totals and blocks > totals[model] + 0.5:
            raise EngineReadError(f"model {model!r}: {blocks:g} free KV blocks of {totals[model]:g}",
                                  C.ADMISSION_READ_INCONSISTENT)
    free = sum(blocks * size for blocks, size in sized)
    total = sum(blocks * sizes[m] for m, blocks in totals.items() if m in sizes)
    (prompt, bad_prompt), (generation, bad_gen) = (
        _histogram(histograms[m.name]) for m in (C.REQUEST_PROMPT_TOKENS, C.REQUEST_GENERATION_TOKENS))
    bad = bad_prompt or bad_gen
    if bad:
        prompt, generation = (), ()
    waiting = sum(gauges[C.REQUESTS_WAITING.name].values())
    sums = {f"{key}_{part}": timed.get(f"{m.name}_{part}", 0.0)
            for key, m in (("ttft", C.TTFT), ("queue", C.QUEUE_TIME), ("itl", C.ITL), ("e2e", C.E2E))
            for part in ("sum", "count")}
    counters = Counters(finished=prompt[-1][1] if prompt else 0.0, running=sum(gauges[C.REQUESTS_RUNNING.name].values()),
                        **sums)
    return Reading(free, waiting, prompt, generation, max(size for _, size in sized), bad, counters,
                   prefix[C.PREFIX_CACHE_HITS.name], prefix[C.PREFIX_CACHE_QUERIES.name], total)


def read_text(text: str, engine: str = AUTO) -> Reading:
    """Parse (checked, as the exporter does: a duplicate series keeps its first value; at most FAMILY_LIMIT samples
    of a family, so a page of made-up series costs a bounded time) and read (in the page reader's child process)."""
    page = parse_page(text, wanted(engine), checked=True, family_limit=FAMILY_LIMIT)
    if page.nonfinite:
        raise EngineReadError(f"{page.nonfinite} NaN or infinite values in the families admission reads",
                              C.ADMISSION_READ_NON_FINITE)
    return read_engine(page.families, engine)


def reading_of(fields: Mapping[str, Any]) -> Reading:
    """A Reading from its fields as the page reader sends them (dataclasses.asdict, through JSON)."""
    buckets = {k: tuple((float(le), float(n)) for le, n in fields[k]) for k in ("prompt", "generation")}
    return Reading(**{**fields, **buckets, "counters": Counters(**fields["counters"])})


def cached_share(history: Sequence[tuple[float, float, float]], last: float) -> float:
    """The prefix-cache hit ratio between the oldest and the newest (time, hits, queries) reading, capped at
    MAX_CACHED_SHARE; `last` when no prompt token was looked up meanwhile or a counter went back (a restart)."""
    if len(history) < 2:
        return last
    (_, h0, q0), (_, h1, q1) = history[0], history[-1]
    hits, queries = h1 - h0, q1 - q0
    if not (math.isfinite(hits) and math.isfinite(queries)) or hits < 0 or queries <= 0:
        return last
    return min(MAX_CACHED_SHARE, hits / queries)


def _delta(now: Buckets, then: Buckets) -> Buckets:
    if not then or [le for le, _ in now] != [le for le, _ in then]:
        return now
    return tuple((le, max(0.0, a - b)) for (le, a), (_, b) in zip(now, then, strict=True))


quantile = histogram_quantile  # the admission tests' name for it


@dataclass(frozen=True)
class Verdict:
    """The gate's decision for one request: admitted with a reservation ticket, or refused and told when to retry."""

    refusal: str  # "" (admitted) or a conventions.REFUSED_ADMISSION_* reason
    ticket: int  # the admitted request's reservation (Admission.settle), 0 when refused
    retry_after_s: int  # the refused request's Retry-After (whole seconds), 0 when admitted


class Admission:
    """The gate and its poller (see the module's docstring)."""

    def __init__(
        self, upstream: str, ca_file: str = "", *, min_seats: float | None = DEFAULT_MIN_SEATS,
        max_queue: int | None = DEFAULT_MAX_QUEUE, poll_s: float = DEFAULT_POLL_S, window_s: float = DEFAULT_WINDOW_S,
        fallback_footprint: int = DEFAULT_FALLBACK_FOOTPRINT, timeout_s: float = FETCH_TIMEOUT_S,
        metrics_path: str = "/metrics", clock: Callable[[], float] = time.monotonic, engine: str = AUTO,
        sheddable: frozenset[str] = frozenset(), shed_margin: float = DEFAULT_SHED_MARGIN, slo: SloConfig | None = None,
        taps: int = 1, client_header: str = "",
    ) -> None:
        self.url = upstream.rstrip("/") + metrics_path
        self.engine = engine  # the engine kind whose adapter reads the page, or AUTO
        self.ssl: ssl.SSLContext | None = (
            ssl.create_default_context(cafile=ca_file or None) if upstream.startswith("https://") else None
        )
        self.min_seats = min_seats  # the operator's floors (None: off; the objectives decide)
        self.max_queue = max_queue
        self.sheddable = sheddable  # class names refused first, at shed_margin x the objectives
        self.shed_margin = shed_margin
        self.poll_s = poll_s
        self.window_s = window_s
        self.fallback_footprint = float(fallback_footprint)
        self.timeout_s = timeout_s
        self.clock = clock
        self.retry_after_s = max(RETRY_AFTER_S, math.ceil(poll_s))  # the least Retry-After, the most below
        self.max_retry_after_s = max(MAX_RETRY_AFTER_S, self.retry_after_s)
        # the refused clients in line and when each may come back (exporter.tap.turns)
        self.clients, self.turns = ClientKeys(client_header), Turns()
        # The tap processes gating this engine (--workers N x --admission-taps): each sees only what it admitted
        # since the reading and its own in-flight requests, and takes the others to have done as much.
        self.taps = max(1, taps)
        # The share of a prompt the prefix cache serves (the engine's hit ratio over the window, capped): a prompt
        # takes free KV only for the rest (docs/capacity.md, "Prefix caching").
        self.cached_share = 0.0
        self._prefix: deque[tuple[float, float, float]] = deque()  # (time, hits, queries) within window_s
        # The last reading and what was derived from it.
        self.reading: Reading | None = None
        self.read_at: float | None = None
        self.footprint = self.fallback_footprint
        # one seat as the estimate counts it: the footprint less the prompt share the prefix cache serves, in whole
        # KV blocks (llm_tap_admission_footprint_tokens)
        self.seat_tokens = self.fallback_footprint
        # the median prompt over the window: what a typical request needs in free KV to start (the wait is an
        # expectation; the p99 footprint above is for seats, a bound)
        self.prompt_median = self.fallback_footprint
        self.start_seats = math.inf  # requests of median prompt the free KV starts now (exporter.tap.predict)
        self.seats = math.inf
        # The seat estimate's inputs besides the page (exporter.tap.seats): the exact sizes of the requests this tap
        # saw finish, and the requests it has in flight; until then the fallback footprint, committing whole caps.
        self.sizes = seats.SizeWindow()
        self.in_flight: Callable[[], Iterable[seats.InFlight]] = tuple
        self._last_sizes = seats.Sizes.fallback(self.fallback_footprint)
        self.waiting = 0.0
        self.queue = 0.0  # the engine's queue as persisted over the last two readings (exporter.tap.predict)
        self.growing = False  # the engine's queue rose at each of the last readings (exporter.tap.predict)
        self.rates = Rates()
        self._served: deque[tuple[float, float, float]] = deque()  # (time, running, ITL) over DECODE_MEMORY_S
        # (time, counters, waiting) of the readings within FINISH_WINDOW_S
        self._counted: deque[tuple[float, Counters, float]] = deque()
        self._slo = slo  # the classes the last request was decided under (the gauges' objectives: the tightest)
        # the admitted requests the engine does not show yet (exporter.tap.reservations): a lost one for as long
        # as a reading stays fresh
        self.reserved = Reservations(STALE_POLLS * poll_s + timeout_s)
        self.last_error = ""
        self.polls = 0
        self.refusals = 0
        self.read_errors = dict.fromkeys(C.ADMISSION_READ_REASONS, 0)  # every reason's series from the start
        self._history: deque[tuple[float, Buckets, Buckets]] = deque()
        self._task: asyncio.Task[None] | None = None
        self._page = PageReader(PageSource(self.url, ca_file, timeout_s, engine, MAX_PAGE_BYTES),
                                timeout_s + PARSE_DEADLINE_S)

    # -- the gate ----------------------------------------------------------------------------
    @property
    def readable(self) -> bool:
        """A recent reading exists (else the gate fails open)."""
        return self.read_at is not None and self.clock() - self.read_at <= STALE_POLLS * self.poll_s + self.timeout_s

    @property
    def admitted_since(self) -> int:
        """The requests this tap admitted that the engine's page does not show yet (exporter.tap.reservations)."""
        return self.reserved.count(self.clock())

    @property
    def admitted_all(self) -> int:
        """The requests all taps admitted that the engine does not show yet, as this one can tell: its own,
        taps times."""
        return self.admitted_since * self.taps

    def outlook(self, held: int = 0) -> Outlook:
        """What the gate knows now; `held`: refused clients' turns counted as admitted (exporter.tap.turns)."""
        return Outlook(self.start_seats, self.queue, self.admitted_all + held, self.rates, self.growing, self.seats)


    def policy(self, objective: Objective | None = None, slo: SloConfig | None = None) -> Policy:
        """A request's objectives and priority; with no objective given, the tightest class's (the gauges')."""
        slo = slo if slo is not None else self._slo
        tight_ttft, tight_tpot = slo.tightest if slo is not None else (None, None)
        if objective is None:
            return Policy(tight_ttft, tight_tpot, False, tight_ttft, tight_tpot, self.shed_margin)
        return Policy(objective.ttft, objective.tpot, objective.slo_class in self.sheddable, tight_ttft, tight_tpot,
                      self.shed_margin)

    def refusal(self, objective: Objective | None = None, slo: SloConfig | None = None, held: int = 0) -> str:
        """Why a request arriving now would be refused (a conventions.REFUSED_ADMISSION_* reason), or ""; `held`:
        the turns ahead of its client that hold a seat (exporter.tap.turns)."""
        if not self.readable:
            return ""
        n = self.admitted_all + held
        if self.min_seats is not None and self.seats - n < self.min_seats:
            return C.REFUSED_ADMISSION_KV
        # this request's place in the queue: the engine's, and those beyond the free seats, itself included
        queued = self.waiting + max(0.0, n + 1 - self.seats)
        if self.max_queue is not None and queued > self.max_queue:
            return C.REFUSED_ADMISSION_QUEUE
        return predicted_refusal(self.outlook(held), self.policy(objective, slo))

    def is_open(self) -> bool:
        """Would a request of the tightest class arriving now be admitted (without counting it)?"""
        return not self.refusal()

    def decide(self, objective: Objective | None = None, slo: SloConfig | None = None) -> str:
        """Decide for one new request (its objective, and the classes it was resolved under): "" (admitted,
        and counted until the engine shows it) or why it is refused."""
        return self.decide_ticket(objective, slo).refusal

    def decide_ticket(self, objective: Objective | None = None, slo: SloConfig | None = None,
                      client: str = "") -> Verdict:
        """`decide` for a request from `client` (ClientKeys.key; "": no turn), with the admitted request's
        reservation ticket for `settle` once it ends, or the refused one's Retry-After. A client back before its
        time is refused again (unless the engine has seats for every client in line and it); the others wait for
        the turns ahead of them that hold a seat (exporter.tap.turns)."""
        if slo is not None:
            self._slo = slo
        now = self.clock()
        holding, waiting = self.turns.ahead(client, now)
        early = self.turns.early(client, now) if client and self.readable else 0.0
        if early:
            self.refusals += 1
            return Verdict(C.REFUSED_ADMISSION_EARLY, 0, self._whole_seconds(early))
        why = self.refusal(objective, slo, holding)
        if not why:
            self.turns.admitted(client, now)
            return Verdict("", self.reserved.add(now), 0)
        self.refusals += 1
        expected = seconds_to_seat(self.outlook(waiting), self.policy(objective, slo))
        seconds = self._whole_seconds(max(expected, self.turns.pace(waiting, now)))
        if client:
            self.turns.refused(client, now, seconds)
        return Verdict(why, 0, seconds)

    def _whole_seconds(self, seconds: float) -> int:
        """Retry-After: whole seconds, rounded up, between retry_after_s and max_retry_after_s."""
        if not seconds < self.max_retry_after_s:  # inf and NaN too
            return self.max_retry_after_s
        return max(self.retry_after_s, math.ceil(seconds))

    def settle(self, ticket: int) -> None:
        """An admitted request ended at the tap: it holds no seat any more (exporter.tap.reservations)."""
        if ticket:
            self.reserved.settle(ticket)

    def admit(self, objective: Objective | None = None) -> bool:
        return not self.decide(objective)

    # -- readings ----------------------------------------------------------------------------
    def update(self, reading: Reading, asked_at: float | None = None) -> None:
        """Take a new reading (its page asked for at `asked_at`, by default now): the footprint over the window,
        the seats, the queue, and the admitted requests it shows."""
        now = self.clock()
        restarted = self.reading is not None and reading.counters.finished < self.reading.counters.finished
        history = self._history
        history.append((now, reading.prompt, reading.generation))
        while len(history) > 1 and history[1][0] <= now - self.window_s:
            history.popleft()
        _, prompt0, gen0 = history[0]
        prompt, gen = _delta(reading.prompt, prompt0), _delta(reading.generation, gen0)
        if len(history) == 1 or not prompt or prompt[-1][1] <= 0:  # no earlier reading, or none finished since
            prompt, gen = reading.prompt, reading.generation
        p50_prompt = histogram_quantile(0.5, prompt)  # the start condition's prompt (exporter.tap.predict)
        if p50_prompt is not None:
            self.prompt_median = max(1.0, p50_prompt)
        self.reading = reading
        # exact sizes from the tap's own requests when it has seen enough, the engine's histograms otherwise
        sizes = self.sizes.sizes() or seats.Sizes.from_histograms(prompt, gen) or self._last_sizes
        self._last_sizes = sizes
        self._learn_prefix(now, reading)
        flights = list(self.in_flight())
        estimate = seats.estimate(reading.free_tokens, reading.block_size, flights, sizes,
                                  cached_share=self.cached_share, taps=self.taps)
        self.footprint, self.seats, self.seat_tokens = sizes.footprint, estimate.seats, estimate.footprint
        self.waiting = reading.waiting
        event("tap_admission_reading", logging.DEBUG, logger=TAP_LOGGER, running=f"{reading.counters.running:g}",
              waiting=f"{reading.waiting:g}", free_tokens=f"{reading.free_tokens:.0f}", admitted=self.admitted_since,
              refused=self.refusals, itl=f"{self.rates.itl_s or 0:.4f}", drain=f"{self.rates.finish_rate or 0:.2f}")
        self.read_at = now
        self._learn(now, reading)
        c = reading.counters
        self.reserved.seen(c.running + c.finished + self.queue, now if asked_at is None else asked_at, now, self.taps,
                           restarted)
        self._start_seats(reading, flights)

    def _learn_prefix(self, now: float, reading: Reading) -> None:
        """The prefix-cache hit ratio over the window (`cached_share`); a counter that went back starts it anew."""
        history = self._prefix
        if history and (reading.prefix_hits < history[-1][1] or reading.prefix_queries < history[-1][2]):
            history.clear()
        history.append((now, reading.prefix_hits, reading.prefix_queries))
        while len(history) > 2 and history[1][0] <= now - self.window_s:
            history.popleft()
        self.cached_share = cached_share(history, self.cached_share)

    def _learn(self, now: float, reading: Reading) -> None:
        """The rates over the last RATE_WINDOW_S and the persisted queue (exporter.tap.predict)."""
        counted = self._counted
        self.queue = min(reading.waiting, counted[-1][2]) if counted else reading.waiting
        finished = [(t, c.finished) for t, c, _ in counted]
        counted.append((now, reading.counters, reading.waiting))
        while len(counted) > 2 and counted[1][0] <= now - FINISH_WINDOW_S:
            counted.popleft()
        self.growing = queue_growing([w for _, _, w in counted])
        # the ITL and prefill means over the last RATE_WINDOW_S: the newest reading at least that old
        then, old, _ = next((r for r in reversed(counted) if r[0] <= now - RATE_WINDOW_S), counted[0])
        rates = rates_between(old, reading.counters) if then < now else Rates()
        served = self._served
        # the batch the window's ITL was measured at: its readings' mean running (the newest alone would be
        # ahead of the ITL while a batch grows, and record a large batch as served in time)
        batch = [c.running for t, c, _ in counted if t > then]
        if rates.itl_s is not None and batch and sum(batch) >= len(batch):
            served.append((now, sum(batch) / len(batch), rates.itl_s))
        while served and served[0][0] <= now - DECODE_MEMORY_S:
            served.popleft()
        rates = replace(rates, kv_batch=self._kv_batch(reading), served=tuple((n, itl) for _, n, itl in served))
        self.rates = replace(rates, finish_rate=drain_rate(finish_rate(finished, now, reading.counters.finished), rates))

    def _start_seats(self, reading: Reading, flights: Sequence[seats.InFlight]) -> None:
        """Median prompts the free KV starts until the next reading: the free tokens less what the running
        requests' decode takes in one poll (a token per ITL each, as far as their max_tokens go; all taps'). Read
        as the engine's free count alone, a request arriving late in the poll found that room already taken by
        growth and waited behind the requests vLLM preempted for it (decode overload: every bad admitted request
        of the virtual bench missed its TTFT so)."""
        block = reading.block_size if reading.block_size >= 1 and math.isfinite(reading.block_size) else 1.0
        uncached = max(1.0, self.prompt_median * (1.0 - self.cached_share))  # what a median prompt takes of free KV
        itl = self.rates.itl_s
        # a page whose ITL says faster than MIN_DECODE_STEP_S (no engine decodes a batch so fast) would have every
        # uncapped stream fill the KV within the poll and close the gate: it is read as that floor
        steps = self.poll_s / max(itl, MIN_DECODE_STEP_S) if itl else 0.0
        growth = seats.decode_growth(flights, steps) * self.taps
        self.start_seats = max(0.0, reading.free_tokens - growth) / (math.ceil(uncached / block) * block)

    def _kv_batch(self, reading: Reading) -> float:
        """How many requests of the recent mean size the whole KV holds (each its uncached prompt and, on
        average over its life, half its output); 0 when the page gives no size or nothing is known of sizes."""
        sizes = self._last_sizes
        if not (reading.total_tokens > 0 and math.isfinite(reading.total_tokens)):
            return 0.0
        output = sizes.outputs.mean() if sizes.outputs is not None else sizes.footprint - sizes.prompt_mean
        held = sizes.prompt_mean * (1.0 - self.cached_share) + max(0.0, output) / 2
        return reading.total_tokens / held if held >= 1 else 0.0

    async def poll(self) -> bool:
        """Read the engine once; on failure the previous reading stays (until it is stale). Never
        raises (but for cancellation)."""
        self.polls += 1
        was_open = self.is_open()
        asked_at = self.clock()
        try:
            reading = await self._ask()
        except EngineReadError as e:
            # a page that says something impossible is not believed at all: the gate fails open now
            self._unreadable(e.reason, e)
            self.read_at = None
            return False
        except Exception as e:  # noqa: BLE001  (whatever the engine answers, the tap goes on)
            self._unreadable(C.ADMISSION_READ_UNREACHABLE, e)  # the last reading stays until it is stale
            return False
        if self.last_error:
            event("tap_admission_engine_readable", logger=TAP_LOGGER, url=self.url)
            self.last_error = ""
        if reading.bad_histogram:
            self.read_errors[C.ADMISSION_READ_BAD_HISTOGRAM] += 1
        self.update(reading, asked_at)
        if self.is_open() != was_open:
            event(f"tap_admission_{'open' if not was_open else 'closed'}", logger=TAP_LOGGER,
                  seats=f"{self.seats:.1f}", footprint=f"{self.footprint:.0f}", waiting=f"{self.waiting:.0f}")
        return True

    def _unreadable(self, reason: str, e: Exception) -> None:
        self.read_errors[reason] += 1
        error = f"{type(e).__name__}: {e}"[:200]
        if not self.last_error:
            event("tap_admission_engine_unreadable", logging.WARNING, logger=TAP_LOGGER, url=self.url, reason=reason,
                  error=error, note="the gate admits while it cannot read the engine")
        self.last_error = error

    def _read(self, text: str) -> Reading:
        return read_text(text, self.engine)

    async def _ask(self) -> Reading:
        """One reading from the page reader (exporter.tap.page_reader): EngineReadError when the page was read but
        is not believed, another error when it could not be fetched (or the reader failed)."""
        answer = await self._page.ask()
        if "reading" in answer:
            return reading_of(answer["reading"])
        error = str(answer.get("error", ""))
        if answer.get("stage") == STAGE_FETCH:
            raise EngineUnreachable(error)
        raise EngineReadError(error, str(answer.get("reason") or C.ADMISSION_READ_NOT_ENGINE))

    async def _run(self) -> None:
        while True:
            started = self.clock()
            await self.poll()
            # a page that costs the reader much CPU is read less often (page_reader.MAX_CPU_SHARE), never stale for it
            rest = min(self._page.rest_s, STALE_POLLS * self.poll_s)
            await asyncio.sleep(max(0.0, self.poll_s - (self.clock() - started), rest))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        await self._page.close()

    # -- self-metrics ------------------------------------------------------------------------
    def render(self) -> bytes:
        """The gate's gauges for the tap's /metrics page."""
        readable = self.readable
        lines = []
        for d, value in (
            (C.TAP_ADMISSION_OPEN, 1 if self.is_open() else 0),
            (C.TAP_ADMISSION_ENGINE_READABLE, 1 if readable else 0),
            (C.TAP_ADMISSION_SEATS, self.seats if readable and math.isfinite(self.seats) else math.nan),
            (C.TAP_ADMISSION_FOOTPRINT, self.seat_tokens),
            (C.TAP_ADMISSION_QUEUE, self.waiting if readable else math.nan),
            (C.TAP_ADMISSION_PREDICTED_WAIT, predicted_wait(self.outlook()) if readable else math.nan),
            (C.TAP_ADMISSION_ENGINE_ITL,
             self.rates.itl_s if readable and self.rates.itl_s is not None else math.nan),
        ):
            lines.append(f"# HELP {d.name} {d.help}\n# TYPE {d.name} {d.kind}\n{d.name} {go_g(value)}\n")
        d = C.TAP_ADMISSION_READ_ERRORS
        lines.append(f"# HELP {d.name} {d.help}\n# TYPE {d.name} {d.kind}\n")
        lines += [f'{d.name}{{{C.LABEL_REASON}="{reason}"}} {n}\n' for reason, n in self.read_errors.items()]
        return "".join(lines).encode()
