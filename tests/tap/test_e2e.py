"""Thousands of requests through the tap (its own process) to an upstream (another process).

Checks, per request: the client's body is byte-identical to what the upstream sent (minus the
usage event when the tap injected it), and the tap's TTFT and TPOT agree with the client's own
measurement within 1 ms; overall: the goodput counters equal the client's count of good requests.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.scheduling import ahead_of_neighbours
from llmslo import conventions as C

N_REQUESTS = 2000
CONCURRENCY = 64
# The typical request's client-minus-tap difference must stay under AGREEMENT_S. The share of
# requests within it is printed, not asserted: it is a property of the machine's scheduler
# (2-vCPU VM: 99.7% alone, 96% inside the suite; a slower CI machine: 86%), and the exact
# per-request check (2. below) already proves the tap times the right events.
AGREEMENT_S = 0.001

# Objectives far from what the upstream's delays produce, so that scheduling noise of a
# shared machine cannot move a request across a threshold (fast 5-40 ms vs slow 150-300 ms).
SLO_YAML = """\
version: "prometheus/v1"
service: "chat"
slos:
  - name: goodput-interactive
    objective: 95
    sli: {plugin: {id: llmslo/goodput, options: {slo_class: interactive, ttft: "0.2", tpot: "0.1", models: "chat-*"}}}
  - name: goodput-batch
    objective: 90
    sli: {plugin: {id: llmslo/goodput, options: {slo_class: batch, ttft: "0.3", tpot: "0.15", models: "batch-*"}}}
  - name: ttft
    objective: 99
    sli: {plugin: {id: llmslo/latency, options: {metric: ttft, threshold: "0.1", source: tap}}}
"""
OBJECTIVES = {"chat-a": (0.2, 0.1), "batch-b": (0.3, 0.15)}

# Against the simulator: one class for its model; objectives inside its latency range, so that
# some requests meet them and some do not (calibrated simulator, #19: TTFT 45-58 ms, p25 54 ms; TPOT 7.8-10 ms).
SIM_OBJECTIVES = (0.053, 0.0095)
SIM_BURST_BOUND_S = 0.010  # 64 streams' chunks of one engine step, relayed one after another
SIM_SLO_YAML = f"""\
version: "prometheus/v1"
service: "sim"
slos:
  - name: goodput
    objective: 95
    sli: {{plugin: {{id: llmslo/goodput, options: {{slo_class: interactive, ttft: "{SIM_OBJECTIVES[0]}", tpot: "{SIM_OBJECTIVES[1]}"}}}}}}
"""


@dataclass
class Plan:
    rid: str
    path: str
    model: str
    stream: bool
    asks_usage: bool
    chunks: int
    first_ms: float
    delay_ms: float
    extra: tuple[tuple[str, Any], ...] = ()  # more body fields

    def body(self) -> bytes:
        doc: dict[str, Any] = {"model": self.model, "stream": self.stream, "max_tokens": self.chunks, **dict(self.extra)}
        if self.path.endswith("chat/completions"):
            doc["messages"] = [{"role": "user", "content": f"question {self.rid}"}]
        else:
            doc["prompt"] = f"prompt {self.rid}"
        if self.asks_usage:
            doc["stream_options"] = {"include_usage": True}
        return json.dumps(doc).encode()

    def headers(self) -> dict[str, str]:
        return {
            "Content-Type": "application/json", "x-request-id": self.rid, "x-test-chunks": str(self.chunks),
            "x-test-first-ms": str(self.first_ms), "x-test-delay-ms": str(self.delay_ms),
        }


def plans(n: int) -> list[Plan]:
    out = []
    for i in range(n):
        rng = random.Random(i)
        out.append(
            Plan(
                rid=f"e2e-{i}",
                path="/v1/chat/completions" if rng.random() < 0.85 else "/v1/completions",
                model=rng.choice(list(OBJECTIVES)),
                stream=rng.random() < 0.95,
                asks_usage=rng.random() < 0.5,
                chunks=rng.randint(1, 8),
                first_ms=rng.choice([30.0, 50.0, 400.0]),
                delay_ms=rng.choice([40.0, 80.0, 300.0]),
            )
        )
    return out


@dataclass
class ClientSeen:
    sha: str
    ttft: float | None
    tpot: float | None
    e2e: float
    n_out: int
    sent_at: float  # time.perf_counter() just before the request was written
    first_at: float | None  # ... when the first output event arrived
    last_at: float | None  # ... when the last output event arrived


def _is_output(doc: Any) -> bool:
    for choice in doc.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls") or choice.get("text"):
            return True
    return False


class _Exchange(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection whose responses are timed in data_received itself.

    A bare protocol, not an HTTP client library, so the client's clock reads each chunk's arrival
    without the client's own buffering and task scheduling in between.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._reset(None)

    def _reset(self, on_body: Any) -> None:
        self.buf = b""
        self.head: bytes | None = None
        self.chunk_left = -1  # -1: expecting a chunk-size line
        self.on_body = on_body
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc or ConnectionError("connection closed"))

    async def exchange(self, request: bytes, on_body: Any) -> tuple[float, bytes]:
        """Send one request; on_body(t, bytes) gets each body piece with its arrival time."""
        assert self.transport is not None
        self._reset(on_body)
        self.done = asyncio.get_running_loop().create_future()
        t0 = time.perf_counter()
        self.transport.write(request)
        await self.done
        assert self.head is not None
        return t0, self.head

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.buf += data
        if self.head is None:
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                return
            self.head, self.buf = self.buf[:i], self.buf[i + 4 :]
            assert b"transfer-encoding: chunked" in self.head.lower() or b"content-length" in self.head.lower()
            if b"transfer-encoding: chunked" not in self.head.lower():
                length = int(self.head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                self.chunk_left = length
                self.fixed = True
            else:
                self.fixed = False
        if self.fixed:
            if len(self.buf) >= self.chunk_left:
                self.on_body(now, self.buf)
                self.done.set_result(None)  # type: ignore[union-attr]
            return
        while True:
            if self.chunk_left < 0:
                j = self.buf.find(b"\r\n")
                if j < 0:
                    return
                size = int(self.buf[:j].split(b";")[0], 16)
                if size == 0:
                    if self.buf.startswith(b"\r\n", j + 2):
                        self.done.set_result(None)  # type: ignore[union-attr]
                    return
                self.buf = self.buf[j + 2 :]
                self.chunk_left = size
            if len(self.buf) < self.chunk_left + 2:
                return
            self.on_body(now, self.buf[: self.chunk_left])
            self.buf = self.buf[self.chunk_left + 2 :]
            self.chunk_left = -1


async def fetch(conn: _Exchange, plan: Plan) -> ClientSeen:
    """The client's own measurement: its clock from just before sending to each event's arrival."""
    digest = hashlib.sha256()
    state: dict[str, Any] = {"first": None, "last": None, "outputs": 0, "usage": None, "buf": b""}

    def on_body(now: float, piece: bytes) -> None:
        digest.update(piece)
        state["buf"] += piece
        if not plan.stream:
            return
        *events, state["buf"] = state["buf"].split(b"\n\n")
        for event in events:
            data = event.removeprefix(b"data: ")
            if data == b"[DONE]":
                continue
            doc = json.loads(data)
            if _is_output(doc):
                state["first"] = state["first"] if state["first"] is not None else now
                state["last"] = now
                state["outputs"] += 1
            if doc.get("usage"):
                state["usage"] = doc["usage"]["completion_tokens"]

    body = plan.body()
    head = f"POST {plan.path} HTTP/1.1\r\nHost: tap\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in plan.headers().items()) + "\r\n"
    t0, response_head = await conn.exchange(head.encode() + body, on_body)
    end = time.perf_counter()
    assert response_head.startswith(b"HTTP/1.1 200"), response_head
    if not plan.stream:
        state["usage"] = json.loads(state["buf"])["usage"]["completion_tokens"]
    n_out = state["usage"] if state["usage"] is not None else state["outputs"]
    first, last = state["first"], state["last"]
    if first is None or last is None:
        return ClientSeen(digest.hexdigest(), None, None, end - t0, n_out, t0, None, None)
    tpot = (last - first) / (n_out - 1) if n_out > 1 else 0.0
    return ClientSeen(digest.hexdigest(), first - t0, tpot, end - t0, n_out, t0, first, last)


def client_good(plan: Plan, seen: ClientSeen) -> bool:
    ttft_max, tpot_max = OBJECTIVES[plan.model]
    if not plan.stream:
        return seen.e2e <= ttft_max + (seen.n_out - 1) * tpot_max
    return seen.ttft is not None and seen.ttft <= ttft_max and seen.tpot is not None and seen.tpot <= tpot_max


async def drive(base: str, todo: list[Plan]) -> dict[str, ClientSeen]:
    seen: dict[str, ClientSeen] = {}
    queue = list(reversed(todo))
    host, port = base.removeprefix("http://").rsplit(":", 1)
    loop = asyncio.get_running_loop()

    async def worker(k: int) -> None:
        transport, conn = await loop.create_connection(_Exchange, host, int(port))
        try:
            # Warm the connection (and the tap's pooled upstream connection) on an untimed path,
            # then start staggered, as real clients do, rather than as one synchronized burst.
            _, head = await conn.exchange(b"GET /v1/models HTTP/1.1\r\nHost: tap\r\n\r\n", lambda t, b: None)
            assert head.startswith(b"HTTP/1.1 200")
            await asyncio.sleep(k * 0.005)
            while queue:
                plan = queue.pop()
                seen[plan.rid] = await fetch(conn, plan)
        finally:
            transport.close()

    await asyncio.gather(*(worker(k) for k in range(CONCURRENCY)))
    return seen


def get_json(url: str) -> Any:
    async def get() -> Any:
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            return await r.json()

    return asyncio.run(get())


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    async def get() -> str:
        async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
            return await r.text()

    text = asyncio.run(get())
    return {(s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def total(samples: dict[Any, float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def check_against(tap: Any, upstream: Any, records_path: Path) -> None:
    """tap, upstream: conftest.Proc (started processes)."""
    todo = plans(N_REQUESTS)
    started = time.monotonic()
    with ahead_of_neighbours([tap.popen.pid, upstream.popen.pid]) as scheduling:
        seen = asyncio.run(drive(tap.url, todo))
    elapsed = time.monotonic() - started
    samples = scrape(f"http://127.0.0.1:{tap.ports[1]}")
    tap.stop()
    tapped = {r["request_id"]: r for r in json.loads(records_path.read_text())}
    sent = get_json(upstream.url + "/_records")

    assert len(seen) == len(tapped) == N_REQUESTS
    # 1. Every body arrived byte-identical to what the upstream sent (less the injected usage event).
    for plan in todo:
        s = sent[plan.rid]
        want = s["sha_all"] if plan.asks_usage or not plan.stream else s["sha_without_usage"]
        assert seen[plan.rid].sha == want, plan
        assert tapped[plan.rid]["usage_injected"] == (plan.stream and not plan.asks_usage)

    # 2. Each of the tap's timestamps is the right event: it lies between the moment the
    #    upstream wrote that event and the moment the client read it (one monotonic clock is
    #    shared by the three processes). Exact, for every request, whatever the machine's load.
    for plan in todo:
        c, t, u = seen[plan.rid], tapped[plan.rid], sent[plan.rid]
        assert t["outcome"] == C.OUTCOME_OK
        assert t["n_out"] == c.n_out == plan.chunks
        if not plan.stream:
            assert t["ttft"] is None and c.ttft is None
            continue
        tap_first = t["arrival"] + t["ttft"]
        tap_last = tap_first + t["tpot"] * (t["n_out"] - 1)
        assert c.sent_at <= t["arrival"] <= u["received_at"], plan
        assert u["first_output_at"] <= tap_first <= c.first_at, plan  # not the role chunk, not a later one
        assert u["last_output_at"] - 1e-6 <= tap_last <= c.last_at + 1e-6, plan

    # 3. TTFT and TPOT agree with the client's own measurement: the typical request within 1 ms.
    #    The difference is the request's hop into the tap plus the first token's hop out of it,
    #    which the tap cannot see; on a busy shared machine some hops are descheduled for longer.
    ttft_diffs = [seen[p.rid].ttft - tapped[p.rid]["ttft"] for p in todo if p.stream]
    tpot_diffs = [abs(seen[p.rid].tpot - tapped[p.rid]["tpot"]) for p in todo if p.stream]
    ttft_within = sum(abs(d) < AGREEMENT_S for d in ttft_diffs) / len(ttft_diffs)
    tpot_within = sum(d < AGREEMENT_S for d in tpot_diffs) / len(tpot_diffs)
    summary = (
        f"{N_REQUESTS} requests in {elapsed:.1f}s ({scheduling}); client-minus-tap TTFT: median"
        f" {statistics.median(ttft_diffs) * 1e3:.3f} ms, {ttft_within:.2%} within 1 ms, max {max(ttft_diffs) * 1e3:.3f} ms;"
        f" TPOT: {tpot_within:.2%} within 1 ms, max {max(tpot_diffs) * 1e3:.3f} ms"
    )
    print(summary)
    assert statistics.median(ttft_diffs) < AGREEMENT_S, summary
    assert statistics.median(tpot_diffs) < AGREEMENT_S, summary

    # 4. Goodput counters equal the client's count of good requests (and the tap's own view).
    client_good_n = sum(client_good(p, seen[p.rid]) for p in todo)
    assert 0 < client_good_n < N_REQUESTS, "the workload must contain both good and bad requests"
    assert total(samples, C.GOODPUT_REQUESTS.name) == client_good_n
    assert sum(r["good"] for r in tapped.values()) == client_good_n
    for model, cls in (("chat-a", "interactive"), ("batch-b", "batch")):
        want = sum(client_good(p, seen[p.rid]) for p in todo if p.model == model)
        assert total(samples, C.GOODPUT_REQUESTS.name, model=model, slo_class=cls) == want
    assert total(samples, C.TAP_REQUESTS.name, outcome=C.OUTCOME_OK) == N_REQUESTS
    good_tokens = sum(seen[p.rid].n_out for p in todo if client_good(p, seen[p.rid]))
    assert total(samples, C.GOODPUT_TOKENS.name) == good_tokens
    assert total(samples, C.OUTPUT_TOKENS.name, usage_source=C.USAGE_SOURCE_ENGINE) == sum(p.chunks for p in todo)


def test_thousands_of_requests_through_the_tap(tmp_path: Path, upstream_proc: Any, recording_tap: Any) -> None:
    slo = tmp_path / "slo.yaml"
    slo.write_text(SLO_YAML)
    records = tmp_path / "records.json"
    tap = recording_tap(upstream_proc.url, slo, records)
    try:
        check_against(tap, upstream_proc, records)
    finally:
        tap.stop()


# ----------------------------------------------------------------------------------------
# The same through the tap to the project's simulator (simulator.api)
# ----------------------------------------------------------------------------------------
N_SIM_REQUESTS = 1000


def test_a_thousand_requests_through_the_tap_to_the_simulator(tmp_path: Path, simulator_proc: Any, recording_tap: Any) -> None:
    model = get_json(simulator_proc.url + "/v1/models")["data"][0]["id"]
    slo = tmp_path / "slo.yaml"
    slo.write_text(SIM_SLO_YAML)
    records = tmp_path / "records.json"
    tap = recording_tap(simulator_proc.url, slo, records)
    try:
        todo = []
        for i in range(N_SIM_REQUESTS):
            rng = random.Random(10_000 + i)
            todo.append(Plan(
                rid=f"sim-{i}", path="/v1/chat/completions" if rng.random() < 0.85 else "/v1/completions", model=model,
                stream=True, asks_usage=rng.random() < 0.5, chunks=rng.randint(2, 24), first_ms=0, delay_ms=0,
                extra=(("ignore_eos", True),),
            ))
        with ahead_of_neighbours([tap.popen.pid, simulator_proc.popen.pid]) as scheduling:
            seen = asyncio.run(drive(tap.url, todo))
        samples = scrape(f"http://127.0.0.1:{tap.ports[1]}")
        tap.stop()
        tapped = {r["request_id"]: r for r in json.loads(records.read_text())}
        sent = get_json(simulator_proc.url + "/_records")
    finally:
        tap.stop()

    assert len(seen) == len(tapped) == N_SIM_REQUESTS
    for plan in todo:
        c, t, s = seen[plan.rid], tapped[plan.rid], sent[plan.rid]
        assert c.sha == (s["sha_all"] if plan.asks_usage else s["sha_without_usage"]), plan
        assert t["outcome"] == C.OUTCOME_OK and t["usage_injected"] == (not plan.asks_usage)
        assert t["n_out"] == c.n_out == plan.chunks and t["usage_source"] == C.USAGE_SOURCE_ENGINE
    ttft_diffs = [seen[p.rid].ttft - tapped[p.rid]["ttft"] for p in todo]
    tpot_diffs = [abs(seen[p.rid].tpot - tapped[p.rid]["tpot"]) for p in todo]
    ttft_within = sum(abs(d) < AGREEMENT_S for d in ttft_diffs) / len(ttft_diffs)
    tpot_within = sum(d < AGREEMENT_S for d in tpot_diffs) / len(tpot_diffs)
    summary = (
        f"simulator, {N_SIM_REQUESTS} requests ({scheduling}): client-minus-tap TTFT median"
        f" {statistics.median(ttft_diffs) * 1e3:.3f} ms, {ttft_within:.2%} within 1 ms; TPOT {tpot_within:.2%} within 1 ms"
    )
    print(summary)
    # Unlike the test upstream, the simulator emits one token for every running request at each
    # engine step, as vLLM does: the tap relays such a burst one chunk after another, so the
    # last stream of a step reads its token later than the tap did (~0.1 ms per chunk ahead of
    # it). TTFT agreement is then bounded by the burst, not by 1 ms; the tap never sees a token
    # after the client does.
    assert min(ttft_diffs) > -AGREEMENT_S and statistics.median(ttft_diffs) < SIM_BURST_BOUND_S, summary
    assert statistics.median(tpot_diffs) < AGREEMENT_S, summary
    # Goodput: the counter is the tap's per-request verdicts, and wherever the client's and the
    # tap's measurements fall on the same side of the objectives, the verdicts are the client's.
    ttft_max, tpot_max = SIM_OBJECTIVES
    tap_good = sum(r["good"] for r in tapped.values())
    assert total(samples, C.GOODPUT_REQUESTS.name) == tap_good
    client_good_n = straddling = 0
    for plan in todo:
        c, t = seen[plan.rid], tapped[plan.rid]
        mine = c.ttft <= ttft_max and c.tpot <= tpot_max
        client_good_n += mine
        if (c.ttft <= ttft_max) != (t["ttft"] <= ttft_max) or (c.tpot <= tpot_max) != (t["tpot"] <= tpot_max):
            straddling += 1
            continue
        assert t["good"] == mine, plan
    print(f"simulator goodput: tap {tap_good}, client {client_good_n}, {straddling} requests straddle an objective")
    assert 0 < client_good_n < N_SIM_REQUESTS and abs(tap_good - client_good_n) <= straddling
