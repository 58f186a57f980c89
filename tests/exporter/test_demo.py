"""`python -m demo` (what `make demo` runs): shows live numbers, exits 0, leaves nothing running."""

from __future__ import annotations

import math
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from demo import summary
from demo.pages import FakeVllmPage
from exporter import adapters, promtext
from llmslo import conventions as c

REPO = Path(__file__).resolve().parents[2]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_demo_runs_for_its_duration_and_stops_everything():
    # What `make demo` runs: the simulator when it is installed, else the built-in pages.
    done = subprocess.run([sys.executable, "-m", "demo", "--duration", "2", "--interval", "0.5"],
                          cwd=REPO, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"targets up (\d)/\1 ", out) and "GPUs up 4" in out
    assert re.search(r"TTFT p50/p99 ms", out)
    assert "everything it started has exited" in out
    ports = [int(p) for p in re.findall(r"(?:exporter: http://127\.0\.0\.1:|simulator on 127\.0\.0\.1:)(\d+)", out)]
    assert ports, out
    for port in ports:
        assert not listening(port), f"port {port} still answers after the demo exited"


def test_builtin_pages_read_as_a_moving_vllm_engine():
    page = FakeVllmPage("m", seed=1)
    adapter = adapters.get("vllm")
    identity = {"engine": "vllm", "model": "", "pod": "", "namespace": "", "node": "n"}
    first = {s.name: s for s in adapter.adapt(promtext.parse(page.render().decode(), adapter.wanted), identity)}
    second = {s.name: s for s in adapter.adapt(promtext.parse(page.render().decode(), adapter.wanted), identity)}
    for metric in (c.REQUESTS_RUNNING, c.KV_CACHE_USAGE, c.KV_BLOCKS_FREE, c.GENERATION_TOKENS):
        assert metric.name in first, metric.name
    assert first[c.REQUESTS_RUNNING.name].labels["model"] == "m"
    assert second[c.GENERATION_TOKENS.name].value > first[c.GENERATION_TOKENS.name].value  # it moves


def test_histogram_quantile_matches_prometheus():
    buckets = [(0.1, 10.0), (0.5, 60.0), (1.0, 100.0), (math.inf, 100.0)]
    assert summary.histogram_quantile(0.5, buckets) == pytest.approx(0.1 + 0.4 * (50 - 10) / 50)
    assert summary.histogram_quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * (99 - 60) / 40)
    assert math.isnan(summary.histogram_quantile(0.5, []))
    assert summary.histogram_quantile(0.99, [(0.1, 1.0), (math.inf, 100.0)]) == 0.1  # +Inf: the last finite edge
