"""The admission gate's state, sans-IO: what it learned from the engine's readings and how it decides for a request.

No socket, no task, no clock of its own: `update(reading, now)` takes what a poll read (exporter.tap.gate_reading)
and `decide(request, now)` answers for one new request; the poller (exporter.tap.gate_poller) owns the loop, the
page reader and the time, and feeds it. So every decision can be tested by feeding readings and asking.

What it learns from each reading: the seats at p99 context (exporter.tap.seats.estimate: more p99-sized requests
the free KV tokens take now and as they grow, net of the tap's requests in flight; sizes exact from the tap's own
finished requests once it has seen enough, else p99 prompt + p99 output of the engine's histograms over `window_s`,
else the last known, else `fallback_footprint`), the start seats (median prompts the free KV starts before the next
reading), the queue as persisted over two readings and whether it keeps growing, the rates from the page's counter
deltas (exporter.tap.predict), and the prefix cache's hit ratio over `window_s` (capped at MAX_CACHED_SHARE: a
prompt takes free KV only for what the cache does not serve).

A reading that is not believed (gate_reading.implausible, or the poller's EngineReadError) makes the gate fail
open at once; an engine that cannot be reached leaves the last reading until it is STALE_POLLS intervals old.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from exporter.tap import seats
from exporter.tap.classes import SloConfig
from exporter.tap.gate_reading import Reading, implausible
from exporter.tap.objectives import Objective
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
    queue_growing,
    rates_between,
    seconds_to_seat,
)
from exporter.tap.predict import refusal as predicted_refusal
from exporter.tap.reservations import Reservations
from exporter.tap.turns import Turns
from llmslo import conventions as C
from llmslo.histograms import Buckets, histogram_quantile

# 0.25 s: half the interactive TTFT objective (0.5 s), so a queue that builds is seen well before a queued request has
# lost its objective; vLLM refreshes these gauges every step, and a render 4 times a second costs its API server little.
DEFAULT_POLL_S = 0.25
DEFAULT_MIN_SEATS: float | None = None
DEFAULT_MAX_QUEUE: int | None = None
MIN_DECODE_STEP_S = 0.001  # the fastest decode step the start seats believe (GateState._start_seats)
DEFAULT_WINDOW_S = 60.0  # the recent window of finished requests the p99 footprint is taken from
DEFAULT_FALLBACK_FOOTPRINT = 4096  # tokens, until the engine's histograms have a finished request
STALE_POLLS = 4  # a reading older than this many poll intervals (plus the timeout) no longer counts
FETCH_TIMEOUT_S = 2.0
# Retry-After (whole seconds, RFC 9110) is when a seat is expected (exporter.tap.predict.seconds_to_seat), at least
# a second (and a poll: the gate changes its mind only at a reading) and at most MAX_RETRY_AFTER_S.
RETRY_AFTER_S = 1
MAX_RETRY_AFTER_S = 30
# The most of a prompt the prefix cache is taken to serve (the engine's hit ratio over the window, capped): a page
# that claims every token is cached still charges each request a tenth of its prompt, never nothing.
MAX_CACHED_SHARE = 0.9


@dataclass(frozen=True)
class GateSettings:
    """The operator's choices, fixed for the gate's life."""

    min_seats: float | None = DEFAULT_MIN_SEATS  # the operator's floors (None: off; the objectives decide)
    max_queue: int | None = DEFAULT_MAX_QUEUE
    poll_s: float = DEFAULT_POLL_S
    window_s: float = DEFAULT_WINDOW_S
    fallback_footprint: float = float(DEFAULT_FALLBACK_FOOTPRINT)
    timeout_s: float = FETCH_TIMEOUT_S  # the page fetch's: a reading stays fresh for as long as a poll may take
    sheddable: frozenset[str] = frozenset()  # class names refused first, at shed_margin x the objectives
    shed_margin: float = DEFAULT_SHED_MARGIN
    # The tap processes gating this engine (--workers N x --admission-taps): each sees only what it admitted since
    # the reading and its own in-flight requests, and takes the others to have done as much.
    taps: int = 1

    @property
    def stale_s(self) -> float:
        """How old a reading may be and still count."""
        return STALE_POLLS * self.poll_s + self.timeout_s

    @property
    def retry_after_s(self) -> int:
        """The least Retry-After: a second, and a poll."""
        return max(RETRY_AFTER_S, math.ceil(self.poll_s))

    @property
    def max_retry_after_s(self) -> int:
        return max(MAX_RETRY_AFTER_S, self.retry_after_s)


@dataclass
class Learned:
    """What the readings taught the gate (its gauges show it)."""

    footprint: float  # the p99 request size (tokens)
    seat_tokens: float  # one seat as the estimate counts it: less the cached prompt share, in whole KV blocks
    # the median prompt over the window: what a typical request needs in free KV to start (the wait is an
    # expectation; the p99 footprint is for seats, a bound)
    prompt_median: float
    sizes: seats.Sizes  # the last request sizes known (kept when a reading gives none)
    reading: Reading | None = None
    read_at: float | None = None  # when the last believed reading was taken (None: none, or one not believed)
    start_seats: float = math.inf  # requests of median prompt the free KV starts now (exporter.tap.predict)
    seats: float = math.inf
    waiting: float = 0.0  # the engine's queue at the last reading
    queue: float = 0.0  # the engine's queue as persisted over the last two readings (exporter.tap.predict)
    growing: bool = False  # the engine's queue rose at each of the last readings
    rates: Rates = Rates()
    cached_share: float = 0.0  # the share of a prompt the prefix cache serves (docs/capacity.md, "Prefix caching")

    @classmethod
    def fallback(cls, footprint: float) -> Learned:
        """Before any reading: every size the fallback footprint (committing whole caps)."""
        return cls(footprint, footprint, footprint, seats.Sizes.fallback(footprint))


@dataclass
class Windows:
    """The recent readings the learned values are taken over, each entry's time first."""

    sizes: deque[tuple[float, Buckets, Buckets]] = field(default_factory=deque)  # prompt, generation; window_s
    prefix: deque[tuple[float, float, float]] = field(default_factory=deque)  # hits, queries; window_s
    counted: deque[tuple[float, Counters, float]] = field(default_factory=deque)  # counters, waiting; FINISH_WINDOW_S
    served: deque[tuple[float, float, float]] = field(default_factory=deque)  # running, ITL; DECODE_MEMORY_S


@dataclass
class Health:
    """What the reads came to and what the gate did, counted for the logs and the gauges."""

    polls: int = 0
    refusals: int = 0
    last_error: str = ""  # why the engine could not be read ("" once it is read again)
    read_errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(C.ADMISSION_READ_REASONS, 0))


@dataclass(frozen=True)
class GateRequest:
    """A new timed request as the gate sees it: its objective, the classes it was resolved under and its client
    (exporter.tap.turns.ClientKeys.key; "": no turn)."""

    objective: Objective | None = None
    slo: SloConfig | None = None
    client: str = ""


@dataclass(frozen=True)
class Verdict:
    """The gate's decision for one request: admitted with a reservation ticket, or refused and told when to retry."""

    refusal: str  # "" (admitted) or a conventions.REFUSED_ADMISSION_* reason
    ticket: int  # the admitted request's reservation (GateState.settle), 0 when refused
    retry_after_s: int  # the refused request's Retry-After (whole seconds), 0 when admitted


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


class GateState:
    """The gate: settings, what it learned, and its decisions (see the module's docstring). Every time is given."""

    def __init__(self, settings: GateSettings, slo: SloConfig | None = None) -> None:
        self.settings = settings
        self.learned = Learned.fallback(settings.fallback_footprint)
        self.windows = Windows()
        self.health = Health()
        # The seat estimate's sizes besides the page (exporter.tap.seats): those of the requests this tap saw finish.
        self.sizes = seats.SizeWindow()
        self.turns = Turns()  # the refused clients in line and when each may come back (exporter.tap.turns)
        # the admitted requests the engine does not show yet (exporter.tap.reservations): a lost one for as long as
        # a reading stays fresh
        self.reserved = Reservations(settings.stale_s)
        self.slo = slo  # the classes the last request was decided under (the gauges' objectives: the tightest)

    # -- the decision ----------------------------------------------------------------------------
    def readable(self, now: float) -> bool:
        """A recent reading exists (else the gate fails open)."""
        read_at = self.learned.read_at
        return read_at is not None and now - read_at <= self.settings.stale_s

    def admitted_since(self, now: float) -> int:
        """The requests this tap admitted that the engine's page does not show yet (exporter.tap.reservations)."""
        return self.reserved.count(now)

    def admitted_all(self, now: float) -> int:
        """The requests all taps admitted that the engine does not show yet, as this one can tell: its own, taps
        times."""
        return self.admitted_since(now) * self.settings.taps

    def outlook(self, now: float, held: int = 0) -> Outlook:
        """What the gate knows now; `held`: refused clients' turns counted as admitted (exporter.tap.turns)."""
        k = self.learned
        return Outlook(k.start_seats, k.queue, self.admitted_all(now) + held, k.rates, k.growing, k.seats)

    def policy(self, objective: Objective | None = None, slo: SloConfig | None = None) -> Policy:
        """A request's objectives and priority; with no objective given, the tightest class's (the gauges')."""
        slo = slo if slo is not None else self.slo
        tight_ttft, tight_tpot = slo.tightest if slo is not None else (None, None)
        margin = self.settings.shed_margin
        if objective is None:
            return Policy(tight_ttft, tight_tpot, False, tight_ttft, tight_tpot, margin)
        return Policy(objective.ttft, objective.tpot, objective.base_class in self.settings.sheddable, tight_ttft,
                      tight_tpot, margin)

    def refusal(self, now: float, objective: Objective | None = None, slo: SloConfig | None = None,
                held: int = 0) -> str:
        """Why a request arriving now would be refused (a conventions.REFUSED_ADMISSION_* reason), or ""; `held`:
        the turns ahead of its client that hold a seat (exporter.tap.turns)."""
        if not self.readable(now):
            return ""
        s, k = self.settings, self.learned
        n = self.admitted_all(now) + held
        if s.min_seats is not None and k.seats - n < s.min_seats:
            return C.REFUSED_ADMISSION_KV
        # this request's place in the queue: the engine's, and those beyond the free seats, itself included
        queued = k.waiting + max(0.0, n + 1 - k.seats)
        if s.max_queue is not None and queued > s.max_queue:
            return C.REFUSED_ADMISSION_QUEUE
        return predicted_refusal(self.outlook(now, held), self.policy(objective, slo))

    def is_open(self, now: float) -> bool:
        """Would a request of the tightest class arriving now be admitted (without counting it)?"""
        return not self.refusal(now)

    def decide(self, request: GateRequest, now: float) -> Verdict:
        """Decide for one new request: admitted (counted until the engine shows it, with the reservation ticket for
        `settle` once it ends) or refused with its Retry-After. A client back before its time is refused again
        (unless the engine has seats for every client in line and it); the others wait for the turns ahead of
        them that hold a seat (exporter.tap.turns)."""
        objective, slo, client = request.objective, request.slo, request.client
        if slo is not None:
            self.slo = slo
        holding, waiting = self.turns.ahead(client, now)
        early = self.turns.early(client, now) if client and self.readable(now) else 0.0
        if early:
            self.health.refusals += 1
            return Verdict(C.REFUSED_ADMISSION_EARLY, 0, self._whole_seconds(early))
        why = self.refusal(now, objective, slo, holding)
        if not why:
            self.turns.admitted(client, now)
            return Verdict("", self.reserved.add(now), 0)
        self.health.refusals += 1
        expected = seconds_to_seat(self.outlook(now, waiting), self.policy(objective, slo))
        seconds = self._whole_seconds(max(expected, self.turns.pace(waiting, now)))
        if client:
            self.turns.refused(client, now, seconds)
        return Verdict(why, 0, seconds)

    def _whole_seconds(self, seconds: float) -> int:
        """Retry-After: whole seconds, rounded up, between retry_after_s and max_retry_after_s."""
        if not seconds < self.settings.max_retry_after_s:  # inf and NaN too
            return self.settings.max_retry_after_s
        return max(self.settings.retry_after_s, math.ceil(seconds))

    def settle(self, ticket: int) -> None:
        """An admitted request ended at the tap: it holds no seat any more (exporter.tap.reservations)."""
        if ticket:
            self.reserved.settle(ticket)

    # -- readings --------------------------------------------------------------------------------
    def unreadable(self, reason: str, error: str, *, forget: bool) -> bool:
        """A poll gave no reading (`reason`: a conventions.ADMISSION_READ_* one). `forget`: the page was read but not
        believed, and the gate fails open now; else (an engine that cannot be reached) the last reading stays until
        it is stale. True when the engine was readable before (the poller logs the change once)."""
        self.health.read_errors[reason] += 1
        first = not self.health.last_error
        self.health.last_error = error[:200]
        if forget:
            self.learned.read_at = None
        return first

    def update(self, reading: Reading, now: float, *, asked_at: float | None = None,
               flights: Sequence[seats.InFlight] = ()) -> str:
        """Take a new reading (its page asked for at `asked_at`, by default `now`; `flights`: this tap's requests in
        flight): the footprint over the window, the seats, the queue, the rates and the admitted requests it shows.
        "" when taken, else why it is not believed (gate_reading.implausible): the gate fails open, as for a page
        not believed."""
        why = implausible(reading)
        if why:
            self.unreadable(why, f"the reading says something impossible: {reading}", forget=True)
            return why
        self.health.last_error = ""
        if reading.bad_histogram:
            self.health.read_errors[C.ADMISSION_READ_BAD_HISTOGRAM] += 1
        k, taps = self.learned, self.settings.taps
        restarted = k.reading is not None and reading.counters.finished < k.reading.counters.finished
        prompt, gen = self._learn_sizes(now, reading)
        k.reading = reading
        # exact sizes from the tap's own requests when it has seen enough, the engine's histograms otherwise
        k.sizes = self.sizes.sizes() or seats.Sizes.from_histograms(prompt, gen) or k.sizes
        self._learn_prefix(now, reading)
        estimate = seats.estimate(reading.free_tokens, reading.block_size, flights, k.sizes,
                                  cached_share=k.cached_share, taps=taps)
        k.footprint, k.seats, k.seat_tokens = k.sizes.footprint, estimate.seats, estimate.footprint
        k.waiting = reading.waiting
        k.read_at = now
        self._learn(now, reading)
        c = reading.counters
        self.reserved.seen(c.running + c.finished + k.queue, now if asked_at is None else asked_at, now, taps,
                           restarted)
        self._start_seats(reading, flights)
        return ""

    def _learn_sizes(self, now: float, reading: Reading) -> tuple[Buckets, Buckets]:
        """The request-size histograms of the requests finished within the window (the whole histograms when
        none finished since the oldest reading kept), and the median prompt they give."""
        history = self.windows.sizes
        history.append((now, reading.prompt, reading.generation))
        while len(history) > 1 and history[1][0] <= now - self.settings.window_s:
            history.popleft()
        _, prompt0, gen0 = history[0]
        prompt, gen = _delta(reading.prompt, prompt0), _delta(reading.generation, gen0)
        if len(history) == 1 or not prompt or prompt[-1][1] <= 0:  # no earlier reading, or none finished since
            prompt, gen = reading.prompt, reading.generation
        p50_prompt = histogram_quantile(0.5, prompt)  # the start condition's prompt (exporter.tap.predict)
        if p50_prompt is not None:
            self.learned.prompt_median = max(1.0, p50_prompt)
        return prompt, gen

    def _learn_prefix(self, now: float, reading: Reading) -> None:
        """The prefix-cache hit ratio over the window (`cached_share`); a counter that went back starts it anew."""
        history = self.windows.prefix
        if history and (reading.prefix_hits < history[-1][1] or reading.prefix_queries < history[-1][2]):
            history.clear()
        history.append((now, reading.prefix_hits, reading.prefix_queries))
        while len(history) > 2 and history[1][0] <= now - self.settings.window_s:
            history.popleft()
        self.learned.cached_share = cached_share(history, self.learned.cached_share)

    def _learn(self, now: float, reading: Reading) -> None:
        """The rates over the last RATE_WINDOW_S and the persisted queue (exporter.tap.predict)."""
        k, counted, served = self.learned, self.windows.counted, self.windows.served
        k.queue = min(reading.waiting, counted[-1][2]) if counted else reading.waiting
        finished = [(t, c.finished) for t, c, _ in counted]
        counted.append((now, reading.counters, reading.waiting))
        while len(counted) > 2 and counted[1][0] <= now - FINISH_WINDOW_S:
            counted.popleft()
        k.growing = queue_growing([w for _, _, w in counted])
        # the ITL and prefill means over the last RATE_WINDOW_S: the newest reading at least that old
        then, old, _ = next((r for r in reversed(counted) if r[0] <= now - RATE_WINDOW_S), counted[0])
        rates = rates_between(old, reading.counters) if then < now else Rates()
        # the batch the window's ITL was measured at: its readings' mean running (the newest alone would be
        # ahead of the ITL while a batch grows, and record a large batch as served in time)
        batch = [c.running for t, c, _ in counted if t > then]
        if rates.itl_s is not None and batch and sum(batch) >= len(batch):
            served.append((now, sum(batch) / len(batch), rates.itl_s))
        while served and served[0][0] <= now - DECODE_MEMORY_S:
            served.popleft()
        rates = replace(rates, kv_batch=self._kv_batch(reading), served=tuple((n, itl) for _, n, itl in served))
        k.rates = replace(rates, finish_rate=drain_rate(finish_rate(finished, now, reading.counters.finished), rates))

    def _start_seats(self, reading: Reading, flights: Sequence[seats.InFlight]) -> None:
        """Median prompts the free KV starts until the next reading: the free tokens less what the running
        requests' decode takes in one poll (a token per ITL each, as far as their max_tokens go; all taps'). Read
        as the engine's free count alone, a request arriving late in the poll found that room already taken by
        growth and waited behind the requests vLLM preempted for it (decode overload: every bad admitted request
        of the virtual bench missed its TTFT so)."""
        k = self.learned
        block = reading.block_size if reading.block_size >= 1 and math.isfinite(reading.block_size) else 1.0
        uncached = max(1.0, k.prompt_median * (1.0 - k.cached_share))  # what a median prompt takes of free KV
        itl = k.rates.itl_s
        # a page whose ITL says faster than MIN_DECODE_STEP_S (no engine decodes a batch so fast) would have every
        # uncapped stream fill the KV within the poll and close the gate: it is read as that floor
        steps = self.settings.poll_s / max(itl, MIN_DECODE_STEP_S) if itl else 0.0
        growth = seats.decode_growth(flights, steps) * self.settings.taps
        k.start_seats = max(0.0, reading.free_tokens - growth) / (math.ceil(uncached / block) * block)

    def _kv_batch(self, reading: Reading) -> float:
        """How many requests of the recent mean size the whole KV holds (each its uncached prompt and, on
        average over its life, half its output); 0 when the page gives no size or nothing is known of sizes."""
        sizes, share = self.learned.sizes, self.learned.cached_share
        if not (reading.total_tokens > 0 and math.isfinite(reading.total_tokens)):
            return 0.0
        output = sizes.outputs.mean() if sizes.outputs is not None else sizes.footprint - sizes.prompt_mean
        held = sizes.prompt_mean * (1.0 - share) + max(0.0, output) / 2
        return reading.total_tokens / held if held >= 1 else 0.0
