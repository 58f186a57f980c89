"""The tap's admission gate in virtual time: its decisions alone, free of the machine's load.

bench_tap_admission runs the gate in real time, where the simulator, the taps and the clients share the CPUs:
on a loaded machine every streamed token costs CPU, so the engine's inter-token latency grows with the number
of streams and both stacks miss their objectives for reasons no admission decision controls (a decode-overload
run read 0.86x to 1.93x between runs, and 0.33 good req/s with the gate against 0 without at a load average
of 10). Here the same gate object (exporter.tap.admission.Admission, its real `update` and `decide`) reads the
simulator engine's state every POLL_S of virtual time: free KV tokens, the queue, the request-size histograms
and the counters its rates are learned from (built from the engine's requests as vLLM's /metrics would count
them), its in-flight requests and their exact sizes as the tap sees them; a refused request never reaches the
engine. The same cases, arrivals and objectives as bench_tap_admission; nothing sleeps, so a row's figures are
the same on every run and every machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench import bench_tap_admission as rt
from bench.report import Row
from exporter.tap import seats
from exporter.tap.admission import Admission
from exporter.tap.classes import Objective, SloClass, SloConfig
from exporter.tap.gate_reading import Reading
from exporter.tap.predict import Counters
from llmslo.histograms import Buckets
from simulator.clock import VirtualClock
from simulator.config import EngineConfig
from simulator.engine import EngineCore
from simulator.faults import FaultState
from simulator.request import Request
from simulator.workload import WorkItem

SECTION = "Goodput tap: admission by objective, the gate's decisions in virtual time (simulator engine)"
POLL_S = 0.25  # the gate's default poll interval
EDGES = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, math.inf)  # vLLM's 1-2-5 size buckets
SLO = SloConfig((SloClass("interactive", rt.TTFT_SLO, rt.TPOT_SLO, ("*",)),), {})
CHAT = Objective("interactive", rt.TTFT_SLO, rt.TPOT_SLO)

NOTES = {
    SECTION: (
        f"The gate of `llmslo-exporter tap --admission` (its own `update` and `decide`, at its defaults) against "
        f"the simulator engine (`{rt.PRESET}`, --num-gpu-blocks {rt.KV_BLOCKS}, --slowdown {rt.SLOWDOWN:g}) in "
        f"virtual time, reading the engine every {POLL_S:g} s; the cases, arrivals and objectives of the real-time "
        "section above, without its CPU contention (on a loaded 2-core machine the real-time engine's inter-token "
        "latency grows with the number of streams, and both stacks miss their objectives for that). Peer: the same "
        "requests with no gate. Deterministic: the same figures on every run."
    ),
}


def _sizes(values: Sequence[int]) -> Buckets:
    return tuple((le, float(sum(1 for v in values if v <= le))) for le in EDGES)


def _reading(core: EngineCore, requests: Sequence[Request], prefix: tuple[int, int]) -> Reading:
    """What the engine's /metrics would say now (summed as the gate's adapter reads it); `prefix`: the prompt
    tokens found in the prefix cache and looked up in it so far."""
    finished = [r for r in requests if r.finish_reason]
    started = [r for r in requests if r.first_token_time > 0]
    counters = Counters(
        finished=len(finished), ttft_sum=sum(r.first_token_time - r.arrival_time for r in started),
        ttft_count=len(started), queue_sum=sum(r.scheduled_time - r.arrival_time for r in started),
        queue_count=len(started), itl_sum=sum(r.last_token_time - r.first_token_time for r in started),
        itl_count=sum(max(0, r.num_output_tokens - 1) for r in started),
        e2e_sum=sum(r.finished_time - r.arrival_time for r in finished), e2e_count=len(finished),
        running=len(core.scheduler.running))
    kv = core.scheduler.kv
    return Reading(float(kv.num_free_blocks * kv.block_size), float(len(core.scheduler.waiting)),
                   _sizes([r.num_prompt_tokens for r in finished]), _sizes([r.num_output_tokens for r in finished]),
                   float(kv.block_size), "", counters, float(prefix[0]), float(prefix[1]),
                   float(kv.num_blocks * kv.block_size))


def serve(items: Sequence[WorkItem], gated: bool, oracle: float | None = None) -> rt.Outcome:
    """The items through the gate (or none) into the engine, in virtual time, to the last finish. `oracle`: no
    gate but a hindsight one that knows every request's output length and admits while the tokens the requests
    in the engine will hold at their end (prompt + output, this one's included) stay within `oracle` x the KV."""
    clock = VirtualClock()
    core = EngineCore(EngineConfig(served_model_name=rt.MODEL, num_gpu_blocks_override=rt.KV_BLOCKS), clock, None,
                      FaultState(slowdown=rt.SLOWDOWN))
    gate = Admission("http://engine.invalid", clock=clock.now, slo=SLO)
    requests: list[Request] = []
    sized: set[int] = set()
    gate.in_flight = lambda: [seats.InFlight(r.num_output_tokens, r.max_tokens) for r in requests if not r.finish_reason]
    pending = sorted(items, key=lambda i: i.arrival)
    nxt, next_poll, reasons = 0, 0.0, dict[str, float]()
    hits = queries = 0
    kv_tokens = core.scheduler.kv.num_blocks * core.scheduler.kv.block_size
    while True:
        if clock.now() >= next_poll:
            for r in requests:
                if r.finish_reason and id(r) not in sized:  # the tap's exact sizes, as it sees each request end
                    sized.add(id(r))
                    gate.sizes.add(r.num_prompt_tokens, r.num_output_tokens)
            gate.update(_reading(core, requests, (hits, queries)))
            next_poll = clock.now() + POLL_S
        while nxt < len(pending) and pending[nxt].arrival <= clock.now():
            item = pending[nxt]
            nxt += 1
            if oracle is not None:
                why = "" if _committed(core) + len(item.prompt_token_ids) + item.output_len <= oracle * kv_tokens \
                    else "oracle"
            else:
                why = gate.decide(CHAT, SLO) if gated else ""
            if why:
                reasons[why] = reasons.get(why, 0.0) + 1
                continue
            req = core.new_request(list(item.prompt_token_ids), item.output_len, output_len=item.output_len)
            req.arrival_time = item.arrival
            core.add_request(req)
            requests.append(req)
        planned = core.begin_step()
        if planned is None:
            wake = [t for t in (core.next_wakeup(), pending[nxt].arrival if nxt < len(pending) else None) if t is not None]
            if not wake:
                break
            clock.set(max(clock.now(), min(min(wake), next_poll)))
            continue
        clock.advance(planned.duration)
        stats = core.finish_step(planned)
        hits, queries = hits + stats.prefix_hits, queries + stats.prefix_queries
    good = sum(1 for r in requests if r.finish_reason and _good(r))
    return rt.Outcome(len(items), good, int(sum(reasons.values())), reasons)


def _committed(core: EngineCore) -> int:
    """The tokens the requests in the engine will hold at their end (the oracle knows where each stops)."""
    engine = (*core.scheduler.running, *core.scheduler.waiting)
    return sum(r.num_prompt_tokens + min(r.max_tokens, r.output_len) for r in engine)


ORACLE_FACTORS = tuple(round(1 + 0.1 * i, 1) for i in range(21))  # 1x (no overbooking) to 3x the KV


def oracle_best(items: Sequence[WorkItem]) -> tuple[rt.Outcome, float]:
    """The hindsight oracle (`serve`) at its best overbooking factor for these very items: a ceiling no gate
    that reads /metrics reaches (it neither knows output lengths nor picks its factor after the fact)."""
    return max(((serve(items, False, f), f) for f in ORACLE_FACTORS), key=lambda x: x[0].good)


def _good(r: Request) -> bool:
    if r.first_token_time - r.arrival_time > rt.TTFT_SLO:
        return False
    n = r.num_output_tokens
    return n < 2 or (r.finished_time - r.first_token_time) / (n - 1) <= rt.TPOT_SLO


def run(only: tuple[str, ...] = ()) -> list[Row]:
    todo, _ = rt.cases(only)
    cmd = f"python -m bench tap-admission-virtual (simulator {rt.PRESET} in virtual time, the tap's Admission)"
    rows = []
    for case in todo:
        ours, peer = serve(case.items, True), serve(case.items, False)
        what = f"{case.what}, {ours.offered} requests"
        if case.target == "overload":
            best, factor = oracle_best(case.items)
            what += (f" (ceiling: a hindsight oracle that knows each output length, at its best overbooking of "
                     f"{factor:g}x the KV, {best.good / case.duration:.2f} req/s, "
                     f"{best.good / peer.good if peer.good else math.inf:.2f}x no gate)")
        rows.append(rt.goodput_row(SECTION, what, case, ours, peer, case.duration, cmd, peer_refused=False))
    return rows
