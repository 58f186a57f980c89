"""`python -m bench.scraper URL INTERVAL_MS`: GET a /metrics page every INTERVAL_MS, as Prometheus would.

Its own process, so that reading the page costs neither the measured proxy nor the measuring
client. Scrapes start on a fixed grid (a slow one is not followed by a burst to catch up). Stops
when stdin closes or on SIGTERM, then prints one JSON line: scrapes, failures, page bytes and
scrape durations (request sent to last byte read).
"""

from __future__ import annotations

import http.client
import json
import os
import selectors
import signal
import sys
import time
from urllib.parse import urlsplit


def main() -> None:
    url, interval_s = sys.argv[1], float(sys.argv[2]) / 1000
    parts = urlsplit(url)
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ)
    host = parts.hostname or "127.0.0.1"
    conn = http.client.HTTPConnection(host, parts.port, timeout=10)
    durations: list[float] = []
    sizes: list[int] = []
    failures = 0
    next_at = time.monotonic()
    while not stopping:
        wait = next_at - time.monotonic()
        if wait > 0 and sel.select(wait):
            break  # stdin closed (or written to): the bench is done with us
        next_at += interval_s
        if next_at < time.monotonic():
            next_at = time.monotonic() + interval_s
        t0 = time.perf_counter()
        try:
            conn.request("GET", parts.path or "/metrics")
            body = conn.getresponse().read()
        except (OSError, http.client.HTTPException):
            failures += 1
            conn.close()
            conn = http.client.HTTPConnection(host, parts.port, timeout=10)
            continue
        durations.append(time.perf_counter() - t0)
        sizes.append(len(body))
    durations.sort()

    def pct(q: float) -> float:
        return durations[min(len(durations) - 1, int(q * len(durations)))] * 1000 if durations else 0.0

    print(json.dumps({
        "scrapes": len(durations), "failures": failures, "bytes": max(sizes, default=0),
        "p50_ms": pct(0.5), "p99_ms": pct(0.99), "max_ms": durations[-1] * 1000 if durations else 0.0,
    }), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
