"""`python -m bench tap` finishes every run: its scraper stops promptly when told, and a turn that goes
wrong becomes a row saying which turn and why, not an exception that loses the section."""

from __future__ import annotations

import asyncio
import http.server
import json
import math
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import bench_tap as bt
from bench.tap_stream_server import spawn

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def slow_metrics() -> Iterator[tuple[str, threading.Event]]:
    """A /metrics target slower than the scrape interval; it hangs for good once the event is set."""
    hang = threading.Event()

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(0.3)
            if hang.is_set():
                time.sleep(60)
            body = b"x 1\n" * 1000
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", hang
    finally:
        server.shutdown()
        server.server_close()


def _scraper(url: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bench.scraper", url, "50"], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def test_the_scraper_stops_within_a_second_of_stdin_closing_though_every_scrape_overruns_its_interval(
    slow_metrics: tuple[str, threading.Event],
) -> None:
    url, _ = slow_metrics
    proc = _scraper(url)
    time.sleep(1.5)  # every scrape takes 0.3 s against a 50 ms interval: the scraper is always behind
    t0 = time.monotonic()
    out, _ = proc.communicate(input="", timeout=5)
    assert time.monotonic() - t0 < 1.5
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["scrapes"] >= 2 and figures["failures"] == 0 and figures["bytes"] == 4000
    assert figures["p50_ms"] >= 250


def test_the_scraper_stops_with_a_scrape_in_flight_that_never_ends(slow_metrics: tuple[str, threading.Event]) -> None:
    url, hang = slow_metrics
    hang.set()
    proc = _scraper(url)
    time.sleep(1.0)  # the first scrape is now stuck for a minute
    t0 = time.monotonic()
    out, _ = proc.communicate(input="", timeout=5)
    assert time.monotonic() - t0 < 1.5
    assert json.loads(out.strip().splitlines()[-1])["scrapes"] == 0


def test_the_scraper_stops_on_sigterm_too(slow_metrics: tuple[str, threading.Event]) -> None:
    url, _ = slow_metrics
    proc = _scraper(url)
    time.sleep(0.5)
    proc.terminate()
    out, _ = proc.communicate(timeout=5)
    assert "scrapes" in json.loads(out.strip().splitlines()[-1])


def test_a_child_that_ignores_sigterm_is_killed(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import tap_stream_server

    monkeypatch.setattr(tap_stream_server, "STOP_S", 0.5)
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    t0 = time.monotonic()
    tap_stream_server.stop(proc)
    assert proc.returncode == -9 and time.monotonic() - t0 < 5


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_failed_turn_is_recorded_with_its_round_and_reason_and_the_other_paths_still_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bt, "ROUNDS", 2)
    monkeypatch.setattr(bt, "WARMUP_S", 0.2)
    monkeypatch.setattr(bt, "MEASURE_S", 0.5)
    with spawn("bench.tap_stream_server", "--interval-ms", "20", "--first-ms", "5", "--tokens", "10") as (port, pid):
        runs = bt._measure_turns({"direct": (port, []), "gone": (_closed_port(), [pid])}, 4, pid)
    assert all(t is not None and t.chunks > 0 for t in runs["direct"].turns)
    assert runs["gone"].turns == [None, None] and runs["gone"].cpu_us_per_chunk is None
    assert [w.split(":")[0] for w in runs["gone"].failures] == ["round 1", "round 2"]
    assert all("ConnectionRefused" in w for w in runs["gone"].failures)
    assert math.isnan(bt.added(runs, "gone", "chunk_p99_ms"))
    rows = bt.failure_rows(4, runs)
    assert [r.what for r in rows] == [f"FAILED turn: 4 streams, path gone, {w}" for w in runs["gone"].failures]
    assert all(r.ours == "failed" for r in rows)


def _figures(x: float) -> bt.PathFigures:
    return bt.PathFigures(x, x, x, x, 100, x)


def test_rows_are_written_when_every_turn_of_a_path_failed() -> None:
    names = ("direct", "tap", "tap-asyncio", "nginx", "floor", "tap-64", "tap-64-scraped", "tap-64-onloop-scraped")
    scrape = {"scrapes": 30.0, "p50_ms": 5.0, "p99_ms": 9.0, "bytes": 1.5e6}
    runs = {n: bt.PathRuns([_figures(1.0), _figures(2.0)], 40.0, [scrape, scrape]) for n in names}
    runs["tap-64-onloop-scraped"] = bt.PathRuns([None, None], None, [], ["round 1: TurnFailed: x", "round 2: y"])
    rows = bt.rows_from({64: runs})
    onloop = [r for r in rows if "as before" in r.what]
    assert onloop and all("n/a" in r.ratio for r in onloop if "scrapes per measured turn" not in r.what)
    failed = [r.what for r in rows if r.what.startswith("FAILED")]
    assert failed == ["FAILED turn: 64 streams, path tap-64-onloop-scraped, round 1: TurnFailed: x",
                      "FAILED turn: 64 streams, path tap-64-onloop-scraped, round 2: y"]
    tap_cpu = next(r for r in rows if r.what == "CPU per streamed chunk, 64 streams (µs)")
    assert (tap_cpu.ours, tap_cpu.ratio) == ("40.0", "1.00x")


def test_the_floor_relays_the_streams_byte_for_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bt, "WARMUP_S", 0.2)
    monkeypatch.setattr(bt, "MEASURE_S", 0.5)
    with spawn("bench.tap_stream_server", "--interval-ms", "20", "--first-ms", "5", "--tokens", "10") as (port, _), \
            bt._floor(port) as (floor_port, pids):
        samples, cpu_s = asyncio.run(bt._drive(floor_port, 4, pids))
    assert len(samples.delay_ns) > 50 and samples.ttft_ns and cpu_s > 0
