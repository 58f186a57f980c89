"""The goodput tap under abuse: slowloris, a body of 1-byte chunks, many large uploads at once.

Every scenario runs the tap as a real process (`python -m exporter.tap`, default settings unless a
row says otherwise) in front of an engine stand-in that streams SSE token chunks at a steady pace,
each carrying its write time (bench.tap_stream_server's chunks; the upstream of bench.abuse_procs reads
request bodies of any size without copying them). Ours = the tap of this tree; peer = the tap at
OLD_COMMIT, the commit before the abuse limits, under the same load: its figures as BEFORE records them
(measured when that tree still ran beside ours; it is not run again).

1. Slowloris: TRICKLERS connections each send a request head one byte every 0.5-1 s (the head never
   ends) and reconnect whenever the tap closes them, while LEGIT_REQUESTS legitimate streamed requests
   start at an even pace over LEGIT_SPREAD_S, each on a new connection, each given LEGIT_TIMEOUT_S to
   arrive whole (status 200, every token, `[DONE]`, the chunked end). The old tap ran with an
   open-file soft limit of 1,024 (the issue's reproduction); the new one runs with its defaults and, again,
   with that 1,024 soft limit (it raises the limit to the hard limit itself).
2. 1-byte chunks: STREAMS keep-alive streams are relayed (a chunk every INTERVAL_MS each), and
   CONTROL_STREAMS go straight to the upstream (a stall of the whole machine shows on them). ROUNDS
   rounds, each: BASE_S the streams alone, then UPLOAD_WINDOW_S while one client uploads a chunked
   body (of up to UPLOAD_BODY_BYTES) as `1\\r\\nX\\r\\n` chunks, cut at the window's end. A chunk's delay
   is its arrival at the client minus its write time at the upstream; chunks are attributed to a
   phase by their write time, so a chunk held up by the upload counts against the upload even if it
   arrives after the window. The rise is taken per round (upload p99 minus the same round's p99
   alone) and the median of the rounds reported, so that a neighbour's burst on the shared machine
   decides no figure alone.
3. Memory: BIG_UPLOADS concurrent uploads of BIG_BODY_BYTES each (Content-Length, a JSON chat request
   with one large string, `stream: true`, so the tap parses the body and splices usage into it);
   the tap process's peak RSS is its VmHWM (and VmRSS polled every 20 ms).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import random
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.abuse_procs import Tap, client_runner, pct, raise_own_fd_limit, stream_request, tap_process, upstream
from bench.report import Row
from bench.slowloris import Fleet, read_chunked
from bench.stream_client import KeepAliveStream

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Tap under abuse"
COMMAND = "python -m bench tap-abuse"
OLD_COMMIT = "9090d4d"  # the tap before the abuse limits (connection cap, head deadline, sliced decoding, body cap)
OLD_NOFILE = 1024  # the issue's reproduction: the tap's open-file soft limit
RECORDED = "2026-12-01"  # when OLD_COMMIT's tap last ran beside ours (BENCHMARKS.md, commit 216f26f)

INTERVAL_MS = 100.0  # upstream: between two chunks of one stream
FIRST_MS = 20.0  # upstream: before the first token

# 1. Slowloris
TRICKLERS = 1000
TRICKLE_GAP_S = (0.5, 1.0)  # between two bytes of one trickling head
LEGIT_REQUESTS = 300
LEGIT_TOKENS = 10  # about 1 s per legitimate stream
LEGIT_START_S = 3.0  # after the tricklers started
LEGIT_SPREAD_S = 20.0  # the legitimate requests start evenly over this long (the head timeout is 10 s)
LEGIT_TIMEOUT_S = 10.0
# 2. 1-byte chunks
STREAMS = 64
STREAM_TOKENS = 30
CONTROL_STREAMS = 8  # straight to the upstream: a stall of the whole machine shows on them too, the tap's does not
WARMUP_S = 1.0
ROUNDS = 5  # each: the streams alone, then with the upload (a neighbour's burst decides no figure alone)
BASE_S = 2.0
UPLOAD_WINDOW_S = 3.0
SETTLE_S = 0.5  # after a round
UPLOAD_BODY_BYTES = 30_000_000
CATCH_UP_S = 20.0  # after the window: how long late chunks of the window are waited for
# 3. Memory
BIG_UPLOADS = 16
BIG_BODY_BYTES = 31 * 1024 * 1024  # under the tap's default --max-body-bytes (32 MiB)
RSS_TARGET_MB = 400

NOTES: dict[str, str] = {}


@dataclass(frozen=True)
class Before:
    """The tap at OLD_COMMIT under the same three scenarios, as last measured beside ours (RECORDED): each
    peer cell's text, and the figures a ratio is taken against."""

    slowloris_completed: str = "88/300 (29.3%) (failed: 212 status 502 (upstream unreachable))"
    slowloris_ok: int = 88
    slowloris_times: str = "0.93 / 0.93"
    slowloris_got: str = "no answer (held open); 0 reconnections; no such metric; 1,023 of 1024"
    added_p99_ms: float = 2573.5
    rises: str = "2,613.5, 2,573.5, 2,575.4, 2,573.5, 1,348.7"
    control_p99s: str = "0.2, 0.3, 0.4, 0.4, 0.3"
    others: str = "0, -0, 0, 0, 0"
    base_p99_ms: float = 2.7
    up_p99_ms: float = 2592.4
    up_p50_worst: str = "1,782.0 / 2,619.8"
    uploaded_cpu: str = "19 MB; 18.4 s"
    hwm_bytes: int = 1_056_000_000
    rss_before_bytes: int = 43_000_000
    memory_answers: str = "16 x 200"


BEFORE = Before()


def _before(text: str) -> str:
    """A peer cell: OLD_COMMIT's recorded figure, said to be one."""
    return f"{text} (before, {OLD_COMMIT}, recorded {RECORDED})"


# ----------------------------------------------------------------------------------------
# 1. Slowloris
# ----------------------------------------------------------------------------------------
_TRICKLE = b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n" + b"X-Trickle: 1\r\n" * 4096  # never ends


async def _legit(port: int) -> tuple[str, float]:
    """One legitimate streamed request on a new connection: ("ok", seconds) or (why it failed, seconds)."""
    t0 = time.monotonic()
    writer = None
    try:
        async with asyncio.timeout(LEGIT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(stream_request(LEGIT_TOKENS))
            head = await reader.readuntil(b"\r\n\r\n")
            status = head.split(b" ", 2)[1].decode()
            if status != "200":
                m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                text = (await reader.readexactly(int(m.group(1)))).decode(errors="replace") if m else ""
                why = text.strip().split(":")[0][:60]  # the tap's own errors say why in their first words
                return f"status {status}" + (f" ({why})" if why else ""), time.monotonic() - t0
            body = await read_chunked(reader)
            tokens = body.count(b'"t":')
            if tokens != LEGIT_TOKENS or b"data: [DONE]" not in body:
                return f"incomplete ({tokens} tokens)", time.monotonic() - t0
            return "ok", time.monotonic() - t0
    except TimeoutError:
        return "no whole answer within the timeout", time.monotonic() - t0
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        return f"connection failed ({type(e).__name__})", time.monotonic() - t0
    finally:
        if writer is not None:
            writer.transport.abort()


@dataclass
class SlowlorisResult:
    ok: int
    failures: collections.Counter[str]
    ok_seconds: list[float]
    fleet: Fleet
    refusals: dict[str, float]
    tap_fds_peak: int
    nofile: str
    wall_s: float

    def completed(self) -> str:
        return f"{self.ok}/{LEGIT_REQUESTS} ({100 * self.ok / LEGIT_REQUESTS:.1f}%)"


async def _slowloris_run(tap: Tap) -> SlowlorisResult:
    t0 = time.monotonic()
    fleet = Fleet(tap.port, _TRICKLE, TRICKLE_GAP_S, random.Random(1), reopen_s=0.05, retry_s=0.2)
    peak_fds = 0
    for i in range(0, TRICKLERS, 100):
        await asyncio.gather(*(fleet.open(slot) for slot in range(i, min(i + 100, TRICKLERS))))
        await asyncio.sleep(0.05)
    await asyncio.sleep(LEGIT_START_S - (time.monotonic() - t0))
    tasks = []
    start = time.monotonic()
    for i in range(LEGIT_REQUESTS):
        await asyncio.sleep(max(0.0, start + i * LEGIT_SPREAD_S / LEGIT_REQUESTS - time.monotonic()))
        tasks.append(asyncio.ensure_future(_legit(tap.port)))
        if i % 15 == 0:
            peak_fds = max(peak_fds, tap.fds())
    results = await asyncio.gather(*tasks)
    refusals = await asyncio.to_thread(tap.refusals)
    fleet.stop()
    ok = [s for why, s in results if why == "ok"]
    failures = collections.Counter(why for why, _ in results if why != "ok")
    return SlowlorisResult(len(ok), failures, ok, fleet, refusals, peak_fds, tap.nofile(),
                           time.monotonic() - t0)


def slowloris(upstream_port: int, nofile_soft: int | None) -> SlowlorisResult:
    with tap_process(upstream_port, nofile_soft) as tap, client_runner() as runner:
        r = runner.run(_slowloris_run(tap))
    print(f"  slowloris nofile={nofile_soft}: {r.completed()} ok, failures {dict(r.failures)}, "
          f"trickle answers {dict(r.fleet.answers)}, reopened {r.fleet.opened - TRICKLERS}, refusals {r.refusals}, "
          f"tap fds peak {r.tap_fds_peak} (limit {r.nofile}), {r.wall_s:.1f} s",
          file=sys.stderr, flush=True)
    return r


# ----------------------------------------------------------------------------------------
# 2. A body of 1-byte chunks next to relayed streams
# ----------------------------------------------------------------------------------------
@dataclass
class Phases:
    """Chunk delays by the phase their write time falls in (the upstream's clock, CLOCK_MONOTONIC)."""

    bounds: list[tuple[str, int, int]] = field(default_factory=list)  # (name, from ns, to ns)
    delays_ms: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))
    latest_t: int = 0

    worst: str = ""
    worst_ms: float = 0.0

    def add(self, t: int, now: int) -> None:
        self.latest_t = max(self.latest_t, t)
        for name, lo, hi in self.bounds:
            if lo <= t < hi:
                ms = (now - t) / 1e6
                self.delays_ms[name].append(ms)
                if name.startswith("upload") and ms > self.worst_ms:
                    self.worst_ms, self.worst = ms, f"{name}, {(t - lo) / 1e9:.2f} s in"
                return


class Stream(KeepAliveStream):
    """A keep-alive stream: one request after another, each chunk's delay recorded."""

    def __init__(self, phases: Phases, stop: asyncio.Event, first_tokens: int) -> None:
        super().__init__(stop)
        self.phases = phases
        self.first_tokens = first_tokens

    def request(self) -> bytes:
        request = stream_request(self.first_tokens or STREAM_TOKENS)
        self.first_tokens = 0
        return request

    def timed(self, t: int, now: int) -> None:
        self.phases.add(t, now)


async def _chunk_upload(port: int, stop: asyncio.Event, sent: list[int]) -> str:
    """Upload a body of UPLOAD_BODY_BYTES as 1-byte chunks until done or `stop`; the answer's status or why none."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    prefix = b'{"model":"bench","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"'
    suffix = b'"}]}'
    writer.write(b"".join(b"1\r\n%c\r\n" % c for c in prefix))
    block = b"1\r\nX\r\n" * 10_000  # 10,000 body bytes, 60,000 wire bytes
    payload = len(prefix)
    answer = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
    try:
        while not stop.is_set() and not answer.done():
            n = min(10_000, UPLOAD_BODY_BYTES - len(suffix) - payload)
            if n <= 0:
                writer.write(b"".join(b"1\r\n%c\r\n" % c for c in suffix) + b"0\r\n\r\n")
                await writer.drain()
                break
            writer.write(block if n == 10_000 else block[: 6 * n])
            payload += n
            sent[0] = payload
            await writer.drain()
        if answer.done() or not stop.is_set():
            head = await asyncio.wait_for(answer, 30)
            return head.split(b" ", 2)[1].decode()
        return "none yet (cut at the window's end)"
    except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
        return f"connection failed ({type(e).__name__})"
    finally:
        answer.cancel()
        writer.transport.abort()


@dataclass
class ChunksResult:
    """Per round: the streams' per-chunk p99 alone and during the upload (ms); pooled figures over all rounds;
    the control streams' p99 and the neighbours' CPU share in each upload window."""

    base_p99s: list[float]
    up_p99s: list[float]
    base_p99: float
    up_p99: float
    up_p50: float
    up_max: float
    worst_at: str  # where in its phase the worst upload-phase chunk was written
    uploaded: int  # body bytes written by the uploads, all rounds
    statuses: list[str]
    caught_up: bool
    cpu_s: float  # the tap's, from each upload's start until the streams caught up, all rounds
    others: list[float]  # the machine's CPU time used by processes other than the bench's, each upload window (%)
    control_p99s: list[float]  # the control streams' (no tap) per-chunk p99 during each upload window

    @property
    def rises(self) -> list[float]:
        return [u - b for b, u in zip(self.base_p99s, self.up_p99s, strict=True)]

    @property
    def added_p99(self) -> float:
        return statistics.median(self.rises)


def _ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _cpu_s(pid: int) -> float:
    return _ticks(pid) / os.sysconf("SC_CLK_TCK")


def _others_ticks(pids: list[int]) -> tuple[int, int]:
    """(CPU ticks used by every process but `pids`, all CPU ticks) of the whole machine so far."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(v[:8])  # guest time is already counted in user
    return total - v[3] - v[4] - sum(_ticks(p) for p in pids), total


def _pct_of(a: tuple[int, int], b: tuple[int, int]) -> float:
    return 100 * (b[0] - a[0]) / max(1, b[1] - a[1])


async def _chunks_run(tap: Tap, upstream: tuple[int, int]) -> ChunksResult:
    ours = [tap.pid, upstream[1], os.getpid()]
    loop = asyncio.get_running_loop()
    phases, stop = Phases(), asyncio.Event()
    control = Phases(bounds=phases.bounds)  # streams straight to the upstream, in the same phases
    streams = []
    for i in range(STREAMS + CONTROL_STREAMS):
        first = 1 + i * STREAM_TOKENS // STREAMS % STREAM_TOKENS  # request turnovers spread over one response
        to, port = (phases, tap.port) if i < STREAMS else (control, upstream[0])
        _, s = await loop.create_connection(functools.partial(Stream, to, stop, first), "127.0.0.1", port)
        streams.append(s)
        await asyncio.sleep(INTERVAL_MS / 1000 / STREAMS)
    await asyncio.sleep(WARMUP_S)
    uploaded, statuses, cpu_s, caught_up, others = 0, [], 0.0, True, []
    for r in range(ROUNDS):
        t = time.monotonic_ns()
        phases.bounds.append((f"base{r}", t, t + int(BASE_S * 1e9)))
        await asyncio.sleep(BASE_S)
        up_stop, sent = asyncio.Event(), [0]
        t = time.monotonic_ns()
        cpu0, ticks0 = _cpu_s(tap.pid), _others_ticks(ours)
        phases.bounds.append((f"upload{r}", t, t + int(UPLOAD_WINDOW_S * 1e9)))
        upload = asyncio.ensure_future(_chunk_upload(tap.port, up_stop, sent))
        await asyncio.sleep(UPLOAD_WINDOW_S)
        end = time.monotonic_ns()
        others.append(_pct_of(ticks0, _others_ticks(ours)))
        uploaded += sent[0]
        up_stop.set()
        statuses.append(await upload)
        # Chunks written in the window may still be on their way (held up by the upload): wait for them.
        deadline = time.monotonic() + CATCH_UP_S
        while phases.latest_t < end and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        caught_up = caught_up and phases.latest_t >= end
        cpu_s += _cpu_s(tap.pid) - cpu0
        await asyncio.sleep(SETTLE_S)
    stop.set()
    for s in streams:
        if s.transport is not None:
            s.transport.abort()
    d, c = phases.delays_ms, control.delays_ms
    base = [x for r in range(ROUNDS) for x in d[f"base{r}"]]
    up = [x for r in range(ROUNDS) for x in d[f"upload{r}"]]
    return ChunksResult(
        [pct(d[f"base{r}"], 0.99) for r in range(ROUNDS)], [pct(d[f"upload{r}"], 0.99) for r in range(ROUNDS)],
        pct(base, 0.99), pct(up, 0.99), pct(up, 0.5), max(up, default=float("nan")), phases.worst,
        uploaded, statuses, caught_up, cpu_s, others, [pct(c[f"upload{r}"], 0.99) for r in range(ROUNDS)],
    )


def one_byte_chunks(upstream: tuple[int, int]) -> ChunksResult:
    with tap_process(upstream[0]) as tap, client_runner() as runner:
        r = runner.run(_chunks_run(tap, upstream))
    print(f"  1-byte chunks: {r}", file=sys.stderr, flush=True)
    return r


# ----------------------------------------------------------------------------------------
# 3. Many large uploads at once
# ----------------------------------------------------------------------------------------
def _big_body() -> bytes:
    prefix = b'{"model":"bench","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"'
    suffix = b'"}]}'
    return prefix + b"A" * (BIG_BODY_BYTES - len(prefix) - len(suffix)) + suffix


async def _big_upload(port: int, body: bytes) -> str:
    """Upload `body` (Content-Length); the answer's status, once the whole answer has arrived."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def answer() -> str:
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1].decode()
        m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        if m:
            await reader.readexactly(int(m.group(1)))
        elif b"chunked" in head.lower():
            await read_chunked(reader)
        return status

    got = asyncio.ensure_future(answer())
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        view = memoryview(body)
        for off in range(0, len(body), 256 * 1024):
            if got.done():
                break  # answered before the body was sent: a refusal
            writer.write(view[off : off + 256 * 1024])
            await writer.drain()
    except OSError:
        pass  # the answer says why
    try:
        return await asyncio.wait_for(got, 60)
    except (OSError, asyncio.IncompleteReadError, TimeoutError) as e:
        return f"connection failed ({type(e).__name__})"
    finally:
        writer.transport.abort()


@dataclass
class MemoryResult:
    rss_before: int
    peak_polled: int
    hwm: int
    statuses: collections.Counter[str]
    wall_s: float


async def _memory_run(tap: Tap) -> MemoryResult:
    body = _big_body()
    before = tap.status("VmRSS")
    peak = [before]
    done = asyncio.Event()

    async def poll() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tap.status("VmRSS"))
            await asyncio.sleep(0.02)

    poller = asyncio.ensure_future(poll())
    t0 = time.monotonic()
    statuses = await asyncio.gather(*(_big_upload(tap.port, body) for _ in range(BIG_UPLOADS)))
    wall = time.monotonic() - t0
    await asyncio.sleep(0.3)
    done.set()
    await poller
    return MemoryResult(before, peak[0], tap.status("VmHWM"), collections.Counter(statuses), wall)


def memory(upstream_port: int) -> MemoryResult:
    with tap_process(upstream_port) as tap, client_runner() as runner:
        r = runner.run(_memory_run(tap))
    print(f"  memory: {r}", file=sys.stderr, flush=True)
    return r


# ----------------------------------------------------------------------------------------
# Rows
# ----------------------------------------------------------------------------------------
def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def _statuses(c: collections.Counter[str]) -> str:
    return ", ".join(f"{n} x {s}" for s, n in sorted(c.items()))


def _failures(r: SlowlorisResult) -> str:
    return "" if not r.failures else " (failed: " + "; ".join(f"{n} {why}" for why, n in r.failures.most_common()) + ")"


def _list(values: list[float], digits: int = 1) -> str:
    return ", ".join(f"{v:,.{digits}f}" for v in values)


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def run() -> list[Row]:
    raise_own_fd_limit(TRICKLERS + LEGIT_REQUESTS + 200)
    t0 = time.monotonic()
    with upstream(INTERVAL_MS, FIRST_MS) as (up, up_pid):
        sl_new = slowloris(up, None)
        sl_new_1024 = slowloris(up, OLD_NOFILE)
        ch_new = one_byte_chunks((up, up_pid))
        mem_new = memory(up)
    wall = time.monotonic() - t0
    rows = _slowloris_rows(sl_new, sl_new_1024) + _chunk_rows(ch_new) + _memory_rows(mem_new)
    NOTES[SECTION] = _notes(ch_new, wall)
    return rows


def _slowloris_rows(sl_new: SlowlorisResult, sl_new_1024: SlowlorisResult) -> list[Row]:
    need = -(-LEGIT_REQUESTS * 99 // 100)
    return [
        Row(SECTION, f"slowloris: legitimate streams arrived whole, {TRICKLERS:,} trickling connections (target at least "
            f"99%: {need} of {LEGIT_REQUESTS}); ours with default settings, peer with a {OLD_NOFILE:,}-fd soft limit",
            sl_new.completed() + _failures(sl_new), _before(BEFORE.slowloris_completed),
            f"target {_met(sl_new.ok >= need)}", COMMAND),
        Row(SECTION, f"slowloris: the same, both started with a {OLD_NOFILE:,}-fd soft limit (ours raises it to the hard "
            f"limit, {sl_new_1024.nofile}, and had {sl_new_1024.tap_fds_peak:,} descriptors open at peak)",
            sl_new_1024.completed() + _failures(sl_new_1024), _before(BEFORE.slowloris_completed),
            f"target {_met(sl_new_1024.ok >= need)}", COMMAND),
        Row(SECTION, "slowloris: legitimate stream's whole time p50 / p99, the completed ones (s; the stream itself "
            f"takes {(FIRST_MS + (LEGIT_TOKENS - 1) * INTERVAL_MS) / 1000:.2f})",
            f"{pct(sl_new.ok_seconds, 0.5):.2f} / {pct(sl_new.ok_seconds, 0.99):.2f}",
            _before(BEFORE.slowloris_times),
            "n/a", COMMAND),
        Row(SECTION, "slowloris: what the trickling connections got (answers; reconnections; the tap's own count); "
            "the tap's open descriptors at peak",
            f"{_statuses(sl_new.fleet.answers)}; {sl_new.fleet.opened - TRICKLERS:,} reconnections; "
            f"llm_tap_refusals_total{{reason=\"head_timeout\"}} {sl_new.refusals.get('head_timeout', 0):,.0f}; "
            f"{sl_new.tap_fds_peak:,} of {sl_new.nofile}",
            _before(BEFORE.slowloris_got),
            "n/a", COMMAND),
    ]


def _chunk_rows(ch_new: ChunksResult) -> list[Row]:
    return [
        Row(SECTION, f"1-byte chunks: the upload's rise of the {STREAMS} relayed streams' per-chunk delay p99, median "
            f"of {ROUNDS} rounds (target under 50 ms; each round's rise in brackets)",
            f"{ch_new.added_p99:.1f} ms ({_list(ch_new.rises)})", _before(f"{BEFORE.added_p99_ms:,.1f} ms ({BEFORE.rises})"),
            f"target {_met(ch_new.added_p99 < 50)}", COMMAND),
        Row(SECTION, f"1-byte chunks, control: per-chunk delay p99 of {CONTROL_STREAMS} streams straight to the upstream "
            "(no tap) during each round's upload window (ms; a stall of the whole machine shows here too)",
            _list(ch_new.control_p99s), _before(BEFORE.control_p99s), "n/a", COMMAND),
        Row(SECTION, f"1-byte chunks: share of the machine's {os.cpu_count()} cores that other processes (the "
            "neighbours on the shared machine) used during each round's upload window (%)",
            _list(ch_new.others, 0), _before(BEFORE.others), "n/a", COMMAND),
        Row(SECTION, f"1-byte chunks: per-chunk delay p99, streams alone / during the upload, all {ROUNDS} rounds pooled "
            f"(ms)",
            f"{ch_new.base_p99:.1f} / {ch_new.up_p99:.1f}", _before(f"{BEFORE.base_p99_ms:.1f} / {BEFORE.up_p99_ms:,.1f}"),
            f"{BEFORE.up_p99_ms / ch_new.up_p99:,.0f}x less during the upload", COMMAND),
        Row(SECTION, "1-byte chunks: per-chunk delay during the upload, p50 / worst (ms)",
            f"{ch_new.up_p50:.1f} / {ch_new.up_max:,.1f}", _before(BEFORE.up_p50_worst), "n/a", COMMAND),
        Row(SECTION, f"1-byte chunks: body bytes the uploads wrote in {ROUNDS} windows of {UPLOAD_WINDOW_S:g} s (socket "
            f"buffers included; 6 wire bytes each); the tap's CPU seconds from each upload's start until the streams "
            f"caught up",
            f"{_mb(ch_new.uploaded)}; {ch_new.cpu_s:.1f} s", _before(BEFORE.uploaded_cpu), "n/a",
            COMMAND),
    ]


def _memory_rows(mem_new: MemoryResult) -> list[Row]:
    return [
        Row(SECTION, f"memory: the tap's peak RSS (VmHWM), {BIG_UPLOADS} concurrent uploads of "
            f"{BIG_BODY_BYTES / 2**20:g} MiB (target under {RSS_TARGET_MB} MB)",
            f"{_mb(mem_new.hwm)} (before: {_mb(mem_new.rss_before)})",
            _before(f"{_mb(BEFORE.hwm_bytes)} (before: {_mb(BEFORE.rss_before_bytes)})"),
            f"{BEFORE.hwm_bytes / mem_new.hwm:.1f}x less; target {_met(mem_new.hwm < RSS_TARGET_MB * 1e6)}", COMMAND),
        Row(SECTION, "memory: the uploads' answers", _statuses(mem_new.statuses), _before(BEFORE.memory_answers), "n/a",
            COMMAND),
    ]


def _notes(ch_new: ChunksResult, wall: float) -> str:
    full_s = UPLOAD_BODY_BYTES / max(1.0, ch_new.uploaded / (ROUNDS * UPLOAD_WINDOW_S))
    return (
        f"Ours = the tap of this tree, peer = the tap at {OLD_COMMIT} (before the connection cap, the head deadline, "
        f"sliced chunked-body decoding and the body-memory cap; its figures as recorded {RECORDED}, when it last ran "
        f"beside ours under the same load: that tree is not run again), each a `python -m exporter.tap` process with default "
        f"settings unless a row says otherwise, in front of an upstream streaming a token chunk every "
        f"{INTERVAL_MS:g} ms (after {FIRST_MS:g} ms). *Slowloris*: {TRICKLERS:,} connections each send a never-ending "
        f"request head one byte every {TRICKLE_GAP_S[0]:g}-{TRICKLE_GAP_S[1]:g} s and reconnect when closed; "
        f"{LEGIT_REQUESTS} legitimate streamed requests ({LEGIT_TOKENS} tokens, a new connection each) start evenly "
        f"over {LEGIT_SPREAD_S:g} s, each given {LEGIT_TIMEOUT_S:g} s to arrive whole (200, every token, `[DONE]`, the "
        f"chunked end). *1-byte chunks*: {STREAMS} keep-alive streams through the tap ({STREAM_TOKENS} tokens per "
        f"response) and {CONTROL_STREAMS} straight to the upstream as a control; {ROUNDS} rounds of {BASE_S:g} s "
        f"alone, then {UPLOAD_WINDOW_S:g} s while one client uploads a body of up to {UPLOAD_BODY_BYTES / 1e6:g} MB as "
        f"`1\\r\\nX\\r\\n` chunks as fast as the tap takes them, cut at the window's end (at the rate measured, the "
        f"whole body would take the tap about {full_s:.0f} s). A chunk's delay is from the upstream's write to the "
        f"client's read, attributed to the phase of its write time, so a chunk held up by the upload counts even when "
        f"it arrives after the window; the rise is each round's upload p99 minus the same round's p99 alone, and the "
        f"median over the rounds is the figure, so that a neighbour's burst on the shared machine decides nothing "
        f"alone (every round is listed, with the control and the neighbours' CPU share). *Memory*: {BIG_UPLOADS} "
        f"concurrent Content-Length uploads of a {BIG_BODY_BYTES / 2**20:g} MiB JSON chat request (`stream: true`, "
        f"one large string), peak RSS is the tap's VmHWM. Default scheduling on {os.cpu_count()} cores shared with "
        f"other work: real-time priority (bench.scheduling) would be throttled by the kernel for 50 ms of every "
        f"second once the tap decoding the upload keeps a core busy, which is a stall of its own. The whole run "
        f"took {wall:.0f} s."
    )


if __name__ == "__main__":
    for row in run():
        print(row)
    print(NOTES[SECTION])
