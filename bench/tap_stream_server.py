"""`python -m bench.tap_stream_server`: an engine stand-in that streams chat chunks at a fixed interval.

Every chunk carries `"t":<CLOCK_MONOTONIC ns>` read just before it is written, so a client on
the same machine measures each chunk's delay through whatever sits in between (nothing, the
tap, nginx). Plain asyncio protocol, HTTP/1.1 keep-alive, chunked SSE, no framework: the
server should cost as little as possible so that the proxies' cost is what differs. Streams
tick at the phase their requests arrived at (clients spread their starts). Prints the port
on stdout once listening; stops on SIGTERM or when stdin closes.

Request: POST any path with a JSON body; `stream_options.include_usage` adds the usage chunk,
`"max_tokens":N` makes this response N chunks long instead of --tokens (clients use it to
spread their streams' phases). `GET /v1/models` lists the one model, `bench`, as an engine
does (the tap reads it to know which model names may be label values).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)
ROLE = b'data: {"id":"b","object":"chat.completion.chunk","model":"bench","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
TOKEN = b'data: {"id":"b","object":"chat.completion.chunk","model":"bench","choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}],"t":%d}\n\n'
USAGE = b'data: {"id":"b","object":"chat.completion.chunk","model":"bench","choices":[],"usage":{"prompt_tokens":8,"completion_tokens":%d,"total_tokens":%d}}\n\n'
DONE = b"data: [DONE]\n\n"
MODELS = b'{"object":"list","data":[{"id":"bench","object":"model","owned_by":"bench"}]}'
MODELS_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(MODELS), MODELS)
_MAX_TOKENS = re.compile(rb'"max_tokens":\s*(\d+)')


def chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class StreamProtocol(asyncio.Protocol):
    def __init__(self, interval_s: float, first_s: float, tokens: int) -> None:
        self.interval_s, self.first_s, self.tokens = interval_s, first_s, tokens
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buf[:end].lower()
        length = 0
        for line in head.split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        if len(self.buf) < end + 4 + length:
            return
        body = self.buf[end + 4 : end + 4 + length]
        self.buf = self.buf[end + 4 + length :]
        assert self.transport is not None
        if head.startswith(b"get /v1/models "):
            self.transport.write(MODELS_RESPONSE)
            return
        self.stream(body)

    def stream(self, body: bytes) -> None:
        """Start the answer to a request with this body (or its start, where max_tokens and include_usage are)."""
        usage = b'"include_usage":true' in body.replace(b" ", b"")
        m = _MAX_TOKENS.search(body)
        tokens = max(1, int(m.group(1))) if m else self.tokens
        assert self.transport is not None
        self.transport.write(HEAD + chunk(ROLE))
        self.timer = asyncio.get_running_loop().call_later(self.first_s, self.tick, 0, usage, tokens)

    def tick(self, sent: int, usage: bool, tokens: int) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        transport.write(chunk(TOKEN % time.monotonic_ns()))
        sent += 1
        if sent < tokens:
            self.timer = asyncio.get_running_loop().call_later(self.interval_s, self.tick, sent, usage, tokens)
            return
        tail = (chunk(USAGE % (sent, sent + 8)) if usage else b"") + chunk(DONE) + b"0\r\n\r\n"
        transport.write(tail)
        self.timer = None


async def serve(protocol: Callable[[], asyncio.Protocol], backlog: int) -> None:
    """Serves `protocol` on a loopback port, prints the port on stdout, stops on SIGTERM or when stdin closes."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(protocol, "127.0.0.1", 0, backlog=backlog)
    print(server.sockets[0].getsockname()[1], flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), stop.set)
    try:
        await stop.wait()
    finally:
        server.close()


async def main(args: argparse.Namespace) -> None:
    await serve(lambda: StreamProtocol(args.interval_ms / 1000, args.first_ms / 1000, args.tokens), 1024)


@contextmanager
def spawn(module: str, *args: str) -> Iterator[tuple[int, int]]:
    """`python -m MODULE ARGS` from the checkout, a server that prints its port as `serve` does: (port, pid)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline()), proc.pid
    finally:
        stop(proc)


STOP_S = 10.0  # a child told to stop that has not within this is killed


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if `proc` has not exited within STOP_S; never raises (a bench must finish)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--interval-ms", type=float, default=50.0)
    p.add_argument("--first-ms", type=float, default=20.0)
    p.add_argument("--tokens", type=int, default=40)
    asyncio.run(main(p.parse_args()))
