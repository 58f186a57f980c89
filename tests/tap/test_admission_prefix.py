"""Prefix caching at the admission gate (issue 25): a prompt that starts with a cached system prompt takes free KV
only for the rest, so a prefix-heavy load below capacity is not refused; the share comes from the engine's
prefix-cache counters and is capped, so a page that claims everything is cached cannot make a request free."""

from __future__ import annotations

import math

from exporter.tap.admission import Admission
from exporter.tap.gate_reading import Reading
from exporter.tap.gate_state import MAX_CACHED_SHARE, cached_share
from exporter.tap.predict import Counters
from simulator.config import EngineConfig
from simulator.workload import LengthDist, WorkloadSpec, generate
from tests.tap.gate_harness import SLO, run_gated

# 3,000-token prompts, 90% of each one system prompt, ~100-token answers, on 600 KV blocks of 16 tokens (one
# whole prompt is a third of the cache, its uncached part a thirtieth) at half speed: capacity about 6 req/s
PROMPT, OUTPUT = LengthDist(3000, 0.1, 2400, 3600), LengthDist(100, 0.3, 8, 300)
SLOWDOWN = 2.0


def _config() -> EngineConfig:
    return EngineConfig(served_model_name="m", num_gpu_blocks_override=600, seed=0)


def _items(rate: float, duration: float = 60.0) -> list:
    spec = WorkloadSpec(rate=rate, duration=duration, prompt_len=PROMPT, output_len=OUTPUT, seed=3,
                        shared_prefix=0.9, num_prefixes=1)
    return generate(spec, _config().model_len)


def test_a_prefix_heavy_load_below_capacity_is_not_refused() -> None:
    """At 5 req/s every request is good without the gate (6 req/s is about the edge); the gate that charged every
    request its whole prompt saw about one free seat where the engine starts a dozen, and refused 6.8%."""
    plain = run_gated(_config(), _items(5.0), gate=False, slowdown=SLOWDOWN)
    gated = run_gated(_config(), _items(5.0), slowdown=SLOWDOWN)
    assert plain.good == plain.offered, "the load is below capacity"
    assert gated.refused <= 0.01 * gated.offered, (gated.refused, gated.offered)
    assert gated.gates[0].learned.cached_share > 0.85, gated.gates[0].learned.cached_share
    assert gated.good >= 0.97 * plain.good, (gated.good, plain.good)


def test_above_capacity_the_gate_still_helps_on_a_prefix_heavy_load() -> None:
    """At 7 req/s a third of the requests are good without the gate; with it most are."""
    plain = run_gated(_config(), _items(7.0), gate=False, slowdown=SLOWDOWN)
    gated = run_gated(_config(), _items(7.0), slowdown=SLOWDOWN)
    assert plain.good < 0.5 * plain.offered
    assert gated.refused > 0 and gated.good > 2 * plain.good, (gated.good, plain.good)


def test_the_cached_share_is_the_windowed_hit_ratio_capped() -> None:
    assert cached_share([(0, 0, 0)], 0.3) == 0.3  # one reading: nothing measured, the last share stays
    assert cached_share([(0, 100, 1000), (1, 700, 2000)], 0.0) == 0.6
    assert cached_share([(0, 100, 1000), (1, 100, 1000)], 0.4) == 0.4  # no prompt looked up meanwhile
    # a page that claims every token (or more than every token) was cached still charges a tenth of each prompt
    assert cached_share([(0, 0, 0), (1, 5000, 5000)], 0.0) == MAX_CACHED_SHARE
    assert cached_share([(0, 0, 0), (1, 9000, 5000)], 0.0) == MAX_CACHED_SHARE
    assert cached_share([(0, 0, 0), (1, math.inf, 5000)], 0.2) == 0.2


def _reading(free: float, hits: float, queries: float) -> Reading:
    prompt = ((1000.0, 0.0), (2000.0, 50.0), (math.inf, 50.0))  # 50 finished requests of 1,000 to 2,000 prompt tokens
    return Reading(free, 0.0, prompt, ((100.0, 50.0), (math.inf, 50.0)), 16.0, "", Counters(50), hits, queries)


def test_a_lying_page_cannot_make_a_request_free() -> None:
    now = [0.0]
    gate = Admission("http://127.0.0.1:1", clock=lambda: now[0], slo=SLO)
    gate.update(_reading(16_000, 0, 0))
    honest = gate.learned.start_seats  # no hits yet: whole median prompts
    now[0] = 1.0
    gate.update(_reading(16_000, 10**9, 10**9))  # "every token ever looked up was cached"
    assert gate.learned.cached_share == MAX_CACHED_SHARE
    assert honest < gate.learned.start_seats <= honest / (1 - MAX_CACHED_SHARE) + 1
    assert math.isfinite(gate.learned.seats)
    # the footprint gauge shows a seat as the seats count it: the prompt's cached share off, in whole blocks
    shown = {line.split()[0]: float(line.split()[1]) for line in gate.render().decode().splitlines()
             if line and not line.startswith("#") and "{" not in line}
    seat = shown["llm_tap_admission_footprint_tokens"]
    assert seat % 16 == 0 and seat < gate.learned.footprint, (seat, gate.learned.footprint)
    # a counter that went back (an engine restart) starts the ratio anew; the last share stays until measured
    now[0] = 2.0
    gate.update(_reading(16_000, 10, 100))
    assert gate.learned.cached_share == MAX_CACHED_SHARE
    now[0] = 3.0
    gate.update(_reading(16_000, 60, 200))
    assert gate.learned.cached_share == 0.5
