"""The relay while the admission gate reads an 8 MiB engine page, beside the same gate reading no large page (issue 34).

One upstream process (this module run as a script) streams chat chunks as bench.tap_stream_server does and answers
GET /metrics with a vLLM page (the simulator's, 64 LoRA adapters) that is either flooded with junk series of a
family the gate reads (`vllm:num_requests_running` with made-up model names, up to the gate's 8 MiB cap: the
parser's most expensive page, every line to be looked at) or left as it is (92 kB: "no page"). The tap runs with
`--admission` (polling every 0.25 s), a fresh upstream and tap for every turn; the paths take turns in rotating
order, ROUNDS each, and each figure is the median over a path's turns:

- relay: STREAMS keep-alive streams, a chunk every INTERVAL_MS each (bench.bench_tap's client): each chunk's delay
  from the upstream's write to the client's read, median and p99;
- throughput: THROUGHPUT_STREAMS streams whose chunks come back to back: chunks the client read per second.

Scheduling: the measured processes (client, upstream, every thread of the tap) ahead of the machine's other work
(bench.scheduling: SCHED_FIFO where permitted), as bench_tap does; the tap's page reader as the tap starts it (10 below the tap's nice,
exporter.tap.page_child). At the end of each turn the gate's llm_tap_admission_engine_readable says whether it
was still reading the page. The tap at OLD_COMMIT (its gate parsed in a thread of the tap itself) is not run
again: its figures with the 8 MiB page, as last measured beside these paths, are BEFORE.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench import bench_tap as bt
from bench.scheduling import ahead_of_neighbours
from bench.stream_client import KeepAliveStream
from bench.tap_stream_server import StreamProtocol, serve, spawn

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Goodput tap: relaying while the admission gate reads an 8 MiB engine page"
COMMAND = "python -m bench tap-admission-page"
OLD_COMMIT = "eb0b78e"  # the gate that parsed the page in a thread of the tap (asyncio.to_thread)
# OLD_COMMIT's tap with the 8 MiB page, recorded 2026-12-02 (BENCHMARKS.md, commit 7a4244e): each figure and its
# ratio to that run's "no page" path; then whether its gate still read the engine.
BEFORE = {"chunk_p50_ms": "1.08 ms, 5.49x", "chunk_p99_ms": "16.34 ms, 17.08x", "chunks_per_s": "12774 chunks/s, 0.73x"}
BEFORE_READ = "gate reading at the end of 4 of 4 turns"
RECORDED = "2026-12-02"
ADAPTERS = 64
PAGE_BYTES = 8 << 20  # exporter.tap.gate_poller.MAX_PAGE_BYTES: the largest page the gate reads
STREAMS = 64
THROUGHPUT_STREAMS = 16
ROUNDS = 4
START_S = 2.0  # after the tap listens: its first polls, the page reader's start
MEASURE_S = 3.0
HUNG: list[str] = []  # taps that did not exit on SIGTERM (killed), said in the rows
SCHEDULING = ["default scheduling"]  # how the measured processes were put ahead of the machine's other work
PATHS = ("8 MiB page", "no page")

NOTES = {
    SECTION: (
        f"The tap (`--admission`, polling every 0.25 s) in front of an upstream that streams chat chunks and serves a "
        f"vLLM page (the simulator's, {ADAPTERS} LoRA adapters) at /metrics: *ours* with {PAGE_BYTES >> 20} MiB of it "
        "(junk series of `vllm:num_requests_running`, a family the gate reads, with made-up model names: every line "
        "to be looked at), *peer* the same page without the junk (no large page). Relay: "
        f"{STREAMS} keep-alive streams, a chunk every {bt.INTERVAL_MS:g} ms each, each chunk's delay from the "
        f"upstream's write to the client's read; throughput: {THROUGHPUT_STREAMS} streams of back-to-back chunks, "
        f"chunks read per second. A fresh upstream and tap every turn, {START_S:g} s to start, {MEASURE_S:g} s "
        f"measured; the paths in rotating turns, {ROUNDS} each, the median over a path's turns. The client, upstream "
        "and every thread of the tap ahead of the shared 2-core machine's other work (SCHED_FIFO, as `python -m bench "
        "tap`); the tap's page reader as the tap starts it (nice 10, and reading pages for at most a fifth of a core). "
        f"*Before*: the tap at {OLD_COMMIT} (the page fetched on the loop, parsed in a thread of the tap), as "
        f"recorded {RECORDED} when it last ran beside these paths (not run again)."
    ),
}


# ------------------------------------------------------------------------------------------ the upstream
class PageUpstream(StreamProtocol):
    """bench.tap_stream_server's streams, `"interval_ms":N` in a request's body for its pace, and GET /metrics."""

    page_response = b""
    interval_re = re.compile(rb'"interval_ms":\s*(\d+)')

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data
        end = buf.find(b"\r\n\r\n")
        if end >= 0 and buf.startswith(b"GET /metrics "):
            self.buf = buf[end + 4:]
            assert self.transport is not None
            self.transport.write(self.page_response)
            return
        self.buf = b""
        super().data_received(buf)

    def stream(self, body: bytes) -> None:
        m = self.interval_re.search(body)
        if m:
            self.interval_s = int(m.group(1)) / 1000
        super().stream(body)


async def serve_page(page: Path) -> None:
    body = page.read_bytes()
    PageUpstream.page_response = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    await serve(lambda: PageUpstream(bt.INTERVAL_MS / 1000, bt.FIRST_MS / 1000, bt.TOKENS), 1024)


# ------------------------------------------------------------------------------------------ the pages
def pages(tmp: Path) -> dict[str, Path]:
    """The engine's page as it is, and flooded to just under PAGE_BYTES."""
    from bench.bench_hostile_page import flooded
    from bench.lora_pages import vllm_lora_page

    page = vllm_lora_page(ADAPTERS)
    line = len('vllm:num_requests_running{engine="0",model_name="j-000000"} 1\n')
    text = flooded(page, (PAGE_BYTES - len(page.encode()) - 4096) // line)
    assert len(text.encode()) <= PAGE_BYTES, len(text.encode())
    (tmp / "clean.prom").write_text(page)
    (tmp / "flood.prom").write_text(text)
    return {"clean": tmp / "clean.prom", "flood": tmp / "flood.prom"}


# ------------------------------------------------------------------------------------------ the processes
def upstream(page: Path) -> AbstractContextManager[tuple[int, int]]:
    """This module as the engine, serving `page` as its /metrics: (port, pid)."""
    return spawn("bench.bench_tap_admission_page", str(page))


@contextmanager
def tap(upstream_port: int) -> Iterator[tuple[int, str, int]]:
    """The tap of this tree with --admission: (proxy port, metrics URL, pid)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter.tap", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
         "--upstream", f"http://127.0.0.1:{upstream_port}", "--admission"],
        cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        m = bt.listening(proc, "the tap")
        threading_drain(proc)
        yield int(m.group(1)), m.group(2), proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            HUNG.append(str(proc.pid))
            print(f"  the tap (pid {proc.pid}) did not exit 15 s after SIGTERM (killed)", file=sys.stderr, flush=True)
            proc.kill()
            proc.wait()


def threading_drain(proc: subprocess.Popen[str]) -> None:
    """Keep reading the tap's stderr so that it never blocks on a full pipe."""
    import threading

    threading.Thread(target=lambda: [None for _ in proc.stderr or ()], daemon=True).start()


# ------------------------------------------------------------------------------------------ the clients
class Firehose(KeepAliveStream):
    """Back-to-back chunks (`"interval_ms":0`): counts the chunks read while measuring."""

    REQUEST = bt.REQUEST.replace(b'"stream":true', b'"stream":true,"interval_ms":0').replace(
        b"Content-Length: %d" % (len(bt.REQUEST.split(b"\r\n\r\n", 1)[1])),
        b"Content-Length: %d" % (len(bt.REQUEST.split(b"\r\n\r\n", 1)[1]) + len(b',"interval_ms":0')))

    def __init__(self, stop: asyncio.Event, counted: list[int], measuring: list[bool]) -> None:
        super().__init__(stop)
        self.counted, self.measuring = counted, measuring

    def request(self) -> bytes:
        return self.REQUEST

    def timed(self, t: int, now: int) -> None:
        if self.measuring[0]:
            self.counted[0] += 1


async def throughput(port: int) -> float:
    """Chunks read per second over MEASURE_S by THROUGHPUT_STREAMS streams of back-to-back chunks."""
    loop = asyncio.get_running_loop()
    stop, counted, measuring = asyncio.Event(), [0], [False]
    clients = [(await loop.create_connection(functools.partial(Firehose, stop, counted, measuring), "127.0.0.1", port))[1]
               for _ in range(THROUGHPUT_STREAMS)]
    await asyncio.sleep(0.5)
    measuring[0] = True
    t0 = time.perf_counter()
    await asyncio.sleep(MEASURE_S)
    measuring[0] = False
    rate = counted[0] / (time.perf_counter() - t0)
    stop.set()
    for c in clients:
        if c.transport is not None:
            c.transport.abort()
    await asyncio.sleep(0.3)
    return rate


# ------------------------------------------------------------------------------------------ the turns
@dataclass(frozen=True)
class Turn:
    chunk_p50_ms: float
    chunk_p99_ms: float
    chunks_per_s: float
    readable: bool


def readable(metrics_url: str) -> bool:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    return re.search(r"^llm_tap_admission_engine_readable 1(\.0)?$", text, re.M) is not None


def threads(pid: int) -> list[int]:
    """Every thread of the process: each is put ahead, not only the main."""
    return [int(t) for t in os.listdir(f"/proc/{pid}/task")]


def turn(page: Path) -> Turn:
    """One path's turn: a fresh upstream serving `page` and a fresh tap of this tree in front of it."""
    with upstream(page) as (up_port, up_pid), tap(up_port) as (port, metrics_url, tap_pid):
        time.sleep(START_S)
        with ahead_of_neighbours([up_pid, *threads(tap_pid)]) as how:
            SCHEDULING[0] = how
            bt.MEASURE_S = MEASURE_S
            samples, _ = asyncio.run(bt._drive(port, STREAMS, [tap_pid]))
            rate = asyncio.run(throughput(port))
        return Turn(bt._pct(samples.delay_ns, 0.5), bt._pct(samples.delay_ns, 0.99), rate, readable(metrics_url))


def measure(page_of: dict[str, Path]) -> dict[str, list[Turn]]:
    turns: dict[str, list[Turn]] = {p: [] for p in PATHS}
    for r in range(ROUNDS):
        for path in PATHS[r % len(PATHS):] + PATHS[:r % len(PATHS)]:
            t = turn(page_of[path])
            print(f"  round {r} {path}: {t}", file=sys.stderr, flush=True)
            turns[path].append(t)
    return turns


def median(turns: list[Turn], attr: str) -> float:
    return statistics.median(getattr(t, attr) for t in turns)


def rows(turns: dict[str, list[Turn]]) -> list:
    from bench.report import Row

    big, none = turns["8 MiB page"], turns["no page"]

    def times(attr: str, ours: list[Turn], peer: list[Turn]) -> str:
        return f"{median(ours, attr) / median(peer, attr):.2f}x"

    def read(ts: list[Turn]) -> str:
        return f"gate reading at the end of {sum(t.readable for t in ts)} of {len(ts)} turns"

    out = []
    for attr, what, unit in (("chunk_p50_ms", "relay: per-chunk delay, median", "ms"),
                             ("chunk_p99_ms", "relay: per-chunk delay, p99", "ms"),
                             ("chunks_per_s", "throughput: chunks relayed per second", "/s")):
        fmt = "{:.0f} chunks/s" if unit == "/s" else "{:.2f} ms"
        out.append(Row(SECTION, f"{what} ({STREAMS if unit == 'ms' else THROUGHPUT_STREAMS} streams); before "
                                f"({OLD_COMMIT}, recorded {RECORDED}) with the 8 MiB page: {BEFORE[attr]} no page",
                       fmt.format(median(big, attr)), fmt.format(median(none, attr)), times(attr, big, none), COMMAND))
    hung = f"; {len(HUNG)} taps did not exit within 15 s of SIGTERM (killed)" if HUNG else ""
    out.append(Row(SECTION, f"the gate still reading the engine (llm_tap_admission_engine_readable 1); "
                            f"measured at {SCHEDULING[0]}{hung}",
                   read(big), read(none), f"before ({OLD_COMMIT}, recorded {RECORDED}): {BEFORE_READ}", COMMAND))
    return out


def run() -> list:
    with tempfile.TemporaryDirectory(prefix="bench-admission-page-") as tmp:
        made = pages(Path(tmp))
        return rows(measure({"8 MiB page": made["flood"], "no page": made["clean"]}))


if __name__ == "__main__":
    asyncio.run(serve_page(Path(sys.argv[1])))
