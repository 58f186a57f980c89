"""Seats against ground truth on the simulator's paged KV cache (virtual time, fixed seeds).

The engine serves a Poisson load at 30%, 60% and 85% of its capacity (27 req/s for this config: there its cache
stays full and it preempts; at 26 req/s it fills in bursts). At four sample times the seat estimate is taken from what a tap
would see (the engine's free blocks, each in-flight request's output so far and max_tokens, and the exact
sizes of the requests that finished), and the truth is measured on copies of the engine's state: the largest k
such that k more p99-sized requests, added now with nothing else arriving, are all admitted at once and cause
no preemption before every request has finished.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import pytest

from exporter.tap.gate_state import MAX_CACHED_SHARE
from exporter.tap.seats import InFlight, Sizes, SizeWindow, estimate
from simulator.clock import VirtualClock
from simulator.config import EngineConfig
from simulator.engine import EngineCore
from simulator.request import Request, Status
from simulator.workload import LengthDist, WorkloadSpec, generate


@dataclass(frozen=True)
class Workload:
    prompt: LengthDist
    output: LengthDist
    cap: int  # every request's max_tokens; its natural output ends it earlier
    capacity_rps: float  # the rate at which the cache stays full and the engine preempts
    shared: float = 0.0  # the share of every prompt that is one common system prompt (a prefix-cache hit)


# chat: 500-token prompts, 150-token answers; decode-heavy: 200-token prompts, 600-token answers, so running
# requests' remaining growth is most of what the cache will hold (free tokens alone read up to 1.6x the truth)
CHAT = Workload(LengthDist(500, 0.5, 16, 4000), LengthDist(150, 0.6, 2, 1000), 1000, 27.0)
DECODE_HEAVY = Workload(LengthDist(200, 0.5, 16, 2000), LengthDist(600, 0.6, 2, 2000), 2000, 11.5)
# prefix-heavy: 2,000-token prompts, 80% of each one common system prompt; a new request takes blocks only for
# the rest (free tokens over whole prompts read about a third of the truth)
PREFIX_HEAVY = Workload(LengthDist(2000, 0.3, 200, 4000), LengthDist(150, 0.6, 2, 1000), 1000, 21.0, shared=0.8)
SAMPLES = (60.0, 75.0, 90.0, 105.0)  # virtual seconds; a minute of warm-up first
NEW_IDS = 10**9  # token ids of the added requests: no prefix-cache hit on anything the workload sent


def _config() -> EngineConfig:
    # a small cache (4,499 usable blocks of 16 tokens) so KV binds; batch and token budget large so they do not
    return EngineConfig(num_gpu_blocks_override=4500, max_num_seqs=1024, max_num_batched_tokens=262144, seed=0)


class _Sizes:
    """The exact sizes a tap learns from usage, and the engine's prefix-cache counters (as the gate reads them)."""

    def __init__(self) -> None:
        self.window = SizeWindow()
        self.hits = self.queries = 0

    def on_step(self, core, stats) -> None:
        self.hits += stats.prefix_hits
        self.queries += stats.prefix_queries

    def cached_share(self) -> float:
        return min(MAX_CACHED_SHARE, self.hits / self.queries) if self.queries else 0.0

    def on_finished(self, req: Request) -> None:
        self.window.add(req.num_prompt_tokens, req.num_output_tokens)


def _step(core: EngineCore, until: float | None = None) -> bool:
    """Run one engine step (or move the clock to the next wake-up, at most `until`); False when idle for good."""
    planned = core.begin_step()
    if planned is None:
        wake = core.next_wakeup()
        if wake is None and until is None:
            return False
        core.clock.set(max(core.clock.now(), min(x for x in (wake, until) if x is not None)))
        return True
    core.clock.advance(planned.duration)
    core.finish_step(planned)
    return True


def _fits(core: EngineCore, k: int, prompt: int, output: int, head: tuple[int, ...] = ()) -> bool:
    """On a copy: k requests of (prompt, output) added now are admitted at once and nothing is preempted
    before all requests finish. `head`: the common system prompt the workload's prompts start with."""
    c = copy.deepcopy(core)
    added = []
    for i in range(k):
        ids = list(head) + list(range(NEW_IDS + i * 100_000, NEW_IDS + i * 100_000 + prompt - len(head)))
        req = c.new_request(ids, output, output_len=output)
        c.add_request(req)
        added.append(req)
    before = c.scheduler.num_preemptions
    while any(r.status is Status.PENDING for r in added):
        _step(c)
    if any(r.status is Status.WAITING for r in added):  # not admitted on their first step: no room
        return False
    while c.scheduler.num_preemptions == before and _step(c):
        pass
    return c.scheduler.num_preemptions == before


def _truth(core: EngineCore, prompt: int, output: int, guess: float, head: tuple[int, ...] = ()) -> int:
    if not _fits(core, 0, prompt, output, head):
        return 0
    lo, hi = 0, max(4, 2 * math.ceil(guess) + 2)
    while _fits(core, hi, prompt, output, head):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _fits(core, mid, prompt, output, head) else (lo, mid)
    return lo


def _run(work: Workload, load: float, samples: tuple[float, ...] = SAMPLES, fallback: float = 0.0
         ) -> list[tuple[float, float, int, float]]:
    """(virtual time, estimate, truth, KV usage) at each sample time. `fallback`: before enough requests have
    finished, the footprint the gate falls back on (else a sample then is an error)."""
    config = _config()
    core = EngineCore(config, VirtualClock())
    sizes = _Sizes()
    core.observers.append(sizes)
    spec = WorkloadSpec(rate=load * work.capacity_rps, duration=samples[-1] + 1, seed=1,
                        prompt_len=work.prompt, output_len=work.output, shared_prefix=work.shared,
                        num_prefixes=1 if work.shared else WorkloadSpec.num_prefixes)
    arrivals = generate(spec, config.model_len)
    nxt, rows = 0, []
    # the true p99 request, split as the workload splits its tokens on average
    totals = sorted(len(item.prompt_token_ids) + item.output_len for item in arrivals)
    p99 = totals[math.ceil(0.99 * len(totals)) - 1]
    prompt = round(p99 * sum(len(item.prompt_token_ids) for item in arrivals) / sum(totals))
    # the added requests start with the system prompt, as long as the workload's share of theirs
    longest = max(arrivals, key=lambda item: len(item.prompt_token_ids)).prompt_token_ids
    head = tuple(list(longest)[:round(work.shared * prompt)]) if work.shared else ()
    for at in samples:
        while core.clock.now() < at:
            while nxt < len(arrivals) and arrivals[nxt].arrival <= core.clock.now():
                item = arrivals[nxt]
                req = core.new_request(item.prompt_token_ids, work.cap, output_len=item.output_len)
                req.arrival_time = item.arrival
                core.add_request(req)
                nxt += 1
            _step(core, min(at, arrivals[nxt].arrival) if nxt < len(arrivals) else at)
        learned = sizes.window.sizes() or (Sizes.fallback(fallback) if fallback else None)
        assert learned is not None
        in_flight = [InFlight(r.num_output_tokens, r.max_tokens) for r in core._live.values()]
        seat = estimate(core.kv.num_free_blocks * core.kv.block_size, core.kv.block_size, in_flight, learned,
                        cached_share=sizes.cached_share())
        rows.append((at, seat.seats, _truth(core, prompt, p99 - prompt, seat.seats, head), core.kv.usage))
    return rows


@pytest.mark.parametrize("work", [CHAT, DECODE_HEAVY, PREFIX_HEAVY], ids=["chat", "decode-heavy", "prefix-heavy"])
@pytest.mark.parametrize("load", [0.3, 0.6, 0.85])
def test_seats_hold_against_the_engine(work: Workload, load: float) -> None:
    rows = _run(work, load)
    ratios = [est / truth for _, est, truth, _ in rows]
    shown = ", ".join(f"t={t:g}s usage={u:.2f} est={e:.1f} truth={n}" for t, e, n, u in rows)
    assert all(truth >= 1 for _, _, truth, _ in rows), shown  # below capacity there is room
    assert all(0.8 <= r <= 1.2 for r in ratios), shown


def test_seats_at_start_up_read_low_not_high() -> None:
    """Before MIN_SAMPLES requests have finished (here: the first half second at 85% load), the gate counts
    seats in the fallback footprint and commits every in-flight request's whole cap: under the truth, never
    over it, and not above the steady state's seats."""
    start = _run(CHAT, 0.85, samples=(0.25, 0.5), fallback=4096)
    steady = _run(CHAT, 0.85)
    shown = f"start-up {start}, steady {steady}"
    assert all(est <= truth for _, est, truth, _ in start), shown
    assert max(est for _, est, _, _ in start) <= min(est for _, est, _, _ in steady) * 1.2, shown
