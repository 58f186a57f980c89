"""The tap's admission gate in front of the simulator's engine, in virtual time (no sockets, deterministic).

The gate reads the engine's own vLLM page (simulator.metrics.VllmMetrics, parsed and read as the tap's poller
does) every `poll_s` virtual seconds, learns exact sizes from the finished requests, sees the engine's running
requests as its in-flight ones, and decides for each arrival; admitted requests go to the engine. `gates` gates
stand for the workers of `--workers N` (each with its own share of the arrivals, round robin, and its own
readings); the engine is shared. `run_clients` serves closed-loop clients instead (each keeps its requests going
and retries a refusal as it is told, or faster), each known to the gate by its name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from exporter.promtext import parse_page
from exporter.tap.admission import Admission
from exporter.tap.classes import Objective, SloClass, SloConfig
from exporter.tap.gate_reading import AUTO, read_engine, wanted
from exporter.tap.seats import InFlight
from llmslo import conventions as C
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


@dataclass(frozen=True)
class Client:
    """A closed-loop client: `streams` requests kept going (each sends its next when the last ends); a refused
    one tries again after `retry_s`, or after the Retry-After it was given when `retry_s` is None."""

    name: str
    streams: int
    prompt: int
    output: int
    retry_s: float | None = None


@dataclass
class Tally:
    """One client's run: its decisions, and per request admitted the refusals it took and the seconds it waited."""

    admitted: int = 0
    refused: int = 0
    early: int = 0  # refused as admission_retry_early
    refusals: list[int] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    retry_after: list[int] = field(default_factory=list)  # every Retry-After it was given


@dataclass
class _Stream:
    client: Client
    next_try: float
    first_try: float
    refused: int = 0


def run_clients(config: EngineConfig, clients: list[Client], seconds: float, *, poll_s: float = 0.25,
                slowdown: float = 1.0) -> dict[str, Tally]:
    """Serve the clients' closed loops for `seconds` of virtual time behind one gate (the client's name is its
    key, as exporter.tap.turns.ClientKeys would give); a refused request waits as its client does."""
    clock = VirtualClock()
    core = EngineCore(config, clock, None, FaultState(slowdown=slowdown))
    metrics, gate = VllmMetrics(core), Admission("http://127.0.0.1:1", clock=clock.now, slo=SLO)
    tallies = {c.name: Tally() for c in clients}
    streams = [_Stream(c, 0.01 * i, 0.01 * i) for i, c in enumerate(clients) for _ in range(c.streams)]
    serving: dict[str, _Stream] = {}
    core.observers.append(_Ended(gate, serving, clock))
    gate.in_flight = lambda: [InFlight(r.num_output_tokens, r.max_tokens) for r in core._live.values()]
    next_poll, seq = 0.0, 0
    while clock.now() < seconds:
        now = clock.now()
        if now >= next_poll:
            gate.update(read_engine(parse_page(metrics.render().decode(), wanted(AUTO), checked=True).families))
            next_poll = now + poll_s
        for s in sorted((s for s in streams if s.next_try <= now), key=lambda s: s.next_try):
            seq += 1
            _try(gate, core, s, tallies[s.client.name], serving, seq)
        planned = core.begin_step()
        if planned is None:
            wake = [x for x in (core.next_wakeup(), next_poll, *(s.next_try for s in streams)) if x is not None]
            clock.set(max(now, min(wake)))
            continue
        clock.advance(planned.duration)
        core.finish_step(planned)
    return tallies


def _try(gate: Admission, core: EngineCore, s: _Stream, tally: Tally, serving: dict[str, _Stream], seq: int) -> None:
    """One try of a stream's request: admitted to the engine, or refused and due again as its client retries."""
    now = core.clock.now()
    verdict = gate.decide_ticket(CHAT, SLO, s.client.name)
    if verdict.refusal:
        tally.refused += 1
        tally.early += verdict.refusal == C.REFUSED_ADMISSION_EARLY
        tally.retry_after.append(verdict.retry_after_s)
        s.refused += 1
        s.next_try = now + (s.client.retry_s if s.client.retry_s is not None else verdict.retry_after_s)
        return
    tally.admitted += 1
    tally.refusals.append(s.refused)
    tally.waits.append(now - s.first_try)
    prompt = [(seq * 7919 + i) % 32000 for i in range(s.client.prompt)]  # no prefix shared between requests
    req = core.new_request(prompt, s.client.output, output_len=s.client.output)
    core.add_request(req)
    serving[req.request_id] = s
    s.next_try = math.inf


class _Ended:
    """A finished request's stream sends its next request at once; the gate learns its exact sizes."""

    def __init__(self, gate: Admission, serving: dict[str, _Stream], clock: VirtualClock) -> None:
        self.gate, self.serving, self.clock = gate, serving, clock

    def on_step(self, core: EngineCore, stats: object) -> None:
        pass

    def on_finished(self, req: Request) -> None:
        self.gate.sizes.add(req.num_prompt_tokens, req.num_output_tokens)
        s = self.serving.pop(req.request_id, None)
        if s is not None:
            s.next_try = s.first_try = self.clock.now()
            s.refused = 0
