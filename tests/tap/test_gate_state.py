"""The admission gate's sans-IO state (exporter.tap.gate_state), without a socket, a task or a clock: readings are
fed with their times and decisions asked for. Fails open on readings it cannot believe, sheds the sheddable class
first, and keeps the admitted requests the engine does not show yet as reservations."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from exporter.promtext import parse_page
from exporter.tap.admission import Admission
from exporter.tap.classes import Objective, SloClass, SloConfig
from exporter.tap.exposition import render_families
from exporter.tap.gate_reading import Reading
from exporter.tap.gate_state import GateRequest, GateSettings, GateState
from exporter.tap.predict import Counters
from llmslo import conventions as C

SLO = SloConfig((SloClass("interactive", 0.5, 0.05, ("*",)), SloClass("batch", 0.5, 0.05, ("*",))), {})
INTERACTIVE, BATCH = GateRequest(Objective("interactive", 0.5, 0.05), SLO), GateRequest(Objective("batch", 0.5, 0.05), SLO)
BLOCK = 16.0
START_SEATS = 10  # free KV for ten median (50-token, so 64-token in whole blocks) prompts


def reading(t: float, free: float = 64 * START_SEATS, waiting: float = 0.0, running: float = 4.0) -> Reading:
    """An engine finishing 4 requests a second (100-token prompts and outputs at most), 0.1 s prefill, 0.01 s ITL."""
    n = 4.0 * t
    return Reading(free, waiting, ((100.0, n), (math.inf, n)), ((100.0, n), (math.inf, n)), BLOCK,
                   counters=Counters(finished=n, ttft_sum=0.1 * n, ttft_count=n, itl_sum=0.1 * n, itl_count=10 * n,
                                     e2e_sum=0.5 * n, e2e_count=n, running=running))


def learned(settings: GateSettings | None = None, until: int = 5) -> GateState:
    """A gate that read the engine once a second from 0 to `until` s."""
    state = GateState(settings or GateSettings(), SLO)
    for t in range(until + 1):
        assert state.update(reading(float(t)), float(t)) == ""
    return state


def full(state: GateState, t: float) -> None:
    """Two readings (a queue is believed once it persisted over two) of an engine with no free KV and a backlog."""
    for at in (t, t + 0.25):
        assert state.update(reading(at, free=0.0, waiting=30.0, running=12.0), at) == ""


def admitted_in_a_row(state: GateState, request: GateRequest, now: float) -> tuple[int, str]:
    """How many requests arriving at `now` are admitted before the first refusal, and its reason."""
    for n in range(100):
        verdict = state.decide(request, now)
        if verdict.refusal:
            return n, verdict.refusal
    raise AssertionError("never refused")


def test_before_any_reading_the_gate_admits() -> None:
    state = GateState(GateSettings(), SLO)
    assert not state.readable(0.0)
    assert all(not state.decide(INTERACTIVE, 0.0).refusal for _ in range(50))
    assert state.health.refusals == 0 and state.reserved.count(0.0) == 50


def test_a_full_engine_refuses_with_the_longest_retry_after_and_counts_it() -> None:
    state = learned()
    full(state, 6.0)
    verdict = state.decide(INTERACTIVE, 6.0)
    assert verdict.refusal == C.REFUSED_ADMISSION_TTFT and verdict.ticket == 0
    assert 1 <= verdict.retry_after_s <= state.settings.max_retry_after_s
    assert state.health.refusals == 1 and not state.is_open(6.0)


@pytest.mark.parametrize(("bad", "reason"), [
    ({"free_tokens": math.nan}, C.ADMISSION_READ_NON_FINITE),
    ({"waiting": math.inf}, C.ADMISSION_READ_NON_FINITE),
    ({"waiting": -1.0}, C.ADMISSION_READ_OUT_OF_RANGE),
    ({"block_size": 0.0}, C.ADMISSION_READ_OUT_OF_RANGE),
    ({"total_tokens": -5.0}, C.ADMISSION_READ_OUT_OF_RANGE),
])
def test_a_reading_it_cannot_believe_opens_the_gate_at_once(bad: dict[str, float], reason: str) -> None:
    state = learned()
    full(state, 6.0)
    assert not state.is_open(6.0), "a believed full engine closes the gate"
    lie = Reading(**{**reading(7.0).__dict__, **bad})
    assert state.update(lie, 7.0) == reason
    assert state.health.read_errors[reason] == 1 and state.health.last_error
    assert not state.readable(7.0) and not state.decide(INTERACTIVE, 7.0).refusal
    assert state.learned.reading is not None and state.learned.reading.free_tokens == 0.0, "the lie is not kept"
    assert state.update(reading(8.0), 8.0) == "" and state.readable(8.0) and not state.health.last_error


def test_an_unreachable_engine_keeps_the_last_reading_until_it_is_stale() -> None:
    state = learned()
    full(state, 6.0)
    assert state.unreadable(C.ADMISSION_READ_UNREACHABLE, "refused", forget=False)
    assert not state.unreadable(C.ADMISSION_READ_UNREACHABLE, "refused", forget=False), "logged once"
    last = state.learned.read_at
    assert last is not None
    assert state.decide(INTERACTIVE, last + state.settings.stale_s).refusal, "still fresh: still believed"
    assert not state.decide(INTERACTIVE, last + state.settings.stale_s + 0.01).refusal, "stale: fails open"
    assert state.health.read_errors[C.ADMISSION_READ_UNREACHABLE] == 2


def test_the_sheddable_class_is_refused_first_at_its_margin() -> None:
    settings = GateSettings(sheddable=frozenset({"batch"}), shed_margin=0.5)
    interactive, why_interactive = admitted_in_a_row(learned(settings), INTERACTIVE, 5.0)
    batch, why_batch = admitted_in_a_row(learned(settings), BATCH, 5.0)
    assert why_batch == C.REFUSED_ADMISSION_SHED and why_interactive == C.REFUSED_ADMISSION_TTFT
    assert 0 < batch < interactive, (batch, interactive)
    # without the priority the batch class has the same objectives, and is admitted as far
    same, _ = admitted_in_a_row(learned(GateSettings()), BATCH, 5.0)
    assert same == interactive


def test_admitted_requests_hold_seats_until_the_engine_shows_them() -> None:
    state = learned()
    n, _ = admitted_in_a_row(state, INTERACTIVE, 5.0)
    assert n > 0 and state.admitted_since(5.5) == n
    # a reading asked for after the admissions that shows as many more requests at the engine retires them
    state.update(reading(6.0, running=4.0 + n), 6.0, asked_at=5.5)
    assert state.admitted_since(6.0) == 0
    assert not state.decide(INTERACTIVE, 6.0).refusal


def test_a_request_that_ends_at_the_tap_gives_its_seat_back() -> None:
    state = learned()
    tickets = []
    while not (verdict := state.decide(INTERACTIVE, 5.0)).refusal:
        tickets.append(verdict.ticket)
    assert state.decide(INTERACTIVE, 5.0).refusal
    state.settle(tickets[0])
    state.settle(tickets[0])  # settling twice gives back one seat
    assert state.admitted_since(5.0) == len(tickets) - 1
    assert not state.decide(INTERACTIVE, 5.0).refusal


def test_taps_count_each_admission_for_every_worker() -> None:
    alone, _ = admitted_in_a_row(learned(GateSettings(taps=1)), INTERACTIVE, 5.0)
    shared, _ = admitted_in_a_row(learned(GateSettings(taps=2)), INTERACTIVE, 5.0)
    assert 0 < shared < alone


def test_the_state_has_no_io_of_its_own() -> None:
    """No sockets, tasks, clock or page reader: every time comes in as an argument."""
    source = Path(__file__).resolve().parents[2] / "exporter" / "tap" / "gate_state.py"
    imported = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert imported.isdisjoint({"asyncio", "socket", "time", "ssl", "aiohttp", "exporter.tap.page_reader",
                                "exporter.tap.gate_poller", "exporter.logs"}), imported


# -- the gauges, through the tap's one exposition writer ---------------------------------------------
def test_the_gauges_of_a_gate_that_never_read_the_engine() -> None:
    gate = Admission("http://127.0.0.1:9", clock=lambda: 0.0)
    page = gate.render().decode()
    lines = [line for line in page.splitlines() if not line.startswith("#")]
    expected = [
        f"{C.TAP_ADMISSION_OPEN.name} 1", f"{C.TAP_ADMISSION_ENGINE_READABLE.name} 0",
        f"{C.TAP_ADMISSION_SEATS.name} NaN", f"{C.TAP_ADMISSION_FOOTPRINT.name} 4096",
        f"{C.TAP_ADMISSION_QUEUE.name} NaN", f"{C.TAP_ADMISSION_PREDICTED_WAIT.name} NaN",
        f"{C.TAP_ADMISSION_ENGINE_ITL.name} NaN",
        *(f'{C.TAP_ADMISSION_READ_ERRORS.name}{{reason="{r}"}} 0' for r in C.ADMISSION_READ_REASONS),
    ]
    assert lines == expected
    for d in C.TAP_ADMISSION_METRICS:
        assert f"# HELP {d.name} {d.help}\n# TYPE {d.name} {d.kind}\n" in page


def test_the_gauges_show_what_the_state_learned() -> None:
    now = [5.0]
    gate = Admission("http://127.0.0.1:9", clock=lambda: now[0], slo=SLO)
    for t in range(6):
        now[0] = float(t)
        gate.update(reading(float(t), waiting=2.0 if t == 5 else 0.0))
    gate.state.health.read_errors[C.ADMISSION_READ_INCONSISTENT] += 3
    families = parse_page(gate.render().decode()).families
    value = {d.name: families[d.name].samples[0].value for d in C.TAP_ADMISSION_METRICS[:-1]}
    k = gate.learned
    assert value[C.TAP_ADMISSION_SEATS.name] == pytest.approx(k.seats) and math.isfinite(k.seats)
    assert value[C.TAP_ADMISSION_QUEUE.name] == 2.0 and value[C.TAP_ADMISSION_ENGINE_READABLE.name] == 1
    assert value[C.TAP_ADMISSION_ENGINE_ITL.name] == pytest.approx(0.01)
    assert value[C.TAP_ADMISSION_FOOTPRINT.name] == k.seat_tokens == 208  # 198 tokens in whole blocks of 16
    errors = {s.labels["reason"]: s.value for s in families[C.TAP_ADMISSION_READ_ERRORS.name.removesuffix("_total")].samples}
    assert errors[C.ADMISSION_READ_INCONSISTENT] == 3 and set(errors) == set(C.ADMISSION_READ_REASONS)


def test_render_families_escapes_labels_and_writes_counts_and_floats_apart() -> None:
    d = C.TAP_ADMISSION_READ_ERRORS
    page = render_families([(d, [((("reason", 'a"b\\c\nd'),), 7), ((), 0.5), ((), math.inf)])]).decode()
    assert page.splitlines()[2:] == [f'{d.name}{{reason="a\\"b\\\\c\\nd"}} 7', f"{d.name} 0.5", f"{d.name} +Inf"]
