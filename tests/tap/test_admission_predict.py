"""The admission decision by objective (exporter.tap.predict, issue 25): the predicted wait, the finish rate it
is learned from, priority shedding and the decode-overload reason; then the gate that keeps the state, and a
refusal's reason on the wire."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from dataclasses import replace

import aiohttp
import pytest

from exporter.tap.admission import Admission
from exporter.tap.classes import Objective, SloClass, SloConfig
from exporter.tap.gate_reading import Reading
from exporter.tap.gate_state import MIN_DECODE_STEP_S
from exporter.tap.predict import (
    FINISH_WINDOW_S,
    MIN_FINISHES,
    REFUSAL_TEXT,
    Counters,
    Outlook,
    Policy,
    Rates,
    blocked,
    decode_overloaded,
    drain_rate,
    finish_rate,
    itl_at,
    predicted_wait,
    queue_growing,
    rates_between,
    refusal,
)
from exporter.tap.seats import InFlight, decode_growth
from llmslo import conventions as C
from tests.tap.test_admission import _chat, _post

TTFT, TPOT = 0.5, 0.05
INTERACTIVE = Policy(TTFT, TPOT, tightest_ttft=TTFT, tightest_tpot=TPOT)
BATCH = Policy(None, None, sheddable=True, tightest_ttft=TTFT, tightest_tpot=TPOT)  # no objectives of its own
# the engine was seen serving a batch of 6 at 0.02 s a token
LEARNED = Rates(finish_rate=4.0, prefill_s=0.1, itl_s=0.02, running=8, served=((6, 0.02),))


def outlook(seats: float = 10, waiting: float = 0, admitted: int = 0, rates: Rates = LEARNED) -> Outlook:
    return Outlook(seats, waiting, admitted, rates)


# -- the predicted wait ------------------------------------------------------------------------------
def test_a_request_the_engine_starts_at_once_waits_nothing_whatever_its_prefill() -> None:
    slow_prefill = replace(LEARNED, prefill_s=3.0)  # the engine's prefill alone misses the objective
    o = outlook(seats=10, admitted=9, rates=slow_prefill)  # the tenth fits
    assert blocked(o) == 0 and predicted_wait(o) == 0.0
    assert refusal(o, INTERACTIVE) == "", "refusing a request nothing is ahead of helps nobody"


def test_beyond_the_free_seats_a_request_waits_for_finishes() -> None:
    o = outlook(seats=2.5, admitted=3)  # 4 requests for 2.5 seats: 1.5 must wait for a finish
    assert blocked(o) == pytest.approx(1.5)
    assert predicted_wait(o) == pytest.approx(0.1 + 1.5 / 4.0)
    assert refusal(o, INTERACTIVE) == ""  # 0.475 s <= 0.5 s
    assert refusal(outlook(seats=2.5, admitted=4), INTERACTIVE) == C.REFUSED_ADMISSION_TTFT  # 0.725 s


def test_a_queue_beyond_the_free_kv_puts_everything_admitted_since_behind_it() -> None:
    o = outlook(seats=2, waiting=3, admitted=1)  # the KV starts 2 of the 5: 3 wait for finishes
    assert blocked(o) == 3 and predicted_wait(o) == pytest.approx(0.1 + 3 / 4.0)
    assert refusal(o, INTERACTIVE) == C.REFUSED_ADMISSION_TTFT


def test_a_queue_the_free_kv_holds_waits_for_prefill_not_for_finishes() -> None:
    """Behind a burst at half load the finish rate is the arrival rate (1.75 a second in the bench), not what
    the engine can start: taking the burst's queue as blocked behind finishes predicted 3 / 1.75 s and refused
    16 % of a 0.5x-capacity bursty stream the engine served in time."""
    half_load = replace(LEARNED, finish_rate=1.75, queue_s=0.05)
    o = outlook(seats=20, waiting=2, admitted=0, rates=half_load)
    assert blocked(o) == 0 and predicted_wait(o) == 0.0
    assert refusal(o, INTERACTIVE) == ""


def test_a_queue_that_keeps_growing_though_the_kv_is_free_is_refused_by_its_measured_queue_time() -> None:
    """A prefill-bound overload: free KV, but the engine does not keep up with its queue."""
    behind = replace(LEARNED, queue_s=0.6)
    assert refusal(replace(outlook(seats=20, waiting=6, rates=behind), growing=True), INTERACTIVE) \
        == C.REFUSED_ADMISSION_TTFT
    assert predicted_wait(replace(outlook(seats=20, waiting=6, rates=behind), growing=True)) == pytest.approx(0.7)
    keeping_up = replace(LEARNED, queue_s=0.1)
    assert refusal(replace(outlook(seats=20, waiting=6, rates=keeping_up), growing=True), INTERACTIVE) == ""


def test_a_queue_grows_only_when_it_rose_at_each_of_the_last_readings() -> None:
    assert queue_growing([0, 2, 5, 9]) and queue_growing([1, 2, 3])
    assert not queue_growing([0, 4, 2]), "a burst's queue shrinks after it arrives"
    assert not queue_growing([0, 0, 4]) and not queue_growing([3, 5]) and not queue_growing([0.1, 0.2, 0.5])


def test_nothing_learned_admits_unless_nothing_can_start_and_nothing_finishing_is_an_unbounded_wait() -> None:
    fresh = Rates()  # an engine that has not finished enough requests to learn from yet
    assert predicted_wait(outlook(seats=3, admitted=5, rates=fresh)) == 0.0, "no rate: no prediction past the seats"
    assert predicted_wait(outlook(seats=0.5, waiting=1, rates=fresh)) == math.inf, "a full engine's backlog"
    assert predicted_wait(outlook(seats=2, waiting=2, rates=fresh)) == math.inf, "nor a backlog beyond its KV"
    assert predicted_wait(outlook(seats=30, waiting=2, rates=fresh)) == 0.0, "a queue its KV holds starts"
    stuck = replace(LEARNED, finish_rate=0.0)
    assert predicted_wait(outlook(seats=0, rates=stuck)) == math.inf
    assert refusal(outlook(seats=0, rates=stuck), INTERACTIVE) == C.REFUSED_ADMISSION_TTFT


def test_a_full_kv_before_anything_is_learned_is_no_reason_to_refuse() -> None:
    """The bench's 0.5x-capacity bursty stream: the first seconds' bursts fill the KV (16 running, half a seat
    free) before 8 requests have finished; the old gate predicted an infinite wait and refused a whole burst
    that the engine served in time. Without a learned rate, only a backlog the engine reports is evidence."""
    start_up = Rates(prefill_s=0.14, itl_s=0.019, running=16)
    assert refusal(outlook(seats=0.48, rates=start_up), INTERACTIVE) == ""
    assert refusal(outlook(seats=0.48, admitted=3, rates=start_up), INTERACTIVE) == ""
    assert refusal(outlook(seats=0.48, waiting=2, rates=start_up), INTERACTIVE) == C.REFUSED_ADMISSION_TTFT


def test_a_class_without_a_ttft_objective_is_not_refused_for_its_wait() -> None:
    no_objective = Policy(None, None, tightest_ttft=TTFT, tightest_tpot=TPOT)
    assert refusal(outlook(seats=0, waiting=50), no_objective) == ""


# -- priority shedding -------------------------------------------------------------------------------
def test_sheddable_classes_are_refused_at_the_margin_interactive_ones_only_past_their_objective() -> None:
    near = outlook(seats=2.5, admitted=2)  # 0.5 blocked: 0.1 + 0.125 = 0.225 s, under 0.5 s, over 0.25 x ...
    assert predicted_wait(near) == pytest.approx(0.225)
    batch_same_objective = Policy(TTFT, TPOT, sheddable=True, tightest_ttft=TTFT, tightest_tpot=TPOT, shed_margin=0.4)
    assert refusal(near, INTERACTIVE) == ""
    assert refusal(near, batch_same_objective) == C.REFUSED_ADMISSION_SHED  # 0.225 > 0.4 x 0.5
    # a sheddable class with no objective of its own is held to the tightest class's, at the margin
    assert refusal(near, BATCH) == ""  # 0.225 <= 0.5 x 0.5
    assert refusal(outlook(seats=2.5, admitted=3), BATCH) == C.REFUSED_ADMISSION_SHED  # 0.475 > 0.25
    # past its own objective a sheddable request is refused for that, not for its priority
    assert refusal(outlook(seats=2.5, admitted=4), batch_same_objective) == C.REFUSED_ADMISSION_TTFT
    # a non-sheddable class without objectives is never shed
    assert refusal(outlook(seats=2.5, admitted=3), replace(BATCH, sheddable=False)) == ""


# -- decode overload ---------------------------------------------------------------------------------
def test_running_requests_missing_the_tpot_objective_refuse_new_work() -> None:
    slow = replace(LEARNED, itl_s=0.07, running=24)  # 0.02 s at 6 running, 0.07 s at 24: the batch grew 4x
    assert refusal(outlook(rates=slow), INTERACTIVE) == C.REFUSED_ADMISSION_TPOT
    assert refusal(outlook(rates=replace(slow, running=0)), INTERACTIVE) == "", "nothing running: no overload"
    # an engine never seen within the objective misses it by its speed, and one slow at a batch it served in
    # time is slow for another reason (a noisy neighbour): refusing would help nobody
    assert refusal(outlook(rates=replace(slow, served=((8, 0.06),))), INTERACTIVE) == ""
    assert refusal(outlook(rates=replace(slow, served=())), INTERACTIVE) == ""
    assert refusal(outlook(rates=replace(slow, served=((30, 0.02), (3, 0.01)))), INTERACTIVE) == ""
    # the sheddable class goes first: at 0.03 s the interactive one is within 0.05 s, the batch one is shed
    near = outlook(rates=replace(LEARNED, itl_s=0.03, running=12))  # 0.02 s at 6, 0.03 s at 12
    assert refusal(near, INTERACTIVE) == "" and refusal(near, BATCH) == C.REFUSED_ADMISSION_SHED
    assert refusal(near, Policy(TTFT, 0.02, tightest_ttft=TTFT, tightest_tpot=0.02)) == C.REFUSED_ADMISSION_TPOT


def test_an_itl_that_grew_faster_than_the_batch_is_the_machine_not_the_load() -> None:
    """The bench on a loaded machine, 0.5x capacity: 0.02 s a token at 4 running, then a CPU-starved 0.07 s at
    5. A step costs at most in proportion to its batch (5/4 x 0.02 = 0.025 s): the rest is the machine, and the
    old rule (over the objective at a batch larger than any served in time) refused 18 % of the stream."""
    spike = Rates(finish_rate=4.0, prefill_s=0.1, itl_s=0.07, running=5, served=((4, 0.02), (2, 0.015)))
    assert refusal(outlook(rates=spike), INTERACTIVE) == ""
    grown = replace(spike, itl_s=0.06, running=16)  # 4x the batch, 3x the ITL: the load explains it
    assert refusal(outlook(rates=grown), INTERACTIVE) == C.REFUSED_ADMISSION_TPOT


def test_a_batch_that_would_outgrow_the_objective_is_refused_before_its_itl_shows_it() -> None:
    """Long outputs stay for many seconds: a batch grown past the TPOT objective is not undone by refusing once
    the ITL shows it (the bench's decode overload: 0 good requests with a gate that only reacted). The recent
    (batch, ITL) pairs predict the ITL of the batch a new request makes."""
    served = tuple((b, 0.01 + 0.004 * b) for b in (2, 3, 4, 5, 6, 7, 8, 9))  # 0.05 s a token at 10 running
    assert itl_at(served, 10) == pytest.approx(0.05) and itl_at(served[:7], 10) is None, "too few pairs"
    assert itl_at(tuple((4, 0.02 + i / 1000) for i in range(8)), 10) is None, "one batch size: no slope"
    r = Rates(finish_rate=4.0, itl_s=0.04, running=9, served=served)
    assert refusal(outlook(rates=r), INTERACTIVE) == ""  # 10 running: 0.05 s, within
    assert refusal(outlook(rates=r, admitted=1), INTERACTIVE) == C.REFUSED_ADMISSION_TPOT  # 11: 0.054 s
    assert decode_overloaded(r, 0.04, 0.05, extra=1) is False and decode_overloaded(r, 0.04, 0.05, extra=3)
    slow_alone = tuple((b, 0.06 + 0.004 * b) for b in range(2, 10))  # over 0.05 s even alone: its speed
    assert not decode_overloaded(replace(r, served=slow_alone), 0.04, 0.05, extra=3)


def test_a_line_steeper_than_the_batch_explains_is_bounded_by_the_largest_batch_served_in_time() -> None:
    """CPU contention while 6-7 requests ran made those steps slow (0.048 s), and the line through the pairs
    predicts 0.058 s at 10 running; but the engine was seen serving 8 at 0.015 s, and a step costs
    at most in proportion to its batch: 10 take at most 0.019 s. Refusing would help nobody."""
    served = ((2, 0.01), (2, 0.01), (3, 0.01), (3, 0.01), (6, 0.048), (6, 0.048), (7, 0.049), (7, 0.049), (8, 0.015))
    assert (itl_at(served, 10) or 0) > 0.05, "the premise: the line alone would refuse"
    r = Rates(finish_rate=4.0, itl_s=0.015, running=8, served=served)
    assert not decode_overloaded(r, 0.015, 0.05, extra=2)
    assert refusal(outlook(rates=r, admitted=1), INTERACTIVE) == ""
    # the same pairs with the largest batch also slow: nothing bounds the line below the objective any more
    assert decode_overloaded(replace(r, served=(*served[:-1], (8, 0.045))), 0.045, 0.05, extra=2)


def test_every_reason_has_a_message_and_is_a_counted_refusal() -> None:
    assert set(REFUSAL_TEXT) == set(C.REFUSED_ADMISSION_REASONS) <= set(C.REFUSED_REASONS)


# -- what the rates are learned from -----------------------------------------------------------------
def test_the_finish_rate_needs_enough_finishes_or_a_long_enough_span() -> None:
    history = [(float(t), 10.0 + 2 * t) for t in range(10)]  # 2 finishes a second, at t = 0..9
    assert finish_rate(history, 10.0, 30.0) == pytest.approx(2.0)  # the shortest span with >= 8 finishes: 4 s
    assert MIN_FINISHES == 8
    assert finish_rate([(0.0, 0.0), (1.0, 2.0)], 2.0, 3.0) is None, "3 finishes in 2 s: not learned yet"
    assert finish_rate([(0.0, 5.0)], FINISH_WINDOW_S, 7.0) == pytest.approx(2 / FINISH_WINDOW_S), "rare finishes"
    assert finish_rate([(0.0, 5.0)], FINISH_WINDOW_S, 5.0) == 0.0, "nothing finished over the whole window"
    assert finish_rate([(0.0, 50.0)], 1.0, 3.0) is None, "the counter went back: an engine restart"
    assert finish_rate([], 1.0, 0.0) is None and finish_rate([(0.0, 1.0)], 1.0, math.nan) is None


def test_prefill_is_ttft_less_queue_time_and_itl_a_mean_over_the_deltas() -> None:
    old = Counters(ttft_sum=10.0, ttft_count=10, queue_sum=2.0, queue_count=10, itl_sum=1.0, itl_count=100,
                   e2e_sum=30.0, e2e_count=10)
    new = Counters(ttft_sum=13.0, ttft_count=20, queue_sum=3.0, queue_count=20, itl_sum=4.0, itl_count=200,
                   e2e_sum=51.0, e2e_count=20, running=7)
    r = rates_between(old, new)
    assert r.prefill_s == pytest.approx(0.3 - 0.1) and r.itl_s == pytest.approx(0.03) and r.running == 7
    assert r.service_s == pytest.approx(2.1 - 0.1)  # latency less queue time, per finished request
    went_back = rates_between(new, old)
    assert went_back.prefill_s is None and went_back.itl_s is None


def test_the_drain_rate_follows_a_grown_batch_by_littles_law() -> None:
    """14 requests running, each served in 2 s: 7 finish a second, though only 2 a second were measured (the
    batch just grew); a bench run at 0.9x capacity with bursts refused on the measured rate alone."""
    grown = Rates(running=14, service_s=2.0)
    assert drain_rate(2.0, grown) == pytest.approx(7.0)
    assert drain_rate(9.0, grown) == pytest.approx(9.0), "the higher of the two"
    assert drain_rate(None, Rates(running=0, service_s=2.0)) is None and drain_rate(None, Rates()) is None
    assert drain_rate(3.0, Rates(running=5)) == 3.0


def test_behind_a_full_kv_the_batch_it_holds_drains_not_the_few_running_at_low_load() -> None:
    """A KV of 32 blocks holds 4 mean-sized requests served in 0.2 s: a burst's request blocked behind it starts
    within a fraction of a second, though at 2 req/s only 2 finish a second and none ran at the last reading. On
    the finishes alone the gate predicted 0.5 s + prefill and refused (a real vLLM at half its capacity)."""
    low = Rates(running=0, service_s=0.2, kv_batch=4.0)
    assert drain_rate(2.0, low) == pytest.approx(20.0)
    assert drain_rate(2.0, replace(low, kv_batch=0.0)) == 2.0, "a page without the KV's size: as before"
    burst = Outlook(seats=3.0, waiting=0, admitted_since=3, rates=Rates(drain_rate(2.0, low), prefill_s=0.03))
    assert predicted_wait(burst) == pytest.approx(0.03 + 1 / 20.0)
    assert refusal(burst, Policy(ttft=0.5, tpot=None)) == ""
    assert refusal(replace(burst, rates=Rates(2.0, prefill_s=0.03)), Policy(ttft=0.5, tpot=None)) != ""


# -- the gate ----------------------------------------------------------------------------------------
SLO = SloConfig((SloClass("interactive", TTFT, TPOT, ("chat-*",)), SloClass("batch", None, None, ("batch-*",))), {})
CHAT, BULK = Objective("interactive", TTFT, TPOT), Objective("batch", None, None)
PROMPT = ((200.0, 0.0), (500.0, 100.0), (math.inf, 100.0))  # 100 finished requests of 200 to 500 prompt tokens
OUTPUT = ((100.0, 100.0), (math.inf, 100.0))


def engine(t: float, free: float, waiting: float = 0, finished: float = 0, itl: tuple[float, float] = (0, 0),
           running: float = 4) -> Reading:
    """A reading at time t: `finished` requests so far, ITL (sum, count) so far."""
    prompt = tuple((le, n * finished / 100) for le, n in PROMPT)
    return Reading(free, waiting, prompt, OUTPUT, 16.0, "",
                   Counters(finished, itl_sum=itl[0], itl_count=itl[1], running=running))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_idle_engine_admits_a_burst_of_ten_times_the_old_per_poll_cap() -> None:
    """The old gate let at most --admission-max-queue + 1 requests through per poll (5: 20 req/s at 0.25 s
    polls) however idle the engine; 200 requests of max_tokens 1 in one poll interval are all admitted now."""
    clock = Clock()
    gate = Admission("http://127.0.0.1:1", clock=clock, slo=SLO)
    for t in range(40):  # a steady, nearly idle engine: 2 finishes a second, 300,000 free tokens
        clock.now = t * 0.25
        gate.update(engine(clock.now, 300_000, finished=100 + t // 2))
    assert gate.learned.rates.finish_rate is not None
    assert all(not gate.decide(CHAT, SLO) for _ in range(200)) and gate.state.health.refusals == 0


def test_a_queue_seen_at_one_reading_only_is_not_a_backlog() -> None:
    clock = Clock()
    gate = Admission("http://127.0.0.1:1", clock=clock, slo=SLO)
    for t in range(40):
        clock.now = t * 0.25
        gate.update(engine(clock.now, 1000, finished=100 + t))  # 4 finishes a second, 2 seats of free KV
    gate.update(engine(clock.now, 1000, waiting=8, finished=140))  # arrived between two engine steps
    assert gate.learned.queue == 0 and not gate.decide(CHAT, SLO)
    clock.now += 0.25
    gate.update(engine(clock.now, 1000, waiting=8, finished=140))  # still there, beyond the KV: 7 / 4 s away
    assert gate.learned.queue == 8 and gate.decide(CHAT, SLO) == C.REFUSED_ADMISSION_TTFT


def test_a_transient_burst_at_half_load_is_admitted() -> None:
    """The bench's 0.5x-capacity bursty stream: 1.75 finishes a second, plenty of free KV, a burst of 4 queued
    at one reading and 2 at the next (the engine starting it over its prefill steps). The old gate took the 2
    plus this request as blocked behind finishes at 1.75 a second (1.7 s) and refused."""
    clock = Clock()
    gate = Admission("http://127.0.0.1:1", clock=clock, slo=SLO)
    for t in range(120):
        clock.now = t * 0.25
        gate.update(engine(clock.now, 9000, finished=100 + t * 7 // 16, running=2))
    for waiting in (4, 2):
        clock.now += 0.25
        gate.update(engine(clock.now, 9000, waiting=waiting, finished=152, running=2))
    assert gate.learned.queue == 2 and not gate.learned.growing
    assert [gate.decide(CHAT, SLO) for _ in range(4)] == [""] * 4 and gate.state.health.refusals == 0


def test_a_sustained_overload_is_still_refused() -> None:
    """A full KV and a queue that grows at every reading: the requests behind it wait for finishes."""
    clock = Clock()
    gate = Admission("http://127.0.0.1:1", clock=clock, slo=SLO)
    for t in range(40):
        clock.now = t * 0.25
        gate.update(engine(clock.now, 300_000, finished=100 + t, running=16))
    for i, waiting in enumerate((3, 6, 9, 12)):
        clock.now += 0.25
        gate.update(engine(clock.now, 0, waiting=waiting, finished=140 + i, running=16))
    assert gate.learned.growing and gate.decide(CHAT, SLO) == C.REFUSED_ADMISSION_TTFT


def test_the_gate_learns_decode_overload_from_the_engines_itl_and_sheds_batch_first() -> None:
    clock = Clock()
    gate = Admission("http://127.0.0.1:1", clock=clock, slo=SLO, sheddable=frozenset({"batch"}))
    itl_sum, itl_count = 0.0, 0.0
    # the batch grows from 4 to 6 to 10 running requests, and the engine slows from 0.02 to 0.035 to 0.08 s a token
    phases = [(4, 0.02)] * 16 + [(6, 0.035)] * 16 + [(10, 0.08)] * 16
    for t, (running, itl) in enumerate(phases):  # 0.25 s a reading, 100 tokens each
        clock.now = t * 0.25
        itl_sum, itl_count = itl_sum + 100 * itl, itl_count + 100
        gate.update(engine(clock.now, 300_000, finished=100 + t, itl=(itl_sum, itl_count), running=running))
        if t == 15:
            assert gate.learned.rates.itl_s == pytest.approx(0.02) and (4, pytest.approx(0.02)) in gate.learned.rates.served
            assert not gate.decide(CHAT, SLO) and not gate.decide(BULK, SLO)
        if t == 31:  # 0.035 s: within 0.05 s, over 0.5 x 0.05 s
            assert gate.decide(BULK, SLO) == C.REFUSED_ADMISSION_SHED and not gate.decide(CHAT, SLO)
    assert gate.learned.rates.itl_s == pytest.approx(0.08)
    assert gate.decide(CHAT, SLO) == C.REFUSED_ADMISSION_TPOT and gate.decide(BULK, SLO) == C.REFUSED_ADMISSION_TPOT
    assert max(n for n, itl in gate.learned.rates.served if itl <= TPOT) < 8, "the growing batch is not recorded as in time"
    page = gate.render().decode()
    itl_line = next(line for line in page.splitlines() if line.startswith(C.TAP_ADMISSION_ENGINE_ITL.name + " "))
    assert float(itl_line.split()[1]) == pytest.approx(0.08) and f"{C.TAP_ADMISSION_OPEN.name} 0" in page


def test_the_floors_are_overrides_off_by_default() -> None:
    """A backlog of 5 on an engine finishing 40 requests a second is under 0.15 s of wait: within the objective, so the
    gate admits; the old defaults (--admission-max-queue 4, --admission-min-seats 1) refused it, and still do
    when the operator sets them."""
    def learned(**floors: float) -> Admission:
        clock = Clock()
        gate = Admission("http://127.0.0.1:1", clock=clock, slo=SLO, **floors)  # type: ignore[arg-type]
        for t in range(12):
            clock.now = t * 0.25
            gate.update(engine(clock.now, 300.0, waiting=5, finished=100 + 10 * t))
        return gate

    gate = learned()
    assert gate.learned.queue == 5 and gate.learned.rates.finish_rate == pytest.approx(40)
    assert predicted_wait(gate.outlook()) == pytest.approx((6 - gate.learned.start_seats) / 40)  # 5 queued + 1, less the seats
    assert gate.decide(CHAT, SLO) == ""
    assert learned(max_queue=4).decide(CHAT, SLO) == C.REFUSED_ADMISSION_QUEUE
    assert learned(min_seats=1).decide(CHAT, SLO) == C.REFUSED_ADMISSION_KV


def test_a_decode_refusal_says_why_on_the_wire(stack: Callable) -> None:
    async def go() -> None:
        slo = SloConfig((SloClass("interactive", TTFT, TPOT, ("chat-*",)),), {})
        async with stack(slo=slo) as st:
            clock = Clock()
            gate = Admission(st.upstream_url, clock=clock, slo=slo)
            st.server.proxy.admission = gate
            st.server.renderer.extra = gate.render
            itl_sum = 0.0
            for t in range(40):  # 3 running requests at 0.02 s a token, then 12 at 0.09 s
                clock.now = t * 0.25
                itl_sum += 100 * (0.02 if t < 20 else 0.09)
                gate.update(engine(clock.now, 300_000, finished=100 + t, itl=(itl_sum, t * 100 + 100),
                                   running=3 if t < 20 else 12))
            status, body, headers = await _post(st.tap_url + "/v1/chat/completions", _chat())
            # a seat is expected once the batch of 12 (13 with this one) is back to the 6.75 served within the
            # TPOT objective: 6.25 finishes at 4 a second, 1.56 s, rounded up
            assert status == 429 and headers["Retry-After"] == "2"
            assert json.loads(body)["error"] == {
                "message": f"The engine is at capacity ({REFUSAL_TEXT[C.REFUSED_ADMISSION_TPOT]}); retry after 2 s.",
                "type": "rate_limit_exceeded", "param": None, "code": C.REFUSED_ADMISSION_TPOT}
            async with aiohttp.ClientSession() as s:
                async with s.get(st.metrics_url + "/metrics") as r:
                    page = await r.text()
            assert f'{C.TAP_REFUSALS.name}{{reason="{C.REFUSED_ADMISSION_TPOT}"}} 1' in page
            assert f'{C.TAP_REFUSALS.name}{{reason="{C.REFUSED_ADMISSION_TTFT}"}} 0' in page

    asyncio.run(go())


def test_a_request_starts_when_its_prompt_fits_not_only_when_a_p99_lifetime_does() -> None:
    """The engine starts a request whose prompt fits the free KV: counting each at its p99 prompt + output
    (the seats) as the start condition refused a tenth of the requests at 0.9x capacity with bursts (bench).
    Those the engine does not show yet beyond the p99 seats wait for finishes (4 a second here), as a burst that
    fills the KV with prompts has no room to grow into (issue 34)."""
    clock = Clock()
    gate = Admission("http://127.0.0.1:1", clock=clock, slo=SLO)
    free = 6 * 352.0  # six median prompts (350 tokens: 22 blocks of 16), 4.1 seats of the p99 footprint (497)
    for t in range(40):  # six finishes a second
        clock.now = t * 0.25
        gate.update(engine(clock.now, free, finished=100 + 3 * t // 2))
    assert gate.learned.rates.finish_rate == pytest.approx(6, rel=0.1)
    assert 3 < gate.learned.seats < 4 and gate.learned.start_seats == pytest.approx(6)  # p99 lifetimes: fewer than prompts that fit
    # the 6th: 2.5 beyond the p99 seats, 0.42 s of finishes; the 7th: 0.59 s
    assert [gate.decide(CHAT, SLO) for _ in range(7)] == [""] * 6 + [C.REFUSED_ADMISSION_TTFT]
    slow = Admission("http://127.0.0.1:1", clock=clock, slo=SLO)
    for t in range(40):  # one finish a second: only the p99 seats start in time
        clock.now = 20 + t * 0.25
        slow.update(engine(clock.now, free, finished=100 + t // 4))
    fit = math.ceil(slow.learned.seats - 0.5)  # a request blocked 0.5 beyond them waits 0.5 s
    assert [slow.decide(CHAT, SLO) for _ in range(fit + 1)] == [""] * fit + [C.REFUSED_ADMISSION_TTFT]


def test_the_room_the_running_requests_decode_into_before_the_next_reading_starts_no_request() -> None:
    """Decode overload in virtual time: every bad admitted request missed its TTFT because it was admitted while
    the free KV held a median prompt, the running requests' growth took that room within the poll, and vLLM
    preempted for it. 40 streams at 0.02 s a token take 12.5 tokens each in a 0.25 s poll: 500 of the 6 x 352
    free, so about 4.6 median prompts start, not 6; a stream 3 tokens from its max_tokens takes 3, and a request
    that has produced nothing (perhaps queued) no decode token."""
    assert decode_growth([InFlight(10, 500)] * 40, 12.5) == 500
    assert decode_growth([InFlight(497, 500), InFlight(0, 500), InFlight(5, None)], 12.5) == 3 + 0 + 12.5
    assert decode_growth([InFlight(10, 500)], math.inf) == 0 == decode_growth([InFlight(10, 500)], math.nan)
    clock = Clock()
    gate = Admission("http://127.0.0.1:1", clock=clock, slo=SLO)
    free = 6 * 352.0
    for t in range(40):  # 40 running, 0.02 s a token (the ITL counters: 2 s of tokens at 100 a second)
        clock.now = t * 0.25
        gate.update(engine(clock.now, free, finished=100 + t // 4, itl=(0.02 * 500 * t, 500 * t), running=40))
    assert gate.learned.rates.itl_s == pytest.approx(0.02) and gate.learned.start_seats == pytest.approx(6)  # none in flight here
    gate.in_flight = lambda: [InFlight(10, 500)] * 40
    gate.update(engine(10.0, free, finished=110, itl=(0.02 * 500 * 40, 500 * 40), running=40))
    assert gate.learned.start_seats == pytest.approx((free - 500) / 352)
    gate.in_flight = lambda: [InFlight(499, 500)] * 40  # all but done: a token each
    gate.update(engine(10.25, free, finished=110, itl=(0.02 * 500 * 41, 500 * 41), running=40))
    assert gate.learned.start_seats == pytest.approx((free - 40) / 352)
    # a page whose ITL says a nanosecond a token is read at the floor: 250 tokens a poll for an uncapped stream,
    # not the whole KV (which would close the gate on a lying page)
    gate = Admission("http://127.0.0.1:1", clock=clock, slo=SLO)
    gate.in_flight = lambda: [InFlight(10, None)] * 2
    for t in range(40):
        clock.now = 20 + t * 0.25
        gate.update(engine(clock.now, free, finished=100 + t // 4, itl=(1e-9 * 500 * t, 500 * t), running=2))
    assert gate.learned.start_seats == pytest.approx((free - 2 * 0.25 / MIN_DECODE_STEP_S) / 352)
