"""The admission gate's decisions against the simulator engine in virtual time (bench.bench_tap_admission_virtual):
the real Admission object, no CPU contention, the same figures on every machine."""

from __future__ import annotations

from bench import bench_tap_admission as rt
from bench.bench_tap_admission_virtual import serve
from simulator.workload import generate

DECODE_CAPACITY = 4.5  # bench_tap_admission's capacity search for its decode workload (virtual time)


def _decode(rate: float, seconds: float = rt.ARRIVALS_S) -> tuple:
    return tuple(generate(rt._spec(rate, seconds, rt.DECODE_PROMPT, rt.DECODE_OUTPUT)))


def test_decode_overload_the_gate_keeps_goodput_far_above_no_gate() -> None:
    """Long outputs at 2x capacity (the bench's row, whose target is 3x no gate): without the gate the batch
    outgrows the KV, the engine preempts and its queue's TTFT misses take nearly everything after the first
    seconds; the gate refuses once the engine reports a backlog beyond its KV and keeps the admitted in time."""
    items = _decode(2 * DECODE_CAPACITY)
    ours, peer = serve(items, True), serve(items, False)
    assert ours.refused > 0 and set(ours.reasons) <= {"admission_ttft", "admission_tpot"}
    assert ours.good >= 3 * peer.good, (ours, peer)
    # 155 of 168 admitted are good (the rest were admitted before the first backlog was reported)
    assert ours.good >= 0.85 * (ours.offered - ours.refused), "nearly every admitted request is good"


def test_decode_below_capacity_the_gate_refuses_nothing() -> None:
    items = _decode(0.9 * DECODE_CAPACITY)
    ours, peer = serve(items, True), serve(items, False)
    assert ours.refused == 0 and ours.good == peer.good == len(items)
