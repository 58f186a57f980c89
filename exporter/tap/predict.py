"""The admission decision as pure functions: will a request arriving now start within its class's TTFT
objective, and are the running requests within their TPOT objective? (exporter.tap.admission keeps the state.)

The gate refuses only when refusing helps someone: a request that the engine can start at once is admitted
whatever its prefill will cost (nothing is ahead of it, so refusing it saves nobody's objective). A request
waits only behind requests that cannot start now, and each of those needs a running request to finish first:

    blocked  = max(0, persistent queue + admitted since the reading + 1 - seats)   (beyond the free KV seats)
    wait     = prefill + blocked / drain rate                       (blocked > 0; nothing finishing: inf)
             = the engine's queue time + prefill                    (blocked = 0, its queue growing)
             = 0                                                    (blocked = 0 otherwise)

`seats` are free KV tokens, less what the running requests decode into before the next reading, over the median
prompt of the recent requests, in whole KV blocks: the engine starts a request whose prompt fits (the p99
lifetime footprint of exporter.tap.admission's `seats` is a bound against preemption, not the start condition:
used as one it refused below capacity). The queue counts only when it was there at two readings in a row (a
one-reading queue is requests that arrived between two engine steps and start at the next). A queue that the
free KV holds waits for prefill steps, not for finishes: behind a burst at half load the finish rate is the
arrival rate, not the engine's capacity, and taking that queue as blocked behind finishes predicted seconds of
wait for requests that started at the next steps. Such a queue is a reason to refuse only while it grows at
every one of the last GROWTH_READINGS readings (the engine is not keeping up though KV is free: prefill-bound
overload), and then by the queue time the engine itself measured. The drain rate is the finishes measured over
the shortest recent span with MIN_FINISHES of them, or, when higher, Little's law on the batch the KV holds (the
larger of the running batch and the mean-sized requests the whole KV takes, over the mean service time): it is
used only when the KV is full, and then the running batch is what the KV holds, however few requests ran at the
last reading (`drain_rate`). The prefill and queue times are the engine's TTFT less its queue time and its queue
time, per request, over RATE_WINDOW_S. Until they are learned, a request is refused only by an engine that
reports a backlog beyond its free KV; otherwise it is admitted, as an unreadable engine is admitted to: a full
KV alone is no evidence, since a burst can fill it before 8 requests have finished, and the engine may serve
that burst in time.

Decode overload: the engine's mean inter-token latency over the window above the TPOT objective, with more
requests running than the largest batch the engine was recently seen serving within it, and no more above that
batch's ITL than the batch grew (a step costs at most in proportion to its batch), is the running requests
missing it for the load; a new request would make it worse. So is a batch with the new request for which the
line through the recent (batch, ITL) pairs predicts an ITL over the objective, bounded the same way (the
largest batch served within it, grown in proportion, over it too). An ITL that grew faster than the batch is the
machine (a CPU-starved engine is slow at one request more than it served in time). An engine too slow for the
objective even with one request, or slow at a batch it served in time before, misses it for another reason,
and refusing would help nobody.

Priority: a class named sheddable is refused at `shed_margin` x the objective (and, if its own objectives are
looser or absent, of the tightest configured class's), so it goes before interactive requests are touched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmslo import conventions as C

RATE_WINDOW_S = 3.0  # the window of the ITL and prefill means: a dozen polls
# The finish rate is taken over the shortest recent span with at least MIN_FINISHES finishes (a rate from one
# or two finishes is noise), at most FINISH_WINDOW_S; a younger history with fewer finishes has not learned it.
MIN_FINISHES = 8
FINISH_WINDOW_S = 30.0
DECODE_MEMORY_S = 60.0  # how long a (batch size, ITL) pair the engine was seen at counts (decode_overloaded)
MIN_FIT_POINTS = 8  # (batch, ITL) pairs before a line through them predicts the ITL of a larger batch
MIN_BATCH_SPREAD = 0.5  # the batch sizes' standard deviation below which they say nothing of the slope
GROWTH_READINGS = 3  # a queue the free KV holds is an overload when it rose at each of this many readings
DEFAULT_SHED_MARGIN = 0.5  # sheddable classes are refused at half the wait (or TPOT) an interactive one is

# What the refused client reads (the OpenAI error object's message), per reason.
REFUSAL_TEXT = {
    C.REFUSED_ADMISSION_TTFT: "it would not start this request within its time-to-first-token objective",
    C.REFUSED_ADMISSION_TPOT: "its running requests miss the time-per-output-token objective",
    C.REFUSED_ADMISSION_SHED: "this request's class is shed first while the engine is near its limit",
    C.REFUSED_ADMISSION_KV: "too few free KV-cache seats",
    C.REFUSED_ADMISSION_QUEUE: "too many requests queued at the engine",
    C.REFUSED_ADMISSION_EARLY: "this client was refused and came back before the time it was given",
}


@dataclass(frozen=True)
class Counters:
    """Cumulative engine counters and the running gauge from one page (sums over its series)."""

    finished: float = 0.0  # requests finished (the request-size histogram's count)
    ttft_sum: float = 0.0
    ttft_count: float = 0.0
    queue_sum: float = 0.0
    queue_count: float = 0.0
    itl_sum: float = 0.0
    itl_count: float = 0.0
    e2e_sum: float = 0.0
    e2e_count: float = 0.0
    running: float = 0.0


@dataclass(frozen=True)
class Rates:
    """What the engine did over the recent window (None: not measured)."""

    finish_rate: float | None = None  # requests finished per second (None: none ever finished, not learned yet)
    prefill_s: float | None = None  # mean engine TTFT less queue time of the requests that started
    itl_s: float | None = None  # mean inter-token latency of the tokens generated
    running: float = 0.0  # requests running at the last reading
    # (running, windowed mean ITL) at recent readings with requests running: the batch sizes the engine served
    # at each speed, over the last DECODE_MEMORY_S
    served: tuple[tuple[float, float], ...] = ()
    service_s: float | None = None  # mean engine latency less queue time of the requests that finished
    queue_s: float | None = None  # mean engine queue time of the requests that started
    kv_batch: float = 0.0  # mean-sized requests the whole KV holds: the batch a KV-bound engine runs (0: unknown)


def finish_rate(history: Sequence[tuple[float, float]], now: float, finished: float) -> float | None:
    """Requests finished per second from (time, cumulative finished) readings, oldest first, and the newest;
    None while there is too little to learn from (see MIN_FINISHES). A counter that went back (an engine
    restart) ends the span there."""
    if not math.isfinite(finished) or finished <= 0:
        return None
    for then, count in reversed(history):
        done = finished - count
        if not math.isfinite(done) or done < 0:
            return None
        if done >= MIN_FINISHES or now - then >= FINISH_WINDOW_S:
            return done / (now - then) if now > then else None
    return None


def rates_between(old: Counters, new: Counters) -> Rates:
    """The prefill and ITL means between two readings (the finish rate is `finish_rate`'s); a counter that went
    back (an engine restart) or a non-finite difference measures nothing."""

    def diff(a: float, b: float) -> float | None:
        d = b - a
        return d if math.isfinite(d) and d >= 0 else None

    ttft_n, queue_n = diff(old.ttft_count, new.ttft_count), diff(old.queue_count, new.queue_count)
    ttft_s, queue_s = diff(old.ttft_sum, new.ttft_sum), diff(old.queue_sum, new.queue_sum)
    prefill = None
    queue_mean = queue_s / queue_n if queue_n and queue_s is not None else None
    if ttft_n and ttft_s is not None:
        queued = queue_mean or 0.0
        prefill = max(0.0, ttft_s / ttft_n - queued)
    itl_n, itl_s = diff(old.itl_count, new.itl_count), diff(old.itl_sum, new.itl_sum)
    itl = itl_s / itl_n if itl_n and itl_s is not None else None
    e2e_n, e2e_s = diff(old.e2e_count, new.e2e_count), diff(old.e2e_sum, new.e2e_sum)
    service = None
    if e2e_n and e2e_s is not None:
        service = max(0.0, e2e_s / e2e_n - (queue_mean or 0.0)) or None
    return Rates(None, prefill, itl, new.running if math.isfinite(new.running) else 0.0, service_s=service,
                 queue_s=queue_mean)


def drain_rate(measured: float | None, r: Rates) -> float | None:
    """The rate blocked requests start at: the finishes measured, or, when higher, what the batch the KV holds
    finishes at by Little's law (batch / mean service time); None while neither is known. Requests are blocked
    only while the KV is full, and then the running batch is what the KV holds, however few ran at the last
    reading: at low load the finishes measured are the arrival rate, and the running batch the few requests in
    flight, so either alone has a burst's request wait seconds behind requests that finish in a fraction of one."""
    batch = max(r.running, r.kv_batch)
    little = batch / r.service_s if r.service_s and batch >= 1 else None
    known = [x for x in (measured, little) if x is not None]
    return max(known) if known else None


@dataclass(frozen=True)
class Outlook:
    """What the gate knows when a request arrives."""

    seats: float  # requests whose prompt (the median, in whole blocks) the free KV took at the last reading
    waiting: float  # the engine's queue, as persisted over the last two readings
    admitted_since: int  # requests admitted that the engine's page does not show yet (all taps')
    rates: Rates
    growing: bool = False  # the engine's queue rose at each of the last GROWTH_READINGS readings
    # p99-sized requests the KV holds over their whole lives (exporter.tap.seats): the admitted the engine does not
    # show yet are each taken to be that large, and those beyond must wait for a finish
    lifetime_seats: float = math.inf


def queue_growing(waiting: Sequence[float]) -> bool:
    """The queue at the last GROWTH_READINGS readings (oldest first) rose at each: a queue the engine is not
    keeping up with (a burst's queue shrinks after it arrives)."""
    last = list(waiting[-GROWTH_READINGS:])
    return len(last) == GROWTH_READINGS and last[-1] >= 1 and all(b > a for a, b in zip(last, last[1:], strict=False))


def blocked(o: Outlook) -> float:
    """How many requests (this one included) must wait for a running one to finish before this one starts:
    those of the persistent queue and the admitted beyond what the free KV starts, or, of the admitted the engine
    does not show yet, those beyond the seats that hold for their lives (a burst that fills the free KV with
    prompts has no room left to grow into: it is preempted and waits). This errs low on purpose: the seats
    already commit the tap's requests in flight at the reading at their expected size; counted again at p99 they
    keep a margin for the reading's lag and for a burst's drain, which is slower than the steady rate learned
    (a 60-request burst: 19 admitted, all in time, where counting them once admitted 22, 3 late)."""
    return max(0.0, o.waiting + o.admitted_since + 1 - o.seats, o.admitted_since + 1 - o.lifetime_seats)


def predicted_wait(o: Outlook) -> float:
    """Seconds until the engine starts a request arriving now: 0 when it starts at once (see the module)."""
    b = blocked(o)
    if b <= 0:
        # the free KV holds the queue: it waits for prefill steps; only a queue that keeps growing is a wait,
        # the one the engine measures
        return (o.rates.queue_s or 0.0) + (o.rates.prefill_s or 0.0) if o.growing else 0.0
    rate = o.rates.finish_rate
    if rate is None:
        # nothing learned yet (a fresh engine): a full KV alone is no evidence (its running requests may finish
        # at the next step); only a backlog the engine reports beyond it is
        return math.inf if o.waiting >= 1 else 0.0
    if rate <= 0:
        return math.inf  # blocked, and no request has finished lately to free a seat
    return (o.rates.prefill_s or 0.0) + b / rate


@dataclass(frozen=True)
class Policy:
    """A request's objectives and priority at the gate."""

    ttft: float | None  # its class's TTFT objective (seconds; None: none)
    tpot: float | None
    sheddable: bool = False
    tightest_ttft: float | None = None  # the tightest objectives of any configured class
    tightest_tpot: float | None = None
    shed_margin: float = DEFAULT_SHED_MARGIN


def _budget(own: float | None, tightest: float | None, p: Policy) -> float | None:
    if not p.sheddable:
        return own
    limits = [x for x in (own, tightest) if x is not None]
    return p.shed_margin * min(limits) if limits else None


def itl_at(served: Sequence[tuple[float, float]], batch: float) -> float | None:
    """The ITL the engine would run `batch` requests at: the least-squares line through the recent (batch, ITL)
    pairs; None with fewer than MIN_FIT_POINTS, batch sizes that hardly varied, or no slope upwards."""
    n = len(served)
    if n < MIN_FIT_POINTS:
        return None
    mx, my = sum(b for b, _ in served) / n, sum(i for _, i in served) / n
    sxx = sum((b - mx) ** 2 for b, _ in served)
    if sxx < n * MIN_BATCH_SPREAD ** 2:
        return None
    slope = sum((b - mx) * (i - my) for b, i in served) / sxx
    return my + slope * (batch - mx) if slope > 0 else None


def decode_overloaded(r: Rates, itl: float | None, tpot: float, extra: float = 1) -> bool:
    """The running requests miss `tpot` because of the load, or would with `extra` more: the ITL the recent
    (batch, ITL) pairs predict for running + extra is over it, and so is the largest batch served within it
    grown in proportion (long outputs stay for many seconds, so a batch grown past it is not undone by refusing
    later), or the mean ITL is over it with more requests running than the largest batch the engine was
    recently seen serving within it. An engine never within it (even at one request) misses it by its speed,
    and one slow at a batch it served in time is slow for another reason (a noisy neighbour, a long prefill):
    refusing would help nobody."""
    within = [(running, seen) for running, seen in r.served if seen <= tpot]
    if r.running < 1 or not within:
        return False
    batch, seen = max(within)  # the largest batch served in time, and its ITL
    alone = itl_at(r.served, 1)
    if alone is not None and alone <= tpot:
        n = r.running + extra
        predicted = itl_at(r.served, n)
        # the line is bounded as the measured ITL is below: from the largest batch served in time, a step grows
        # at most with its batch (a slope steeper than that is the machine's noise, not the load's)
        if predicted is not None and min(predicted, seen * max(1.0, n / batch)) > tpot:
            return True
    if itl is None or itl <= tpot:
        return False
    # a decode step costs at most in proportion to its batch: an ITL beyond that growth from the largest batch
    # served in time is not the load (a CPU-starved or noisy machine slows every batch: refusing helps nobody)
    return r.running > batch and itl <= seen * r.running / batch


def _why(p: Policy, value: float, own: float | None, tightest: float | None, reason: str) -> str:
    """A sheddable request refused where an interactive one held to the same objective would not be: shed."""
    full = own if own is not None else tightest
    return C.REFUSED_ADMISSION_SHED if p.sheddable and (full is None or value <= full) else reason


def refusal(o: Outlook, p: Policy) -> str:
    """"" to admit, or the reason (a conventions.REFUSED_ADMISSION_* value) the request is refused."""
    tpot = _budget(p.tpot, p.tightest_tpot, p)
    itl = o.rates.itl_s
    if tpot is not None and decode_overloaded(o.rates, itl, tpot, o.admitted_since + 1):
        seen = max(itl or 0.0, itl_at(o.rates.served, o.rates.running + o.admitted_since + 1) or 0.0)
        return _why(p, seen, p.tpot, p.tightest_tpot, C.REFUSED_ADMISSION_TPOT)
    ttft = _budget(p.ttft, p.tightest_ttft, p)
    if ttft is not None:
        wait = predicted_wait(o)
        if wait > ttft:
            return _why(p, wait, p.ttft, p.tightest_ttft, C.REFUSED_ADMISSION_TTFT)
    return ""


def seconds_to_seat(o: Outlook, p: Policy) -> float:
    """When a request refused now is expected to be admitted (its Retry-After): the predicted wait's excess over
    its TTFT budget (the wait falls by a second a second as the engine drains what is ahead), or, in decode
    overload, the finishes that bring the batch back to the largest served within the TPOT objective, at the
    drain rate; inf when nothing drains. `o` counts the refused clients ahead of this one as admitted."""
    seconds = 0.0
    tpot = _budget(p.tpot, p.tightest_tpot, p)
    if tpot is not None and decode_overloaded(o.rates, o.rates.itl_s, tpot, o.admitted_since + 1):
        batch = max((n for n, itl in o.rates.served if itl <= tpot), default=0.0)
        rate = o.rates.finish_rate
        excess = o.rates.running + o.admitted_since + 1 - batch
        seconds = excess / rate if rate else math.inf
    ttft = _budget(p.ttft, p.tightest_ttft, p)
    if ttft is not None:
        seconds = max(seconds, predicted_wait(o) - ttft)
    return seconds
