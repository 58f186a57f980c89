"""Several taps gating one engine (`--workers N`, `--admission-taps`), in virtual time: each gate sees only its
own admissions and in-flight requests, so it counts them for all N; two gates then admit a burst as one does."""

from __future__ import annotations

from dataclasses import replace

from exporter.tap.seats import InFlight, Sizes, estimate
from simulator.config import EngineConfig
from simulator.workload import LengthDist, WorkloadSpec, generate
from tests.tap.gate_harness import run_gated

PROMPT, OUTPUT = LengthDist(400, 0.0, 400, 400), LengthDist(100, 0.0, 100, 100)
BURST, BURST_AT = 64, 10.1  # between two readings (every 0.25 s)


def _config() -> EngineConfig:
    return EngineConfig(served_model_name="m", num_gpu_blocks_override=600, seed=0)


def _items() -> list:
    """10 s at 2 req/s (a quarter of capacity), then a burst of 64 at once."""
    steady = generate(WorkloadSpec(rate=2.0, duration=10.0, prompt_len=PROMPT, output_len=OUTPUT, seed=5), 8192)
    more = generate(WorkloadSpec(rate=100.0, duration=10.0, prompt_len=PROMPT, output_len=OUTPUT, seed=6), 8192)
    return steady + [replace(i, arrival=BURST_AT) for i in more[:BURST]]


def _burst_admitted(**kw: object) -> int:
    steady = run_gated(_config(), _items()[:-BURST], slowdown=2.0, **kw)  # type: ignore[arg-type]
    assert steady.refused == 0, "below capacity nothing is refused"
    return BURST - run_gated(_config(), _items(), slowdown=2.0, **kw).refused  # type: ignore[arg-type]


def test_two_gates_admit_a_burst_as_one_gate_does() -> None:
    one = _burst_admitted()
    two = _burst_admitted(gates=2, taps=2)
    assert 12 <= one <= 34, one  # the engine starts 23 such prompts at once (599 blocks / 25)
    assert two <= one + 2, (one, two)  # before: each took the free KV as its own, 2 x one


def test_each_gates_seats_count_its_in_flight_requests_for_every_tap() -> None:
    sizes = Sizes.from_samples([(400, 100)] * 40)
    mine = [InFlight(20, 100)] * 5
    alone = estimate(20_000, 16, mine * 2, sizes)
    assert estimate(20_000, 16, mine, sizes, taps=2) == alone
    assert estimate(20_000, 16, mine, sizes).seats > alone.seats
