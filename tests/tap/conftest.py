"""A deterministic OpenAI-compatible test upstream, and helpers that run it and the tap.

The upstream streams chat/completions SSE like vLLM (role-only first chunk, one chunk per
token, optional usage chunk, `[DONE]`) and is steered per request by headers:

  x-request-id           id under which it records what it sent
  x-test-chunks          output chunks (default 5)
  x-test-tokens-per-chunk completion tokens each chunk stands for (default 1)
  x-test-first-ms        delay before the first output chunk (after the role chunk)
  x-test-delay-ms        delay between output chunks
  x-test-chunk-bytes     size of each chunk's content (default: a short word)
  x-test-hang-ms         delay before the response headers
  x-test-reset-after     abort the connection after this many output chunks
  x-test-status          answer with this status and a JSON error body
  x-test-error-event     send an error event after this many output chunks
  x-test-usage-null      "1": when usage is asked for, add `"usage":null` to every other chunk (as OpenAI does)
  x-test-linger-ms       delay between `[DONE]` and the end of the body
  x-test-no-done         "1": end the stream after the finish_reason (and usage) without `[DONE]`
  x-test-end-after       end the body cleanly after this many output chunks: no finish_reason, usage or `[DONE]`
  x-test-usage-tokens    the completion_tokens the usage reports (default: chunks x tokens per chunk)

GET /ws is a WebSocket that echoes text messages prefixed with `echo:`.

For each request it records the sha256 of every body byte it sent, and of the bytes a client
gets when the usage event (sent only because usage was asked for) is left out, whether its
handler saw the client go away, and how many bytes it had written.

Run as a script it serves the upstream (`upstream`) or a tap that records per-request
timings (`tap`), each in its own process, printing `PORT <n>` lines once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

ROOT = Path(__file__).resolve().parents[2]
GZIP_BODY = gzip.compress(b"compressed by the engine " * 100, mtime=0)
PYTHON = sys.executable


@dataclass
class SentRecord:
    request_id: str
    path: str
    include_usage: bool
    bytes_sent: int = 0
    cancelled: bool = False
    finished: bool = False
    body: str = ""  # the request body as received (the tap's injection is visible here)
    received_at: float = 0.0  # time.perf_counter() (CLOCK_MONOTONIC, shared by all processes)
    first_output_at: float | None = None  # just before the first output chunk was written
    last_output_at: float | None = None  # just before the last output chunk was written
    _all: object = field(default_factory=hashlib.sha256, repr=False)
    _client: object = field(default_factory=hashlib.sha256, repr=False)

    def public(self) -> dict[str, object]:
        return {
            "request_id": self.request_id, "path": self.path, "include_usage": self.include_usage,
            "sha_all": self._all.hexdigest(), "sha_without_usage": self._client.hexdigest(),  # type: ignore[attr-defined]
            "bytes_sent": self.bytes_sent, "cancelled": self.cancelled, "finished": self.finished, "body": self.body,
            "received_at": self.received_at, "first_output_at": self.first_output_at,
            "last_output_at": self.last_output_at,
        }


def _chunk(rid: str, model: str, chat: bool, text: str | None, finish: str | None, role: bool = False) -> bytes:
    if chat:
        delta: dict[str, object] = {"role": "assistant", "content": ""} if role else {"content": text}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    doc = {"id": f"cmpl-{rid}", "object": obj, "created": 1700000000, "model": model, "choices": [choice]}
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def _usage_chunk(rid: str, model: str, chat: bool, n: int) -> bytes:
    doc = {
        "id": f"cmpl-{rid}", "object": "chat.completion.chunk" if chat else "text_completion", "created": 1700000000,
        "model": model, "choices": [], "usage": {"prompt_tokens": 7, "total_tokens": 7 + n, "completion_tokens": n},
    }
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


class TestUpstream:
    """The upstream's handlers and what it recorded."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.records: dict[str, SentRecord] = {}
        self.requests_seen = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/_records", self.dump)
        app.router.add_route("*", "/echo/{tail:.*}", self.echo)
        app.router.add_get("/gzip", self.gzipped)
        app.router.add_get("/ws", self.websocket)
        return app

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        """Echoes text messages back prefixed with `echo:` (a protocol upgrade through the tap)."""
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                await ws.send_str("echo:" + msg.data)
        return ws

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "chat-a", "object": "model"}]})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3.0\n")

    async def echo(self, request: web.Request) -> web.Response:
        body = await request.read()
        doc = {"method": request.method, "raw_path": request.raw_path, "headers": dict(request.headers), "len": len(body)}
        return web.json_response(doc, headers={"X-Echo": "1"})

    async def gzipped(self, request: web.Request) -> web.Response:
        return web.Response(body=GZIP_BODY, headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})

    async def dump(self, request: web.Request) -> web.Response:
        return web.json_response({rid: r.public() for rid, r in self.records.items()})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.requests_seen += 1
        received_at = time.perf_counter()
        raw = await request.read()
        doc = json.loads(raw)
        h = request.headers
        rid = h.get("x-request-id") or uuid.uuid4().hex
        chat = request.path.endswith("/chat/completions")
        model = doc.get("model", "")
        opts = doc.get("stream_options") or {}
        rec = SentRecord(rid, request.path, bool(opts.get("include_usage")), body=raw.decode(), received_at=received_at)
        self.records[rid] = rec
        n = int(h.get("x-test-chunks", "5"))
        tpc = int(h.get("x-test-tokens-per-chunk", "1"))
        first_s = float(h.get("x-test-first-ms", "0")) / 1000
        delay_s = float(h.get("x-test-delay-ms", "0")) / 1000
        size = int(h.get("x-test-chunk-bytes", "0"))
        reset_after = int(h.get("x-test-reset-after", "-1"))
        error_after = int(h.get("x-test-error-event", "-1"))
        end_after = int(h.get("x-test-end-after", "-1"))
        usage_tokens = int(h["x-test-usage-tokens"]) if "x-test-usage-tokens" in h else n * tpc
        try:
            if "x-test-hang-ms" in h:
                await asyncio.sleep(float(h["x-test-hang-ms"]) / 1000)
            status = int(h.get("x-test-status", "200"))
            if status != 200:
                body = json.dumps({"error": {"message": "injected", "code": status}}).encode()
                rec._all.update(body)  # type: ignore[attr-defined]
                rec._client.update(body)  # type: ignore[attr-defined]
                rec.finished = True
                return web.Response(status=status, body=body, content_type="application/json")
            if not doc.get("stream"):
                await asyncio.sleep(first_s + delay_s * max(n - 1, 0))
                text = "".join(f"tok{i} " for i in range(n))
                content = {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
                body = json.dumps(
                    {"id": f"cmpl-{rid}", "model": model, "choices": [{"index": 0, **content, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 7, "completion_tokens": usage_tokens, "total_tokens": 7 + usage_tokens}}
                ).encode()
                rec._all.update(body)  # type: ignore[attr-defined]
                rec._client.update(body)  # type: ignore[attr-defined]
                rec.bytes_sent = len(body)
                rec.finished = True
                return web.Response(body=body, content_type="application/json")
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)

            null_usage = rec.include_usage and h.get("x-test-usage-null") == "1"  # as OpenAI and the simulator

            async def send(data: bytes, usage: bool = False) -> None:
                if not usage:
                    rec._client.update(data)  # type: ignore[attr-defined]  # what a client not asking for usage gets
                if null_usage and not usage and data.startswith(b"data: {"):
                    data = data[:-3] + b',"usage":null}\n\n'
                rec._all.update(data)  # type: ignore[attr-defined]
                await resp.write(data)
                rec.bytes_sent += len(data)

            if chat:
                await send(_chunk(rid, model, chat, None, None, role=True))
            for i in range(n):
                await asyncio.sleep(first_s if i == 0 else delay_s)
                if i == reset_after:
                    assert request.transport is not None
                    request.transport.abort()
                    return resp
                if i == error_after:
                    await send(b'data: {"error":{"message":"engine died","code":500}}\n\n')
                    break
                if i == end_after:
                    await resp.write_eof()
                    rec.finished = True
                    return resp
                text = "x" * size if size else f"tok{i} "
                rec.last_output_at = time.perf_counter()
                if rec.first_output_at is None:
                    rec.first_output_at = rec.last_output_at
                await send(_chunk(rid, model, chat, text, "stop" if i == n - 1 else None))
            if rec.include_usage:
                await send(_usage_chunk(rid, model, chat, usage_tokens), usage=True)
            if h.get("x-test-no-done") != "1":
                await send(b"data: [DONE]\n\n")
            if "x-test-linger-ms" in h:
                await asyncio.sleep(float(h["x-test-linger-ms"]) / 1000)
            await resp.write_eof()
            rec.finished = True
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            rec.cancelled = True
            raise


# ----------------------------------------------------------------------------------------
# In-process servers (fault tests)
# ----------------------------------------------------------------------------------------
async def start_app(app: web.Application, **kw: object) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0, **kw)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@dataclass
class Stack:
    """A test upstream and a real tap in front of it, both in this process."""

    upstream: TestUpstream
    upstream_url: str
    tap_url: str
    metrics_url: str
    records: list  # RequestRecord, in completion order
    server: object  # TapServer

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        from prometheus_client import generate_latest
        from prometheus_client.parser import text_string_to_metric_families

        text = generate_latest(self.server.metrics.registry).decode()  # type: ignore[attr-defined]
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        }

    def value(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels`."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples().items() if n == name and want <= ls)


@asynccontextmanager
async def tap_stack(
    slo: object = None, upstream_url: str | None = None, models_refresh_s: float | None = None, **settings: object
) -> AsyncIterator[Stack]:
    """`models_refresh_s`: how often the tap reads the upstream's /v1/models; by default as the CLI
    does with this module's upstream (which lists chat-a), and never with an upstream of the test's
    own (its recorded connections and requests would show the tap's reads)."""
    from exporter.tap.classes import SloConfig
    from exporter.tap.models import DEFAULT_REFRESH_S
    from exporter.tap.server import TapServer
    from exporter.tap.settings import TapSettings

    upstream = TestUpstream()
    runner = None
    if models_refresh_s is None:
        models_refresh_s = DEFAULT_REFRESH_S if upstream_url is None else 0.0
    if upstream_url is None:
        runner, upstream_url = await start_app(upstream.app())
    records: list = []
    server = TapServer(
        TapSettings(upstream_url, **settings),  # type: ignore[arg-type]
        slo if slo is not None else SloConfig((), {}),  # type: ignore[arg-type]
        observer=records.append,
        shutdown_timeout_s=1.0,
        models_refresh_s=models_refresh_s,
    )
    await server.start(("127.0.0.1", 0), ("127.0.0.1", 0))
    try:
        assert server.proxy_address and server.metrics_address
        yield Stack(upstream, upstream_url, server.proxy_address.url(), server.metrics_address.url(), records, server)
    finally:
        await server.stop()
        if runner is not None:
            await runner.cleanup()


# ----------------------------------------------------------------------------------------
# Processes (end-to-end test, memory test)
# ----------------------------------------------------------------------------------------
@dataclass
class Proc:
    popen: subprocess.Popen[str]
    ports: list[int]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")

    def stop(self) -> str:
        """SIGTERM, wait, and return what it wrote to stderr."""
        stop_process(self.popen)
        return self.popen.stderr.read() if self.popen.stderr else ""


def stop_process(popen: subprocess.Popen[str], timeout_s: float = 15.0) -> None:
    """SIGTERM, wait up to `timeout_s`, SIGKILL if it is still there; reaps it."""
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()


@dataclass
class CliTap:
    """The tap's CLI (`python -m exporter.tap`) in its own process. Its stderr is read in the background from
    the moment it listens: a full pipe would block the tap."""

    popen: subprocess.Popen[str]
    proxy_url: str
    metrics_url: str
    _stderr: list[str]
    _reader: threading.Thread

    @property
    def port(self) -> int:
        return int(self.proxy_url.rsplit(":", 1)[1])

    def stop(self) -> str:
        """SIGTERM, wait, and return all it wrote to stderr."""
        stop_process(self.popen)
        self._reader.join(timeout=5)
        return "".join(self._stderr)


def spawn_cli_tap(upstream: str, *extra: str) -> CliTap:
    """The tap's CLI on OS-chosen loopback ports in front of `upstream`, with `extra` flags."""
    popen = subprocess.Popen(
        [PYTHON, "-m", "exporter.tap", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
         "--upstream", upstream, *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    assert popen.stderr is not None
    seen: list[str] = []
    started = time.monotonic()
    for line in iter(popen.stderr.readline, ""):  # until it listens, exits, or 20 s have passed
        seen.append(line)
        if listening := re.search(r"event=tap_listening proxy=(\S+) metrics=(\S+)", line):
            rest = threading.Thread(target=lambda: seen.append(popen.stderr.read() if popen.stderr else ""), daemon=True)
            rest.start()
            return CliTap(popen, listening.group(1), listening.group(2), seen, rest)
        if time.monotonic() - started > 20:
            break
    popen.kill()
    raise AssertionError(f"tap did not start: {''.join(seen)}{popen.stderr.read()}")


def spawn(args: list[str], n_ports: int, timeout: float = 20.0) -> Proc:
    """Start a process that prints `PORT <n>` (or the tap's `proxy=... metrics=...` line) when listening."""
    popen = subprocess.Popen(
        [PYTHON, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    ports: list[int] = []
    deadline = time.monotonic() + timeout
    assert popen.stdout is not None
    while len(ports) < n_ports:
        if time.monotonic() > deadline or popen.poll() is not None:
            popen.kill()
            raise RuntimeError(f"{args} did not start: {popen.stderr.read() if popen.stderr else ''}")
        line = popen.stdout.readline()
        if line.startswith("PORT "):
            ports.append(int(line.split()[1]))
    return Proc(popen, ports)


def spawn_upstream() -> Proc:
    return spawn([str(Path(__file__)), "upstream"], 1)


def spawn_recording_tap(upstream: str, slo: Path, record: Path, *extra: str) -> Proc:
    return spawn([str(Path(__file__)), "tap", "--upstream", upstream, "--slo", str(slo), "--record", str(record), *extra], 2)


async def _serve_upstream() -> None:
    runner, url = await start_app(TestUpstream().app())
    print(f"PORT {url.rsplit(':', 1)[1]}", flush=True)
    await _wait_for_sigterm()
    await runner.cleanup()


async def _serve_recording_tap(args: argparse.Namespace) -> None:
    """The real TapServer with an observer that keeps each request's record, dumped at exit."""
    from exporter.tap.classes import load_slo_config
    from exporter.tap.policy import RequestRecord
    from exporter.tap.server import TapServer
    from exporter.tap.settings import TapSettings

    records: list[dict[str, object]] = []

    def observe(r: RequestRecord) -> None:
        records.append({**asdict(r.timings), "request_id": r.request_id, "outcome": r.outcome, "good": r.good,
                        "slo_class": r.slo_class, "model": r.model, "streamed": r.streamed,
                        "usage_injected": r.usage_injected, "arrival": r.arrival})

    settings = TapSettings(args.upstream, inject_usage=not args.no_inject_usage)
    server = TapServer(settings, load_slo_config(args.slo), observer=observe, shutdown_timeout_s=2.0)
    await server.start(("127.0.0.1", 0), ("127.0.0.1", 0))
    assert server.proxy_address and server.metrics_address
    print(f"PORT {server.proxy_address.port}\nPORT {server.metrics_address.port}", flush=True)
    await _wait_for_sigterm()
    await server.stop()
    tmp = args.record.with_suffix(".tmp")
    tmp.write_text(json.dumps(records))
    os.replace(tmp, args.record)


async def _serve_simulator(argv: list[str]) -> None:
    """The project's simulator (simulator.api), with a hook that hashes what it writes per x-request-id.

    The no-usage view follows the OpenAI rule independently of the tap's code: without
    include_usage there is no empty-choices usage chunk and no `"usage":null` member.
    """
    from simulator import cliargs
    from simulator.api import SimulatorServer

    parser = argparse.ArgumentParser()
    cliargs.add_engine_arguments(parser)
    cliargs.add_fault_arguments(parser)
    args = parser.parse_args(argv)
    server = SimulatorServer(cliargs.engine_config(args), faults=cliargs.fault_state(args, time.time()))
    hashes: dict[str, tuple[Any, Any]] = {}
    original_write = web.StreamResponse.write

    async def hashing_write(self: web.StreamResponse, data: bytes) -> None:
        rid = self._req.headers.get("x-request-id", "") if self._req is not None else ""  # type: ignore[attr-defined]
        all_, view = hashes.setdefault(rid, (hashlib.sha256(), hashlib.sha256()))
        all_.update(data)
        if not (b'"choices":[]' in data and b'"usage":{' in data):
            view.update(data.replace(b',"usage":null}\n\n', b"}\n\n"))
        await original_write(self, data)

    web.StreamResponse.write = hashing_write  # type: ignore[method-assign]
    app = server.app()

    async def dump(request: web.Request) -> web.Response:
        return web.json_response({k: {"sha_all": a.hexdigest(), "sha_without_usage": v.hexdigest()} for k, (a, v) in hashes.items()})

    app.router.add_get("/_records", dump)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    await _wait_for_sigterm()
    await runner.cleanup()


async def _wait_for_sigterm() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def _script_main(argv: list[str]) -> None:
    if argv[:1] == ["simulator"]:
        asyncio.run(_serve_simulator(argv[1:]))
        return
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("upstream")
    t = sub.add_parser("tap")
    t.add_argument("--upstream", required=True)
    t.add_argument("--slo", type=Path, action="append", default=[])
    t.add_argument("--record", type=Path, required=True)
    t.add_argument("--no-inject-usage", action="store_true")
    args = p.parse_args(argv)
    if args.what == "upstream":
        asyncio.run(_serve_upstream())
        return
    from exporter.tap.cli import _runner  # the tap's event loop, as the CLI picks it (uvloop when installed)

    with _runner("auto") as runner:
        runner.run(_serve_recording_tap(args))


if __name__ == "__main__":
    _script_main(sys.argv[1:])
else:
    import pytest

    from tests.exporter.conftest import certs  # noqa: F401  (a CA and a server certificate, made with openssl)

    @pytest.fixture
    def stack():  # type: ignore[no-untyped-def]
        """`async with stack(slo=..., **TapSettings) as st:` an upstream and a tap, in-process."""
        return tap_stack

    @pytest.fixture
    def recording_tap():  # type: ignore[no-untyped-def]
        """`recording_tap(upstream_url, slo_path, record_path)`: a tap process that dumps per-request timings at exit."""
        return spawn_recording_tap

    @pytest.fixture
    def simulator_proc() -> Iterator[Proc]:
        """The project's simulator in its own process, hashing what it sends (see _serve_simulator)."""
        proc = spawn([str(Path(__file__)), "simulator", "--output-len-median", "16", "--seed", "7"], 1)
        try:
            yield proc
        finally:
            proc.stop()

    @pytest.fixture
    def upstream_proc() -> Iterator[Proc]:
        proc = spawn_upstream()
        try:
            yield proc
        finally:
            proc.stop()
