"""The goodput tap's cost on the stream it relays, next to nginx as a streaming reverse proxy.

One run, paths to the same upstream (bench.tap_stream_server, chunks at a fixed interval
with their send time embedded): direct, through the tap (`python -m exporter.tap`, the client
does not ask for usage, so the tap injects it and strips it again: its most expensive path),
and through nginx (Debian package, `proxy_buffering off; proxy_http_version 1.1;`, upstream
keep-alive, one worker like the tap's one process). At 64 and 256 concurrent streams it
measures TTFT and each chunk's delay from upstream write to client read; "added" is a path's
percentile minus the direct path's, so the client's and the upstream's own costs cancel. CPU
per streamed chunk is the proxy process's (all nginx processes') CPU time over the chunks
delivered in the measured window.

On a shared machine the neighbours' load drifts over seconds, by more than the sub-millisecond
differences measured here; so the paths take turns in short rounds (in a rotating order), each
round's figures are taken against the direct path's of the same round, and the median over the
rounds is reported, so drift falls on every path alike and one disturbed round decides nothing.
Each stream's first response is cut short by a different amount, so that the streams' request
turnovers are spread evenly over time instead of all falling in the same 100 ms every 3 s.

Scrapes: three more paths measure what serving /metrics costs the relay. A tap process with 64
models x 2 classes in its metrics (bench.tap_process: every series changes between two scrapes,
so every scrape renders the whole page, about 1.3 MB) is measured unscraped, and scraped every
SCRAPE_MS by a separate process (bench.scraper); a second such process renders the page as the
tap did before (prometheus_client.generate_latest, in one go, on the relaying loop), scraped alike.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import pwd
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.report import Row
from bench.scheduling import ahead_of_neighbours
from bench.stream_client import KeepAliveStream
from bench.tap_stream_server import STOP_S, spawn, stop

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Goodput tap: latency added to a stream, vs nginx"
NGINX = "/usr/sbin/nginx"
STREAM_COUNTS = (64, 256)
INTERVAL_MS = 100.0  # between chunks of one stream
FIRST_MS = 20.0  # upstream's time to first token
TOKENS = 30  # chunks per response
ROUNDS = 6  # turns each path takes, per stream count
WARMUP_S = 1.0  # per turn, before measuring
MEASURE_S = 2.0  # measured per turn: ROUNDS * MEASURE_S per path in all
COMMAND = "python -m bench tap"
SCRAPE_MS = 100.0
SCRAPED_MODELS = 64

NOTES: dict[str, str] = {}


# ----------------------------------------------------------------------------------------
# Client: one keep-alive connection per stream, timed in data_received
# ----------------------------------------------------------------------------------------
REQUEST_BODY = b'{"model":"bench","stream":true,"messages":[{"role":"user","content":"hi"}]%s}'


def _request(max_tokens: int | None = None) -> bytes:
    body = REQUEST_BODY % (b',"max_tokens":%d' % max_tokens if max_tokens else b"")
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


REQUEST = _request()


@dataclass
class Samples:
    measuring: bool = False
    ttft_ns: list[int] = field(default_factory=list)
    delay_ns: list[int] = field(default_factory=list)


class StreamClient(KeepAliveStream):
    """Sends a request, decodes the chunked SSE reply, records TTFT and per-chunk delay, repeats."""

    def __init__(self, samples: Samples, stop: asyncio.Event, first_tokens: int) -> None:
        super().__init__(stop)
        self.samples = samples
        self.first_request = _request(first_tokens)
        self.sent_ns = 0
        self.first_seen = False
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def request(self) -> bytes:
        self.first_seen = False
        request, self.first_request = self.first_request or REQUEST, b""
        self.sent_ns = time.monotonic_ns()
        return request

    def timed(self, t: int, now: int) -> None:
        s = self.samples
        if s.measuring:
            s.delay_ns.append(now - t)
            if not self.first_seen:
                s.ttft_ns.append(now - self.sent_ns)
        self.first_seen = True


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds used so far by `pids`, all their threads: the scheduler's nanosecond count
    (/proc/PID/task/TID/schedstat), where /proc/PID/stat's utime + stime move in 10 ms ticks,
    as coarse as a turn's whole difference between two proxies."""
    total = 0.0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # exited: its CPU is no longer the turn's
        for tid in tids:
            try:
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
            except (OSError, IndexError, ValueError):
                try:  # a kernel without schedstat: clock ticks
                    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
                    total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
                except (OSError, IndexError, ValueError):
                    continue
    return total


async def _drive(port: int, streams: int, cpu_pids: list[int]) -> tuple[Samples, float]:
    """One turn: `streams` keep-alive streams for WARMUP_S + MEASURE_S; the samples and the CPU seconds used."""
    loop = asyncio.get_running_loop()
    samples, stop = Samples(), asyncio.Event()
    clients: list[StreamClient] = []
    for i in range(streams):
        first_tokens = 1 + i * TOKENS // streams  # phases spread over one response's length
        _, client = await loop.create_connection(functools.partial(StreamClient, samples, stop, first_tokens), "127.0.0.1", port)
        clients.append(client)
        await asyncio.sleep(INTERVAL_MS / 1000 / streams)  # spread the starts over one interval
    await asyncio.sleep(WARMUP_S)
    cpu0 = _cpu_s(cpu_pids)
    samples.measuring = True
    await asyncio.sleep(MEASURE_S)
    samples.measuring = False
    cpu1 = _cpu_s(cpu_pids)
    stop.set()
    for c in clients:  # measured: hang up now rather than wait for every response to end
        if c.transport is not None:
            c.transport.abort()
    await asyncio.wait_for(asyncio.gather(*(c.closed for c in clients)), timeout=10)
    await asyncio.sleep(0.3)  # let the proxy and the upstream settle before the next turn
    return samples, cpu1 - cpu0


# ----------------------------------------------------------------------------------------
# Processes: upstream, tap, nginx
# ----------------------------------------------------------------------------------------
class TurnFailed(Exception):
    """One turn of one path went wrong (a child that would not stop, a proxy that died): the turn is
    reported as a row saying so, and the other turns still run."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _upstream() -> AbstractContextManager[tuple[int, int]]:
    return spawn("bench.tap_stream_server", "--interval-ms", str(INTERVAL_MS), "--first-ms", str(FIRST_MS),
                 "--tokens", str(TOKENS))


@contextmanager
def _tap(upstream_port: int, event_loop: str = "auto") -> Iterator[tuple[int, list[int]]]:
    """The tap of this checkout, on `event_loop`."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter.tap", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
         "--upstream", f"http://127.0.0.1:{upstream_port}", "--event-loop", event_loop],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the tap logs one line when listening, little after
            m = re.search(r"event=tap_listening proxy=http://127\.0\.0\.1:(\d+)", line)
            if m:
                break
        else:
            raise RuntimeError("the tap exited before listening")
        yield int(m.group(1)), [proc.pid]
    finally:
        stop(proc)


LISTENING = re.compile(r"event=tap_listening proxy=http://127\.0\.0\.1:(\d+) metrics=(\S+)")


def listening(proc: subprocess.Popen, what: str) -> re.Match:
    """The tap's `event=tap_listening` line, read from its stderr (its proxy port and metrics URL)."""
    assert proc.stderr is not None
    for line in proc.stderr:
        m = LISTENING.search(line)
        if m:
            return m
    raise RuntimeError(f"{what} exited before listening")


@contextmanager
def _tap_process(upstream_port: int, render: str) -> Iterator[tuple[int, list[int], str]]:
    """bench.tap_process: the tap with SCRAPED_MODELS models' series; (proxy port, [pid], metrics URL)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.tap_process", "--upstream", f"http://127.0.0.1:{upstream_port}",
         "--models", str(SCRAPED_MODELS), "--render", render],
        cwd=ROOT, stderr=subprocess.PIPE, text=True,
    )
    try:
        m = listening(proc, "bench.tap_process")
        yield int(m.group(1)), [proc.pid], m.group(2)
    finally:
        stop(proc)


@contextmanager
def _floor(upstream_port: int) -> Iterator[tuple[int, list[int]]]:
    """bench.relay_floor: a bare byte relay in Python on the tap's loop; (proxy port, [pid])."""
    proc = subprocess.Popen([sys.executable, "-m", "bench.relay_floor", "--upstream", str(upstream_port)], cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)
    try:
        yield int(listening(proc, "bench.relay_floor").group(1)), [proc.pid]
    finally:
        stop(proc)


@contextmanager
def _scraping(url: str | None) -> Iterator[tuple[list[int], dict[str, float]]]:
    """bench.scraper on `url` while the block runs (nothing when None); yields its pids and, once
    the block is over, its figures."""
    figures: dict[str, float] = {}
    if url is None:
        yield [], figures
        return
    proc = subprocess.Popen([sys.executable, "-m", "bench.scraper", url, str(SCRAPE_MS)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield [proc.pid], figures
    finally:
        try:
            out, _ = proc.communicate(input="", timeout=STOP_S)  # closing its stdin stops it
        except subprocess.TimeoutExpired:
            stop(proc)
            raise TurnFailed(f"bench.scraper did not stop within {STOP_S:g} s of its stdin closing") from None
        try:
            figures.update(json.loads(out.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            raise TurnFailed(f"bench.scraper exited {proc.returncode} without its figures") from None


NGINX_CONF = """\
{user}worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream engine {{
        server 127.0.0.1:{upstream};
        keepalive 1024;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 600s;
        }}
    }}
}}
"""


@contextmanager
def _nginx(upstream_port: int) -> Iterator[tuple[int, list[int]]]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-nginx-"))
    port = _free_port()
    user = f"user {pwd.getpwuid(os.geteuid()).pw_name};\n" if os.geteuid() == 0 else ""
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(user=user, tmp=tmp, upstream=upstream_port, port=port))
    proc = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")], stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nginx did not start: {(tmp / 'error.log').read_text(errors='replace')}") from None
                time.sleep(0.05)
        workers = [
            int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == proc.pid
        ]
        yield port, [proc.pid, *workers]
    finally:
        stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


# ----------------------------------------------------------------------------------------
# Measurements and rows
# ----------------------------------------------------------------------------------------
@dataclass
class PathFigures:
    ttft_p50_ms: float
    ttft_p99_ms: float
    chunk_p50_ms: float
    chunk_p99_ms: float
    chunks: int
    cpu_us_per_chunk: float | None


def _pct(values: list[int], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] / 1e6


SCHEDULING = ["default scheduling"]


def _figures(samples: Samples, cpu_s: float, proxied: bool) -> PathFigures:
    n = len(samples.delay_ns)
    return PathFigures(
        _pct(samples.ttft_ns, 0.5), _pct(samples.ttft_ns, 0.99), _pct(samples.delay_ns, 0.5), _pct(samples.delay_ns, 0.99),
        n, cpu_s / n * 1e6 if proxied else None,
    )


@dataclass
class PathRuns:
    """One path's figures for each round (None where its turn failed), its CPU per chunk over the turns
    that completed, its scraper's figures per turn, and why each failed turn failed."""

    turns: list[PathFigures | None]
    cpu_us_per_chunk: float | None
    scrapes: list[dict[str, float]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def median(self, attr: str) -> float:
        return _median([getattr(f, attr) for f in self.turns if f is not None])

    def scrape_median(self, key: str) -> float:
        return _median([s[key] for s in self.scrapes])


def _median(values: list[float]) -> float:
    """The median, NaN when there is nothing to take it of (every turn failed): a row says n/a, none is lost."""
    return statistics.median(values) if values else math.nan


Path_ = tuple[int, list[int]]  # a path's port and the pids of its proxy processes ([] for direct)
TURN_S = WARMUP_S + MEASURE_S + 30.0  # beyond this a turn is called off (a hung connect or close)


def _turn(port: int, streams: int, pids: list[int], upstream_pid: int, url: str | None) -> tuple[PathFigures, float,
                                                                                                int, dict[str, float]]:
    """One path's turn: its figures, CPU seconds, chunks and scraper figures; TurnFailed when it went wrong."""
    try:
        with _scraping(url) as (scraper, figures):
            with ahead_of_neighbours([upstream_pid, *pids, *scraper]) as how:
                SCHEDULING[0] = how
                samples, cpu_s = asyncio.run(asyncio.wait_for(_drive(port, streams, pids), TURN_S))
    except TurnFailed:
        raise
    except Exception as e:  # whatever went wrong, the turn says so and the others run
        raise TurnFailed(f"{type(e).__name__}: {str(e)[:200]}") from e
    if not samples.delay_ns:
        raise TurnFailed("no chunk arrived in the measured window")
    return _figures(samples, cpu_s, bool(pids)), cpu_s, len(samples.delay_ns), figures


def _measure_turns(
    paths: dict[str, Path_], streams: int, upstream_pid: int, scraped: dict[str, str] | None = None,
) -> dict[str, PathRuns]:
    """ROUNDS turns per path, in an order that rotates each round; the paths in `scraped` have
    their /metrics (the URL given) scraped every SCRAPE_MS during their turns. A turn that fails
    is recorded as such (PathRuns.failures) and the others still run."""
    scraped = scraped or {}
    runs = {name: PathRuns([None] * ROUNDS, None) for name in paths}
    cpu = dict.fromkeys(paths, 0.0)
    chunks = dict.fromkeys(paths, 0)
    names = list(paths)
    for r in range(ROUNDS):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            port, pids = paths[name]
            try:
                figs, cpu_s, n, figures = _turn(port, streams, pids, upstream_pid, scraped.get(name))
            except TurnFailed as e:
                runs[name].failures.append(f"round {r + 1}: {e}")
                print(f"  {streams} streams, {name}, round {r + 1} failed: {e}", file=sys.stderr, flush=True)
                continue
            runs[name].turns[r] = figs
            if figures:
                runs[name].scrapes.append(figures)
            cpu[name] += cpu_s
            chunks[name] += n
    for name in names:
        if paths[name][1] and chunks[name]:
            runs[name].cpu_us_per_chunk = cpu[name] / chunks[name] * 1e6
    return runs


def added(runs: dict[str, PathRuns], name: str, attr: str) -> float:
    """The median over the rounds of (this path's figure - the direct path's in the same round):
    a round disturbed by a neighbour weighs no more than any other. Rounds where either turn failed
    are left out; NaN when none is left."""
    return _median([
        getattr(p, attr) - getattr(d, attr)
        for p, d in zip(runs[name].turns, runs["direct"].turns, strict=True) if p is not None and d is not None
    ])


def _ratio(ours: float | None, peer: float | None) -> str:
    if ours is None or peer is None or math.isnan(ours) or math.isnan(peer):
        return "n/a (no turn completed)"
    return f"{ours / peer:.2f}x" if peer > 0 else "n/a (peer added nothing measurable)"


def measure_all() -> dict[int, dict[str, PathRuns]]:
    results: dict[int, dict[str, PathRuns]] = {}
    with _upstream() as (upstream_port, upstream_pid), _tap(upstream_port) as tap, \
            _tap(upstream_port, "asyncio") as tap_asyncio, _nginx(upstream_port) as nginx, \
            _tap_process(upstream_port, "sliced") as (port64, pids64, url64), \
            _tap_process(upstream_port, "onloop") as (port_old, pids_old, url_old), _floor(upstream_port) as floor:
        paths: dict[str, Path_] = {
            "direct": (upstream_port, []), "tap": tap, "tap-asyncio": tap_asyncio, "nginx": nginx, "floor": floor,
            "tap-64": (port64, pids64), "tap-64-scraped": (port64, pids64), "tap-64-onloop-scraped": (port_old, pids_old),
        }
        scraped = {"tap-64-scraped": url64, "tap-64-onloop-scraped": url_old}
        for streams in STREAM_COUNTS:
            results[streams] = runs = _measure_turns(paths, streams, upstream_pid, scraped)
            for name, r in runs.items():
                print(f"  {streams} streams, {name}: {r}", file=sys.stderr, flush=True)
    return results


def rows_from(results: dict[int, dict[str, PathRuns]]) -> list[Row]:
    rows: list[Row] = []
    for streams, runs in results.items():
        for label, attr in (
            ("TTFT p50", "ttft_p50_ms"), ("TTFT p99", "ttft_p99_ms"),
            ("per-chunk p50", "chunk_p50_ms"), ("per-chunk p99", "chunk_p99_ms"),
        ):
            ours, peer = added(runs, "tap", attr), added(runs, "nginx", attr)
            rows.append(Row(SECTION, f"added {label}, {streams} streams (ms; direct {_fig(runs['direct'].median(attr))})",
                            _fig(ours), _fig(peer), _ratio(ours, peer), COMMAND))
        ours, peer = added(runs, "tap-asyncio", "chunk_p99_ms"), added(runs, "nginx", "chunk_p99_ms")
        rows.append(Row(SECTION, f"added per-chunk p99, {streams} streams, tap on asyncio's own loop (ms)",
                        _fig(ours), _fig(peer), _ratio(ours, peer), COMMAND))
        ours, peer = added(runs, "floor", "chunk_p99_ms"), added(runs, "nginx", "chunk_p99_ms")
        rows.append(Row(SECTION, f"added per-chunk p99, {streams} streams, {FLOOR} (ms)", _fig(ours), _fig(peer),
                        _ratio(ours, peer), COMMAND))
        ngx = runs["nginx"].cpu_us_per_chunk
        for name, key in (("", "tap"), (", tap on asyncio's own loop", "tap-asyncio"), (f", {FLOOR}", "floor")):
            cpu = runs[key].cpu_us_per_chunk
            rows.append(Row(SECTION, f"CPU per streamed chunk, {streams} streams{name} (µs)",
                            _fig(cpu, 1), _fig(ngx, 1), _ratio(cpu, ngx), COMMAND))
        rows += _scrape_rows(streams, runs)
        rows += failure_rows(streams, runs)
    return rows


FLOOR = "the floor: a bare byte relay in Python on the same loop (bench.relay_floor; no parsing, timing or counters)"


def _fig(x: float | None, digits: int = 3) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def failure_rows(streams: int, runs: dict[str, PathRuns]) -> list[Row]:
    """One row per failed turn: which path, which round, and why (its figures are left out of the medians)."""
    return [
        Row(SECTION, f"FAILED turn: {streams} streams, path {name}, {why}", "failed", "-", "n/a", COMMAND)
        for name, r in runs.items() for why in r.failures
    ]


SCRAPE_PATHS = (
    ("tap-64", f"{SCRAPED_MODELS} models' series, not scraped"),
    ("tap-64-scraped", f"{SCRAPED_MODELS} models' series, /metrics scraped every {SCRAPE_MS:g} ms"),
    ("tap-64-onloop-scraped", f"{SCRAPED_MODELS} models' series, scraped every {SCRAPE_MS:g} ms, page rendered "
                              "in one go on the loop as before (prometheus_client)"),
)


def _scrape_rows(streams: int, runs: dict[str, PathRuns]) -> list[Row]:
    """What scraping costs the relay: the 64-model taps against nginx, and the scrapes as seen by the scraper."""
    rows: list[Row] = []
    ngx_cpu = runs["nginx"].cpu_us_per_chunk
    for key, what in SCRAPE_PATHS:
        for label, attr in (("TTFT p99", "ttft_p99_ms"), ("per-chunk p99", "chunk_p99_ms")):
            ours, peer = added(runs, key, attr), added(runs, "nginx", attr)
            rows.append(Row(SECTION, f"added {label}, {streams} streams, {what} (ms)", _fig(ours), _fig(peer),
                            _ratio(ours, peer), COMMAND))
        cpu = runs[key].cpu_us_per_chunk
        rows.append(Row(SECTION, f"CPU per streamed chunk, {streams} streams, {what} (µs)", _fig(cpu, 1),
                        _fig(ngx_cpu, 1), _ratio(cpu, ngx_cpu), COMMAND))
    new, old = runs["tap-64-scraped"], runs["tap-64-onloop-scraped"]
    for label, k in (("p50", "p50_ms"), ("p99", "p99_ms")):
        ours, peer = new.scrape_median(k), old.scrape_median(k)
        rows.append(Row(SECTION, f"/metrics scrape duration {label} while relaying {streams} streams (ms; ours: "
                                 f"sliced, peer: in one go as before; page {_fig(new.scrape_median('bytes') / 1e6, 2)} MB)",
                        _fig(ours, 1), _fig(peer, 1), _ratio(ours, peer), COMMAND))
    scrapes = _median([s["scrapes"] for s in new.scrapes]), _median([s["scrapes"] for s in old.scrapes])
    rows.append(Row(SECTION, f"/metrics scrapes per measured turn, {streams} streams (ours: sliced, peer: as before; "
                             f"{WARMUP_S + MEASURE_S:g} s at one per {SCRAPE_MS:g} ms is about "
                             f"{(WARMUP_S + MEASURE_S) * 1000 / SCRAPE_MS:.0f})",
                    _fig(scrapes[0], 0), _fig(scrapes[1], 0), _ratio(*scrapes), COMMAND))
    return rows


LAG_PEERS = (
    ("none", "an empty page: the floor of the machine and the loop"),
    ("sliced-onebuffer", "the same slices, the page written as one buffer"),
    ("thread-ours", "the same renderer in a thread"),
    ("thread-prom", "prometheus_client.generate_latest in a thread"),
    ("onloop", "prometheus_client.generate_latest on the loop, as before"),
)


def measure_render_lag() -> dict[str, dict[str, float]]:
    """bench.tap_render_lag in each mode, one after another, ahead of the neighbours (its scraper,
    started by it, inherits the scheduling)."""
    out: dict[str, dict[str, float]] = {}
    for mode in ("sliced", *(m for m, _ in LAG_PEERS)):
        try:
            with ahead_of_neighbours([]):
                proc = subprocess.run([sys.executable, "-m", "bench.tap_render_lag", mode], cwd=ROOT,
                                      capture_output=True, text=True, timeout=120, check=True)
            out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        except (subprocess.SubprocessError, OSError, ValueError, IndexError) as e:  # run() killed it on timeout
            LAG_FAILURES[mode] = f"{type(e).__name__}: {str(e)[:200]}"
            print(f"  render lag {mode} failed: {LAG_FAILURES[mode]}", file=sys.stderr, flush=True)
            continue
        print(f"  render lag {mode}: {out[mode]}", file=sys.stderr, flush=True)
    return out


LAG_FAILURES: dict[str, str] = {}  # render-lag modes that failed, and why


def lag_rows(lag: dict[str, dict[str, float]]) -> list[Row]:
    nothing = {"p99_ms": math.nan, "p999_ms": math.nan}
    ours = lag.get("sliced", nothing)
    rows = []
    for mode, what in LAG_PEERS:
        peer = lag.get(mode, nothing)
        rows.append(Row(
            SECTION, f"event-loop delay p99 / p99.9 of a 1 ms timer in a tap with {SCRAPED_MODELS} models' series, "
                     f"/metrics scraped every {SCRAPE_MS:g} ms (ms; ours: sliced, peer: {what}; ratio of p99.9)",
            f"{_fig(ours['p99_ms'], 2)} / {_fig(ours['p999_ms'], 2)}",
            f"{_fig(peer['p99_ms'], 2)} / {_fig(peer['p999_ms'], 2)}", _ratio(ours["p999_ms"], peer["p999_ms"]), COMMAND,
        ))
    rows += [Row(SECTION, f"FAILED render-lag run {mode}: {why}", "failed", "-", "n/a", COMMAND)
             for mode, why in LAG_FAILURES.items()]
    return rows


def run() -> list[Row]:
    if not Path(NGINX).exists():
        raise RuntimeError(f"{NGINX} is missing: run scripts/install-system-deps.sh (Debian package nginx)")
    lag = measure_render_lag()
    try:
        results = measure_all()
    except Exception as e:  # a process that would not start: say so in the section rather than lose it
        NOTES[SECTION] = f"The relay measurements did not run: {type(e).__name__}: {e}"
        return [Row(SECTION, f"FAILED: the relay measurements ({type(e).__name__}: {str(e)[:200]})", "failed", "-",
                    "n/a", COMMAND), *lag_rows(lag)]
    top = results[max(STREAM_COUNTS)]
    added_p99, nginx_p99 = added(top, "tap", "chunk_p99_ms"), added(top, "nginx", "chunk_p99_ms")
    NOTES[SECTION] = (
        f"Ours = the tap, peer = nginx. Upstream: {TOKENS} chunks per response every {INTERVAL_MS:g} ms after a "
        f"{FIRST_MS:g} ms first token, streams' phases spread over one response. The paths take {ROUNDS} turns each in "
        f"rotating order ({WARMUP_S:g} s warm-up, {MEASURE_S:g} s measured per turn); each added figure is the median "
        f"over the rounds of the path's percentile minus the direct path's in the same round, so that drifting load "
        f"on the shared machine falls on every path alike and one disturbed round does not decide a figure. The "
        f"client, the upstream and the proxy ran with {SCHEDULING[0]} so that neighbours weigh less. "
        f"Both proxies run as one process on the same terms: the tap is one Python process, nginx one worker "
        f"(worker_processes 1; its CPU figure counts master and worker), so neither gets the second core to itself. "
        f"CPU is the scheduler's nanosecond count of every thread of the proxy's processes over the measured window. "
        f"The floor rows are a bare byte relay in Python on the tap's loop (bench.relay_floor): what relaying costs "
        f"Python and the loop before any of the tap's own work, so the tap's figure minus the floor's is that work. "
        f"A turn that went wrong (a child that would not stop, a proxy that died) is a FAILED row naming its path, "
        f"round and reason, and is left out of the medians. "
        f"The client does not ask for usage, so the tap injects it and strips the extra event: its costliest path. "
        f"The tap runs on uvloop (its default when installed); rows marked so use asyncio's own loop. Targets at "
        f"{max(STREAM_COUNTS)} streams: added per-chunk p99 under 1 ms (measured {_fig(added_p99)} ms: "
        f"{'met' if added_p99 < 1.0 else 'NOT met'}) and within 2x nginx's ({_fig(nginx_p99)} ms: "
        f"{'met' if added_p99 <= 2 * max(nginx_p99, 0.0) else 'NOT met'}). "
        f"Scrapes: the rows naming {SCRAPED_MODELS} models' series are a tap process (bench.tap_process) whose "
        f"metrics hold {SCRAPED_MODELS} models x 2 classes, each series changed between two scrapes (so every "
        f"scrape renders the whole page), measured unscraped and scraped every {SCRAPE_MS:g} ms by a separate "
        f"process (bench.scraper), and the same with the page rendered as before this change "
        f"(prometheus_client.generate_latest in one go on the relaying loop). At {max(STREAM_COUNTS)} streams, "
        f"scraped: added per-chunk p99 {_fig(added(top, 'tap-64-scraped', 'chunk_p99_ms'))} ms, unscraped "
        f"{_fig(added(top, 'tap-64', 'chunk_p99_ms'))} ms, rendered as before "
        f"{_fig(added(top, 'tap-64-onloop-scraped', 'chunk_p99_ms'))} ms. The event-loop delay rows "
        f"(bench.tap_render_lag) compare ways of rendering that page in one tap process, by how late a 1 ms timer "
        f"on its loop runs while it is scraped: a thread does not take the rendering off the loop's path, since "
        f"the thread holds the GIL while it formats (up to the 5 ms switch interval at a time)."
    )
    return rows_from(results) + lag_rows(lag)


if __name__ == "__main__":
    for row in run():
        print(row)
    print(NOTES[SECTION])
