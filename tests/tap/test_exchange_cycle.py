"""One request's cycle (exporter.tap.exchange.Exchange) run on its collaborators alone: no TapProxy, no client
connection, no socket. What it writes to the client, what it tells the gate and what it records are all seen."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from exporter.tap import http1, policy
from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.deadlines import Deadlines
from exporter.tap.exchange import Client, Exchange, Gate, Services
from exporter.tap.flow import FlowControl
from exporter.tap.http1 import RequestHead
from exporter.tap.settings import TapSettings
from exporter.tap.upstream import UpstreamConnection, UpstreamPool
from llmslo import conventions as C

SLO = SloConfig((SloClass("interactive", 0.5, 0.05, ("chat-*",)),), {})
BODY = json.dumps({"model": "chat-a", "stream": True, "stream_options": {"include_usage": True}}).encode()


class FakeTransport:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.calls: list[str] = []

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def pause_reading(self) -> None:
        self.calls.append("pause")

    def resume_reading(self) -> None:
        self.calls.append("resume")

    def close(self) -> None:
        self.calls.append("close")

    def abort(self) -> None:
        self.calls.append("abort")


@dataclass
class World:
    """The collaborators of one cycle, recording what they are asked."""

    now: float = 0.0
    written: list[bytes] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)
    records: list[policy.Finished] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    settled: list[int] = field(default_factory=list)
    client_transport: FakeTransport = field(default_factory=FakeTransport)
    pool: UpstreamPool = field(default_factory=lambda: UpstreamPool("http://engine:8000", 1.0))

    def services(self) -> Services:
        return Services(self.pool, lambda: self.now, lambda: Deadlines(5.0, 5.0, 60.0), self.records.append,
                        self.released.append, self.refused.append, lambda m: f"label:{m}")

    def client(self) -> Client:
        flow = FlowControl(self.client_transport)  # type: ignore[arg-type]
        return Client(self.written.append, flow, self.done.append, lambda: None, lambda: None, lambda: ("10.0.0.1", 1))

    def exchange(self, gate: Gate | None = None) -> Exchange:
        head = RequestHead(b"POST", b"/v1/chat/completions", b"1.1", [(b"X-Request-Id", b"r1")])
        fwd = policy.forward(head, BODY, True, SLO, TapSettings("http://engine:8000"), b"", b"engine:8000")
        return Exchange(self.services(), self.client(), gate, head, fwd, arrival=0.0, reserved=len(BODY))


def upstream(pool: UpstreamPool) -> tuple[UpstreamConnection, FakeTransport]:
    conn = UpstreamConnection(pool)
    t = FakeTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    return conn, t


def event(content: str | None = None, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {} if content is None else {"content": content}, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


def test_a_stream_relayed_on_its_collaborators_is_judged_and_recorded() -> None:
    w = World()
    ex = w.exchange()
    conn, engine = upstream(w.pool)
    w.pool._idle.append(conn)  # the pool has one idle connection: no connect, no loop needed
    conn.idle_since = time.monotonic()
    ex.start()
    (sent,) = engine.sent  # head and body in one write
    assert sent.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: engine:8000\r\n")
    assert sent.endswith(b"\r\n\r\n" + BODY)
    w.now = 0.1
    ex.upstream_data(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert w.released == [len(BODY)]  # the engine answers: it has the body
    for i, t in enumerate((0.2, 0.22, 0.24)):
        w.now = t
        ex.upstream_data(http1.chunk(event(f"tok{i}")))
    w.now = 0.25
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\n'
    ex.upstream_data(http1.chunk(event(finish="stop")) + http1.chunk(usage) + http1.chunk(b"data: [DONE]\n\n")
                     + http1.LAST_CHUNK)
    out = b"".join(w.written)
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and out.endswith(http1.LAST_CHUNK) and b"tok2" in out
    assert w.done == [False] and ex.done
    (finished,) = w.records
    r = finished.record
    assert (r.outcome, r.good, r.model, r.request_id, r.timings.n_out) == (C.OUTCOME_OK, True, "label:chat-a", "r1", 3)
    assert finished.size == (7, 3)
    assert w.pool.take_idle() is conn  # reusable: back in the pool


def test_a_refusal_by_the_gate_never_reaches_the_engine() -> None:
    @dataclass(frozen=True)
    class Refused:
        refusal: str = C.REFUSED_ADMISSION_TTFT
        ticket: int = 0
        retry_after_s: int = 3

    asked: list[tuple[object, object]] = []
    w = World()

    def decide(objective: object, head: RequestHead, peer: object) -> Refused:
        asked.append((objective, peer))
        return Refused()

    ex = w.exchange(Gate(decide, w.settled.append))
    ex.start()
    assert asked and asked[0][1] == ("10.0.0.1", 1)  # the gate sees the client's peer
    assert w.refused == [C.REFUSED_ADMISSION_TTFT]
    response = b"".join(w.written)
    assert response.startswith(b"HTTP/1.1 429 ") and b"Retry-After: 3\r\n" in response
    (finished,) = w.records
    assert finished.record.outcome == C.OUTCOME_REFUSED and not finished.record.good
    assert w.pool.live == set() and w.settled == []  # nothing sent upstream, no ticket to settle
    assert w.released == [len(BODY)]


def test_an_admitted_ticket_is_settled_once_at_the_end() -> None:
    @dataclass(frozen=True)
    class Admitted:
        refusal: str = ""
        ticket: int = 42
        retry_after_s: int = 0

    w = World()
    ex = w.exchange(Gate(lambda objective, head, peer: Admitted(), w.settled.append))
    conn, _ = upstream(w.pool)
    w.pool._idle.append(conn)
    conn.idle_since = time.monotonic()
    ex.start()
    ex.client_lost()  # the client leaves while on time
    ex.client_lost()
    assert w.settled == [42]
    assert w.records[0].record.outcome == C.OUTCOME_CLIENT_DISCONNECTED


def test_a_full_client_pauses_the_upstream_through_its_flow_control() -> None:
    w = World()
    ex = w.exchange()
    conn, engine = upstream(w.pool)
    w.pool._idle.append(conn)
    conn.idle_since = time.monotonic()
    ex.start()
    ex.pause_upstream()
    ex.pause_upstream()
    w.now = 1.0
    ex.resume_upstream()
    assert engine.calls == ["pause", "resume"] and ex.excused_at == 1.0
