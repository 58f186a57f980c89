"""`python -m bench.scraper URL INTERVAL_MS`: GET a /metrics page every INTERVAL_MS, as Prometheus would.

Its own process, so that reading the page costs neither the measured proxy nor the measuring
client. Scrapes start on a fixed grid (a slow one is not followed by a burst to catch up). Stops
when stdin closes (or is written to) or on SIGTERM, then prints one JSON line: scrapes, failures,
page bytes and scrape durations (request sent to last byte read).

The scrapes run in a daemon thread and the main thread only watches stdin, so the scraper stops
within one STDIN_POLL_S of being told to whatever its target does: a scrape still in flight then
(a target slower than the interval, or one that hangs) is abandoned, not waited for. Watching
stdin between scrapes instead never looks at it while every scrape overruns the interval.
"""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

STDIN_POLL_S = 0.05  # how often the main thread also checks for SIGTERM
SCRAPE_TIMEOUT_S = 10.0


@dataclass
class Scrapes:
    """What the scraping thread measured; read by the main thread once told to stop."""

    durations: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def summary(self) -> dict[str, float]:
        with self.lock:
            durations, sizes, failures = sorted(self.durations), list(self.sizes), self.failures

        def pct(q: float) -> float:
            return durations[min(len(durations) - 1, int(q * len(durations)))] * 1000 if durations else 0.0

        return {
            "scrapes": len(durations), "failures": failures, "bytes": max(sizes, default=0),
            "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": durations[-1] * 1000 if durations else 0.0,
        }


def scrape_loop(url: str, interval_s: float, scrapes: Scrapes, stop: threading.Event) -> None:
    """Scrape `url` on a grid of `interval_s` until `stop` is set."""
    parts = urlsplit(url)
    host, path = parts.hostname or "127.0.0.1", parts.path or "/metrics"
    conn = http.client.HTTPConnection(host, parts.port, timeout=SCRAPE_TIMEOUT_S)
    next_at = time.monotonic()
    while not stop.wait(max(0.0, next_at - time.monotonic())):
        next_at += interval_s
        if next_at < time.monotonic():
            next_at = time.monotonic() + interval_s
        t0 = time.perf_counter()
        try:
            conn.request("GET", path)
            body = conn.getresponse().read()
        except (OSError, http.client.HTTPException):
            with scrapes.lock:
                scrapes.failures += 1
            conn.close()
            conn = http.client.HTTPConnection(host, parts.port, timeout=SCRAPE_TIMEOUT_S)
            continue
        with scrapes.lock:
            scrapes.durations.append(time.perf_counter() - t0)
            scrapes.sizes.append(len(body))


def wait_for_stdin(stop: threading.Event) -> None:
    """Return once stdin closes or has data, or `stop` is set (SIGTERM)."""
    fd = sys.stdin.fileno()
    while not stop.is_set():
        try:
            readable, _, _ = select.select([fd], [], [], STDIN_POLL_S)
        except InterruptedError:
            continue
        if readable:
            return


def main() -> None:
    url, interval_s = sys.argv[1], float(sys.argv[2]) / 1000
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    scrapes = Scrapes()
    threading.Thread(target=scrape_loop, args=(url, interval_s, scrapes, stop), daemon=True).start()
    wait_for_stdin(stop)
    stop.set()
    print(json.dumps(scrapes.summary()), flush=True)
    os._exit(0)  # a scrape still in flight is abandoned with its thread


if __name__ == "__main__":
    main()
