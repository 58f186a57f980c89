"""Issue 34, bursts: a reading taken mid-burst must not forget the requests the gate admitted that the engine does
not show yet (exporter.tap.reservations). The attack: 60 requests over 0.5 s with 9.5 seats showing, 29 admitted
and 19 of them late."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from bench import bench_tap_admission as rt
from exporter.tap.admission import Admission
from exporter.tap.reservations import Reservations
from simulator.config import EngineConfig
from simulator.workload import WorkItem, generate
from tests.tap.gate_harness import TPOT, TTFT, run_gated
from tests.tap.test_admission import _chat, _post, reading

BURST, BURST_S, BURST_AT = 60, 0.5, 20.51  # the burst starts between two readings (every 0.25 s from 0)


def _burst_items() -> list[WorkItem]:
    """20 s of 2 req/s (the gate learns the engine), then the burst: the bench's request sizes."""
    warm = generate(rt._spec(2.0, 20.0))
    burst = generate(replace(rt._spec(240.0, 1.0), seed=7))[:BURST]
    return [*warm, *(replace(b, arrival=BURST_AT + i * BURST_S / BURST) for i, b in enumerate(burst))]


def test_a_burst_read_mid_way_is_admitted_only_as_far_as_it_starts_in_time() -> None:
    """In virtual time on the bench's engine (600 KV blocks), the gate reading it every 0.25 s: once before the
    burst and once a third of the way in. Without the gate 19 of the 60 are good; the old gate admitted 43,
    24 of them past the TTFT objective (its count reset by the mid-burst reading)."""
    config = EngineConfig(served_model_name=rt.MODEL, num_gpu_blocks_override=rt.KV_BLOCKS)
    trace: list[tuple[float, str, float, int]] = []  # (the reading's time, the decision, seats shown, unseen)

    def watch(gate: Admission, why: str) -> None:
        if gate.clock() >= BURST_AT and gate.learned.read_at is not None:
            trace.append((gate.learned.read_at, why, gate.learned.seats, gate.state.admitted_since(gate.clock())))

    items = _burst_items()
    gated = run_gated(config, items, slowdown=rt.SLOWDOWN, watch=watch)
    plain = run_gated(config, items, gate=False, slowdown=rt.SLOWDOWN)
    admitted = [r for r in gated.records if r.start >= BURST_AT]
    late = [r for r in admitted if r.ttft is None or r.ttft > TTFT]
    possible = sum(r.good(TTFT, TPOT) for r in plain.records if r.start >= BURST_AT)
    assert possible == 19 and not late, [round(r.ttft or -1, 2) for r in late]
    assert len(admitted) == possible, "every request that could start in time did"
    # before the mid-burst reading: no more than the seats shown when the burst began
    before = [t for t in trace if t[0] == trace[0][0]]
    assert sum(1 for t in before if not t[1]) <= before[0][2]
    # the reading mid-way retired only what the engine showed: the rest are still counted
    after = next(t for t in trace if t[0] > trace[0][0])
    assert after[3] > 0


def test_a_reservation_ends_when_the_engine_shows_it_the_tap_ends_it_or_it_ages_out() -> None:
    r = Reservations(lifetime_s=3.0)
    r.seen(10, 0.0, 0.0)  # the first reading sets the mark
    _, b, _ = r.add(1.0), r.add(1.1), r.add(1.2)
    r.seen(10, 1.05, 1.3)  # the engine shows nothing new
    assert r.count(1.3) == 3
    r.seen(13, 1.05, 1.4)  # 3 new, but the page was asked for at 1.05: only the first can be in it
    assert r.count(1.4) == 2
    r.settle(b)  # ended at the tap: no seat, but it stays to absorb the engine's count of it
    assert r.count(1.4) == 1 and len(r) == 2
    r.seen(14, 1.5, 1.5)  # one more: `b` (settled) absorbs it, the third still holds
    assert r.count(1.5) == 1
    assert r.count(4.21) == 0 and len(r) == 0, "a request lost on the way holds its seat for lifetime_s at most"
    r.seen(2, 5.0, 5.0, restarted=True)  # the engine restarted: the count starts anew
    r.add(5.1)
    r.seen(3, 5.2, 5.2)
    assert r.count(5.2) == 0


def test_with_several_taps_each_takes_its_share_of_the_engines_new_requests() -> None:
    r = Reservations(lifetime_s=3.0)
    r.seen(0, 0.0, 0.0)
    for _ in range(4):
        r.add(0.1)
    r.seen(4, 0.2, 0.2, taps=2)  # 4 new at the engine from two taps: 2 of them this one's
    assert r.count(0.2) == 2
    r.seen(5, 0.3, 0.3, taps=2)  # half a request more: nothing retired yet
    assert r.count(0.3) == 2
    r.seen(6, 0.4, 0.4, taps=2)
    assert r.count(0.4) == 1


def test_the_engines_new_requests_beyond_the_taps_do_not_retire_later_admissions() -> None:
    """Another client's requests seen before this tap admitted anything are not credited to its next ones."""
    r = Reservations(lifetime_s=3.0)
    r.seen(0, 0.0, 0.0)
    r.seen(8, 0.25, 0.25)  # 8 requests from elsewhere
    r.add(0.3)
    r.seen(8, 0.5, 0.5)
    assert r.count(0.5) == 1


def test_the_tap_settles_its_reservation_when_the_request_ends(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            gate = Admission(st.upstream_url)
            st.server.proxy.admission = gate
            gate.update(reading(0.0))
            status, _, _ = await _post(st.tap_url + "/v1/chat/completions", _chat())
            assert status == 200
            assert gate.state.admitted_since(gate.clock()) == 0 and len(gate.state.reserved) == 1, "settled, kept to absorb the engine's count"

    asyncio.run(go())
