"""The processes of `python -m bench tap-abuse`: the upstream (bench.tap_stream_server's token stream, reading request
bodies of any size in passing, run as `python -m bench.abuse_procs upstream`) and the tap under test, of this
tree; and the client's small helpers (its event loop, a streamed request, a percentile)."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import resource
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.slowloris import refusals
from bench.tap_stream_server import StreamProtocol, serve, spawn

ROOT = Path(__file__).resolve().parent.parent


_MODELS = b'{"object":"list","data":[{"id":"bench","object":"model"}]}'


class Upstream(StreamProtocol):
    """Keeps only a request body's first 4 KiB (where the bench puts max_tokens), counts the rest."""

    def __init__(self, interval_s: float, first_s: float, tokens: int) -> None:
        super().__init__(interval_s, first_s, tokens)
        self.left = -1  # body bytes still to come; -1 while reading a head
        self.start = b""
        self.get = False

    def data_received(self, data: bytes) -> None:
        while data:
            if self.left < 0:
                self.buf += data
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head, data, self.buf = self.buf[:end].lower(), self.buf[end + 4 :], b""
                self.get = head.startswith(b"get ")
                self.left, self.start = 0, b""
                for line in head.split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        self.left = int(line.split(b":")[1])
            take = min(self.left, len(data))
            if len(self.start) < 4096:
                self.start += data[: min(take, 4096 - len(self.start))]
            self.left -= take
            data = data[take:]
            if self.left == 0:
                self.left = -1
                self._respond()

    def _respond(self) -> None:
        assert self.transport is not None
        if self.get:  # the tap reads GET /v1/models for its model label
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(_MODELS), _MODELS))
            return
        self.stream(self.start)


async def serve_upstream(args: argparse.Namespace) -> None:
    await serve(lambda: Upstream(args.interval_ms / 1000, args.first_ms / 1000, 10), 4096)


def raise_own_fd_limit(need: int) -> None:
    """This process's open-file soft limit up to its hard limit; RuntimeError when that is under `need`."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < need:
        raise RuntimeError(f"the open-file limit ({resource.getrlimit(resource.RLIMIT_NOFILE)}) is under the {need} "
                           "descriptors the run needs: raise the hard limit (ulimit -Hn)")


def upstream(interval_ms: float, first_ms: float) -> AbstractContextManager[tuple[int, int]]:
    """The upstream process (a chunk every `interval_ms` after `first_ms`): its port and pid."""
    return spawn("bench.abuse_procs", "upstream", "--interval-ms", str(interval_ms), "--first-ms", str(first_ms))


@dataclass
class Tap:
    popen: subprocess.Popen[str]
    port: int
    metrics_port: int

    @property
    def pid(self) -> int:
        return self.popen.pid

    def status(self, key: str) -> int:
        """A /proc/PID/status figure in bytes (VmRSS, VmHWM)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def fds(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.pid}/fd"))
        except OSError:
            return -1

    def nofile(self) -> str:
        for line in Path(f"/proc/{self.pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return line.split()[3]
        return "?"

    def refusals(self) -> dict[str, float]:
        """llm_tap_refusals_total by reason, from the tap's /metrics ({} when it has none)."""
        return refusals(f"http://127.0.0.1:{self.metrics_port}/metrics")


@contextmanager
def tap_process(upstream_port: int, nofile_soft: int | None = None) -> Iterator[Tap]:
    """A tap process of this tree, default settings. `nofile_soft`: start it with that open-file soft limit."""

    def limit() -> None:
        if nofile_soft is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile_soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter.tap", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
         "--upstream", f"http://127.0.0.1:{upstream_port}"],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=limit,
    )
    ports: list[int] = []
    listening = threading.Event()

    def drain() -> None:  # always read its stderr: a tap blocked on a full pipe would measure nothing
        assert proc.stderr is not None
        for line in proc.stderr:
            m = None if listening.is_set() else re.search(
                r"event=tap_listening proxy=http://127\.0\.0\.1:(\d+) metrics=http://127\.0\.0\.1:(\d+)", line)
            if m:
                ports.extend((int(m.group(1)), int(m.group(2))))
                listening.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        if not listening.wait(30):
            raise RuntimeError("the tap did not start listening")
        yield Tap(proc, ports[0], ports[1])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)


def client_runner() -> asyncio.Runner:
    try:
        import uvloop
    except ImportError:
        return asyncio.Runner()
    return asyncio.Runner(loop_factory=uvloop.new_event_loop)  # the client's own CPU weighs less on 2 cores


def stream_request(max_tokens: int, extra: bytes = b"") -> bytes:
    body = b'{"model":"bench","max_tokens":%d,"stream":true,"messages":[{"role":"user","content":"hi"}]}' % max_tokens
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n%s"
            b"Content-Length: %d\r\n\r\n%s" % (extra, len(body), body))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["upstream"])
    p.add_argument("--interval-ms", type=float, required=True)
    p.add_argument("--first-ms", type=float, required=True)
    asyncio.run(serve_upstream(p.parse_args()))
