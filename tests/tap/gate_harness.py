"""The tap's admission gate in front of the simulator's engine, in virtual time (no sockets, deterministic).

The gate reads the engine's own vLLM page (simulator.metrics.VllmMetrics, parsed and read as the tap's poller
does) every `poll_s` virtual seconds, learns exact sizes from the finished requests, sees the engine's running
requests as its in-flight ones, and decides for each arrival; admitted requests go to the engine. `gates` gates
stand for the workers of `--workers N` (each with its own share of the arrivals, round robin, and its own
readings); the engine is shared.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from exporter.promtext import parse_page
from exporter.tap.admission import AUTO, Admission, read_engine, wanted
from exporter.tap.classes import Objective, SloClass, SloConfig
from exporter.tap.seats import InFlight
from simulator.clock import VirtualClock
from simulator.config import EngineConfig
from simulator.engine import EngineCore
from simulator.faults import FaultState
from simulator.metrics import VllmMetrics
from simulator.request import Request
from simulator.stats import RequestRecord
from simulator.virtual import RunRecorder
from simulator.workload import WorkItem

TTFT, TPOT = 0.5, 0.05
SLO = SloConfig((SloClass("interactive", TTFT, TPOT, ("*",)),), {})
CHAT = Objective("interactive", TTFT, TPOT)


@dataclass
class GateRun:
    offered: int
    refused: int
    records: list[RequestRecord]  # the admitted requests, as the engine served them
    preemptions: int
    gates: list[Admission]

    @property
    def good(self) -> int:
        return sum(r.good(TTFT, TPOT) for r in self.records)


class _Finished:
    """Each finished request's exact sizes go to the gate that admitted it (the tap learns them from usage)."""

    def __init__(self, owner: dict[str, Admission]) -> None:
        self.owner = owner

    def on_step(self, core: EngineCore, stats: object) -> None:
        pass

    def on_finished(self, req: Request) -> None:
        gate = self.owner.pop(req.request_id, None)
        if gate is not None:
            gate.sizes.add(req.num_prompt_tokens, req.num_output_tokens)


def run_gated(config: EngineConfig, items: list[WorkItem], *, gate: bool = True, gates: int = 1, poll_s: float = 0.25,
              slowdown: float = 1.0, watch: Callable[[Admission, str], None] | None = None,
              **admission: object) -> GateRun:
    """Serve `items` (their arrival times) with the gate in front (gate=False: everything admitted); `watch` sees
    each decision (the gate that made it, "" or the refusal)."""
    clock = VirtualClock()
    core = EngineCore(config, clock, None, FaultState(slowdown=slowdown))
    metrics = VllmMetrics(core)
    recorder = RunRecorder()
    core.observers.append(recorder)
    n = gates
    gates_ = [Admission("http://127.0.0.1:1", clock=clock.now, slo=SLO, **admission) for _ in range(n)]  # type: ignore[arg-type]
    owner: dict[str, Admission] = {}
    mine: dict[int, set[str]] = {id(g): set() for g in gates_}
    core.observers.append(_Finished(owner))
    for g in gates_:
        ids = mine[id(g)]
        g.in_flight = lambda ids=ids: [InFlight(r.num_output_tokens, r.max_tokens)
                                       for rid, r in core._live.items() if rid in ids]
    refused, nxt, next_poll = 0, 0, 0.0
    while nxt < len(items) or core.has_work():
        now = clock.now()
        if gate and now >= next_poll:
            page = parse_page(metrics.render().decode(), wanted(AUTO), checked=True)
            reading = read_engine(page.families)
            for g in gates_:
                g.update(reading)
            next_poll = now + poll_s
        while nxt < len(items) and items[nxt].arrival <= now:
            item, g = items[nxt], gates_[nxt % n]
            why = g.decide(CHAT, SLO) if gate else ""
            if watch is not None:
                watch(g, why)
            if why:
                refused += 1
            else:
                req = core.new_request(list(item.prompt_token_ids), item.output_len, output_len=item.output_len)
                req.arrival_time = item.arrival
                core.add_request(req)
                owner[req.request_id] = g
                mine[id(g)].add(req.request_id)
            nxt += 1
        planned = core.begin_step()
        wake = [x for x in (core.next_wakeup(), items[nxt].arrival if nxt < len(items) else None,
                            next_poll if gate and (nxt < len(items) or core.has_work()) else None) if x is not None]
        if planned is None:
            if not wake:
                break
            clock.set(max(now, min(wake)))
            continue
        clock.advance(planned.duration)
        core.finish_step(planned)
    return GateRun(len(items), refused, recorder.records, core.scheduler.num_preemptions, gates_)
