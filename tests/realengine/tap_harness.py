"""What the tap tests in front of the real vLLM share: the tap as its own process (`python -m exporter tap`, as
operators run it) read through its /metrics, a client that times every request itself (first and last content
token as it reads them, the token count from `usage` or, with `ignore_eos`, exactly `max_tokens`), and the
engine's own counters."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from realengine.process import free_port
from realengine.vllm_server import SERVED_NAME, VllmServer

ROOT = Path(__file__).resolve().parents[2]
MODEL = SERVED_NAME
TTFT_OBJ = 0.1  # seconds
TPOT_OBJ = 0.015
# What the client's clock may add to the tap's per request: the tap's arrival is after the client's send,
# and the client reads each event after the tap relayed it (loopback, a shared 2-core machine under load).
# Measured as the E2E sums' difference a request: 11 ms on quiet cores, 32 ms on the CI machine with the
# engine decoding on both cores beside the client and the tap.
TOL = 0.1
SLO_YAML = f"""\
version: "prometheus/v1"
service: "real"
slos:
  - name: goodput
    objective: 95
    sli: {{plugin: {{id: llmslo/goodput, options: {{slo_class: interactive, ttft: "{TTFT_OBJ}", tpot: "{TPOT_OBJ}"}}}}}}
"""
CLS = "interactive"
WORDS = 4000  # the tiny model's word-level vocabulary has w1..w4000 among its words: one token each


def prompt(n: int, rng: random.Random) -> str:
    """n tokens of random words: unique, so that prefix caching cannot shorten the prefill."""
    return " ".join(f"w{rng.randint(1, WORDS)}" for _ in range(n))


# ------------------------------------------------------------------------------------------------
# The tap, as its own process
# ------------------------------------------------------------------------------------------------
@dataclass
class Tap:
    proc: subprocess.Popen
    url: str
    metrics_url: str
    log: Path

    def samples(self) -> dict[tuple[str, frozenset], float]:
        with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
            text = r.read().decode()
        return {(s.name, frozenset(s.labels.items())): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def value(self, name: str, **labels: str) -> float:
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples().items() if n == name and want <= ls)

    def outcomes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (n, ls), v in self.samples().items():
            if n == "llm_tap_requests_total" and v:
                o = dict(ls)["outcome"]
                out[o] = out.get(o, 0) + int(v)
        return out

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text(errors="replace")


def start_tap(upstream: str, tmp: Path, *extra: str, objectives: tuple[float, float] = (TTFT_OBJ, TPOT_OBJ)) -> Tap:
    slo = tmp / "slo.yaml"
    slo.write_text(SLO_YAML.replace(f'ttft: "{TTFT_OBJ}", tpot: "{TPOT_OBJ}"',
                                    f'ttft: "{objectives[0]}", tpot: "{objectives[1]}"'))
    port, mport = free_port(), free_port()
    log = tmp / f"tap-{port}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "tap", "--listen", f"127.0.0.1:{port}", "--upstream", upstream,
         "--metrics-listen", f"127.0.0.1:{mport}", "--slo", str(slo), *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log, "wb"), env={**os.environ, "PYTHONUNBUFFERED": "1"})
    tap = Tap(proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{mport}/metrics", log)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the tap exited with {proc.returncode}: {log.read_text()}")
        try:
            if "llm_tap_requests_total" in str(tap.samples()) or tap.samples() is not None:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            tap.stop()
            raise RuntimeError(f"the tap did not start: {log.read_text()}")
        time.sleep(0.1)
    # the model becomes a label value once the tap has read the engine's /v1/models (up to 2 s at start)
    return tap


# ------------------------------------------------------------------------------------------------
# The client: it times every request itself
# ------------------------------------------------------------------------------------------------
@dataclass
class Result:
    kind: str  # what the test meant this request to be
    stream: bool
    status: int = 0
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    events: int = 0  # content events read
    usage: int | None = None  # usage.completion_tokens the client saw
    expected_tokens: int = 0  # max_tokens (ignore_eos: exactly that many)
    done: bool = False  # read `data: [DONE]` (streams) / a whole JSON body
    broken: str = ""  # how the response ended otherwise
    left: bool = False  # the client closed the connection itself
    headers: dict = field(default_factory=dict)
    body: str = ""
    saw_usage_chunk: bool = False
    ended_at: float = 0.0  # time.perf_counter() when the client was done with it
    span: float = 0.0  # from the first content event to the last the client read

    @property
    def pace(self) -> float:
        """Seconds per content event after the first, as this client read them."""
        return self.span / max(self.events - 1, 1)

    @property
    def n_out(self) -> int:
        return self.usage if self.usage is not None else self.expected_tokens

    def good(self, ttft_obj: float = TTFT_OBJ, tpot_obj: float = TPOT_OBJ) -> bool:
        if self.status != 200 or not self.done:
            return False
        if self.stream:
            return self.ttft is not None and self.ttft <= ttft_obj and (self.tpot or 0.0) <= tpot_obj
        return self.e2e is not None and self.e2e <= ttft_obj + (self.n_out - 1) * tpot_obj


def content_of(doc: dict) -> bool:
    for c in doc.get("choices") or []:
        if c.get("text") or (c.get("delta") or {}).get("content"):
            return True
    return False


async def call(session: aiohttp.ClientSession, base: str, *, kind: str, chat: bool, stream: bool, text: str,
               max_tokens: int, ask_usage: bool = False, leave_after_events: int | None = None,
               leave_after_s: float | None = None, read_timeout: float = 60.0,
               on_first: asyncio.Event | None = None) -> Result:
    """One request, timed as its user sees it. `leave_after_events`/`leave_after_s`: the client closes the
    connection after reading that many content events / after that long (whichever first)."""
    body: dict = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    if ask_usage:  # vLLM answers 400 to stream_options on a request that does not stream
        body["stream_options"] = {"include_usage": True}
    res = Result(kind, stream, expected_tokens=max_tokens)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    t0 = time.perf_counter()
    first = last = None

    async def run() -> None:
        nonlocal first, last
        async with session.post(base + path, json=body, timeout=aiohttp.ClientTimeout(total=read_timeout)) as r:
            res.status = r.status
            res.headers = dict(r.headers)
            if r.status != 200 or not stream:
                raw = await r.read()
                res.e2e = time.perf_counter() - t0
                res.body = raw.decode(errors="replace")
                if r.status == 200:
                    doc = json.loads(raw)
                    res.usage = doc["usage"]["completion_tokens"]
                    res.done = True
                return
            async for line in r.content:
                now = time.perf_counter()
                if line.startswith(b"data: [DONE]"):
                    res.done = True
                    continue
                if not line.startswith(b"data: {"):
                    continue
                doc = json.loads(line[6:])
                if isinstance(doc.get("usage"), dict):
                    res.usage = doc["usage"]["completion_tokens"]
                    res.saw_usage_chunk = True
                if content_of(doc):
                    first = first or now
                    last = now
                    if on_first is not None:
                        on_first.set()
                    res.events += 1
                    if leave_after_events is not None and res.events >= leave_after_events:
                        res.left = True
                        return  # leaving the context closes the connection (the body was not read whole)
            res.e2e = time.perf_counter() - t0

    try:
        if leave_after_s is not None:
            try:
                await asyncio.wait_for(run(), leave_after_s)
            except asyncio.TimeoutError:
                res.left = True
        else:
            await run()
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
        res.broken = type(e).__name__
        res.e2e = time.perf_counter() - t0
    res.ended_at = time.perf_counter()
    if first is not None:
        res.ttft = first - t0
        res.span = last - first
        n = res.n_out
        res.tpot = (last - first) / (n - 1) if n > 1 else 0.0
    return res


def engine_counter(server: VllmServer, name: str, **labels: str) -> float:
    want = set(labels.items())
    total = 0.0
    for fam in text_string_to_metric_families(server.metrics()):
        for s in fam.samples:
            if s.name == name and want <= set(s.labels.items()):
                total += s.value
    return total


def engine_finished(server: VllmServer) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(server.metrics()):
        for s in fam.samples:
            if s.name == "vllm:request_success_total":
                r = s.labels.get("finished_reason", "")
                out[r] = out.get(r, 0.0) + s.value
    return out


def wait_idle(server: VllmServer, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if engine_counter(server, "vllm:num_requests_running") + engine_counter(server, "vllm:num_requests_waiting") == 0:
            return
        time.sleep(0.1)
    raise AssertionError("the engine did not go idle")
