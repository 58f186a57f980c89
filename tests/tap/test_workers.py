"""`--workers N`: N tap processes on one port, one /metrics that sums their counters exactly and keeps their gauges
per worker, restarts, clean stop."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import generate_latest

from exporter import promtext
from exporter.adapters import tap as tap_adapter
from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.metrics import TapMetrics
from exporter.tap.timing import Timings
from exporter.tap.workers import merge_expositions
from llmslo import conventions as C

ROOT = Path(__file__).resolve().parents[2]
CLASSES = SloConfig((SloClass("interactive", 0.5, 0.05, ("chat-*",)),), {"ttft": (0.5,), "tpot": (0.05,), "e2e": ()})
BODY = json.dumps({"model": "chat-a", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()


def _record(m: TapMetrics, i: int) -> None:
    t = Timings(0.01, 0.1 + i / 100, 0.02 * (i % 4), 0.5 + i / 10, 3 + i % 5, C.USAGE_SOURCE_ENGINE)
    m.record("chat-a", "interactive", C.OUTCOME_OK if i % 7 else C.OUTCOME_ABORTED, t, i % 3 == 0)


def test_merged_exposition_equals_one_process_that_saw_everything() -> None:
    parts = [TapMetrics(CLASSES), TapMetrics(CLASSES)]
    whole = TapMetrics(CLASSES)
    for i in range(50):
        _record(parts[i % 2], i)
        _record(whole, i)
    merged = merge_expositions(generate_latest(p.registry).decode() for p in parts)
    want = {k: v for k, v in promtext.parse_page(generate_latest(whole.registry).decode()).families.items() if not k.endswith("_created")}
    got = promtext.parse_page(merged).families
    assert set(got) == set(want) and len(want) == len(C.TAP_METRICS)
    for name, fam in want.items():
        expected = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples}
        assert {(s.name, tuple(sorted(s.labels.items()))): s.value for s in got[name].samples} == \
            pytest.approx(expected), name
    # The node exporter's tap adapter reads the merged page like a single tap's.
    adapted, single = tap_adapter.adapt(got, {"pod": "p"}), tap_adapter.adapt(want, {"pod": "p"})
    assert [(a.metric, a.labels, a.suffix) for a in adapted] == [(b.metric, b.labels, b.suffix) for b in single]
    assert [a.value for a in adapted] == pytest.approx([b.value for b in single])


def test_in_flight_late_gauge_adds_up_over_live_workers_only() -> None:
    """Requests late now are held by live workers: their counts add up; a dead worker's last count is gone."""
    parts = []
    for late in (1, 2):
        m = TapMetrics(CLASSES)
        m.late_source = lambda late=late: {("chat-a", "interactive"): late}
        parts.append(generate_latest(m.registry).decode())
    name = C.TAP_IN_FLIGHT_LATE.name
    got = promtext.parse_page(merge_expositions(parts)).families[name]
    values = {s.labels["model"]: s.value for s in got.samples}
    assert values == {"chat-a": 3.0, "__other__": 0.0}
    retired_and_live = merge_expositions(parts, [None, "1"])
    assert {s.labels["model"]: s.value for s in promtext.parse_page(retired_and_live).families[name].samples}["chat-a"] == 2.0
    assert name not in promtext.parse_page(merge_expositions(parts, [None, None])).families


def test_merged_exposition_passes_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by scripts/install-system-deps.sh"
    parts = [TapMetrics(CLASSES), TapMetrics(CLASSES)]
    for i in range(10):
        _record(parts[i % 2], i)
    page = merge_expositions(generate_latest(p.registry).decode() for p in parts)
    proc = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _spawn(upstream_url: str, workers: int, *extra: str) -> tuple[subprocess.Popen[str], str, str, list[str]]:
    popen = subprocess.Popen(
        [sys.executable, "-m", "exporter.tap", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
         "--upstream", upstream_url, "--workers", str(workers), "--shutdown-grace", "2", *extra],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    assert popen.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = popen.stderr.readline()
        lines.append(line)
        m = re.search(r"event=tap_listening proxy=(\S+) metrics=(\S+)", line)
        if m:
            # The parent is ready once every worker's metrics socket answers; a worker's own log line may still
            # be on its way through the shared stderr pipe.
            while len(re.findall(r"event=tap_worker_listening", "".join(lines))) < workers and time.monotonic() < deadline:
                lines.append(popen.stderr.readline())
            return popen, m.group(1), m.group(2), lines
        if not line and popen.poll() is not None:
            break
    popen.kill()
    raise AssertionError(f"the tap did not start: {''.join(lines)}")


def _worker_sockets(lines: list[str]) -> list[str]:
    return ["\0" + name for name in re.findall(r"event=tap_worker_listening .* metrics=unix:@(\S+)", "".join(lines))]


async def _requests(proxy: str, n: int) -> None:
    async def one() -> None:
        async with aiohttp.ClientSession() as s:  # a connection each, so the kernel spreads them
            async with s.post(proxy + "/v1/chat/completions", data=BODY, headers={"x-test-chunks": "2"}) as r:
                assert (await r.read()).endswith(b"data: [DONE]\n\n")

    await asyncio.gather(*(one() for _ in range(n)))


async def _total(url: str, unix: str | None = None) -> float:
    connector = aiohttp.UnixConnector(path=unix) if unix else None
    async with aiohttp.ClientSession(connector=connector) as s, s.get(url) as r:
        fams = promtext.parse_page(await r.text()).families
    return sum(s.value for s in fams[tap_adapter.family_name(C.TAP_REQUESTS)].samples)


def test_workers_share_the_port_and_metrics_sum_them(upstream_proc: Any) -> None:
    popen, proxy, metrics, lines = _spawn(upstream_proc.url, 2)
    try:
        sockets = _worker_sockets(lines)
        assert len(sockets) == 2, lines

        async def go() -> None:
            await _requests(proxy, 32)
            per_worker = [await _total("http://worker/metrics", s) for s in sockets]
            assert sum(per_worker) == 32 and all(n > 0 for n in per_worker), per_worker
            assert await _total(metrics) == 32

        asyncio.run(go())
    finally:
        popen.send_signal(signal.SIGTERM)
        _, err = popen.communicate(timeout=30)
    assert popen.returncode == 0, err
    assert err.count("event=tap_stopping") == 3, "the parent and each worker stop"


def test_a_worker_that_dies_is_started_again(upstream_proc: Any) -> None:
    popen, proxy, metrics, lines = _spawn(upstream_proc.url, 2)
    try:
        pids = [int(p) for p in re.findall(r"event=tap_worker_listening .* pid=(\d+)", "".join(lines))]
        assert len(pids) == 2
        asyncio.run(_requests(proxy, 16))
        before = asyncio.run(_total(metrics))  # the parent has now seen every worker's count
        assert before == 16
        os.kill(pids[0], signal.SIGKILL)
        assert popen.stderr is not None
        deadline = time.monotonic() + 20
        restarted, seen = "", []
        while time.monotonic() < deadline and not restarted:
            line = popen.stderr.readline()
            seen.append(line)
            if "event=tap_worker_listening" in line and str(pids[0]) not in line:
                restarted = line
        assert restarted, "a new worker took the dead one's place"
        assert any("event=tap_worker_exited" in x and "status=-9" in x for x in seen), seen

        async def go() -> None:
            assert await _total(metrics) == 16, "the dead worker's counts stay in the sum: counters never go down"
            await _requests(proxy, 16)
            assert await _total(metrics) == 32

        asyncio.run(go())
    finally:
        popen.send_signal(signal.SIGTERM)
        _, err = popen.communicate(timeout=30)
    assert popen.returncode == 0 and "restart_failed" not in err, err


def test_workers_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    from exporter.tap import cli

    with pytest.raises(SystemExit):
        cli.main(["--listen", "127.0.0.1:0", "--upstream", "http://x", "--metrics-listen", "127.0.0.1:0", "--workers", "0"])
    assert "--workers" in capsys.readouterr().err


def test_gauges_are_kept_per_worker_not_summed() -> None:
    page = ("# HELP llm_tap_admission_seats s\n# TYPE llm_tap_admission_seats gauge\nllm_tap_admission_seats 8\n"
            "# HELP llm_tap_refusals_total r\n# TYPE llm_tap_refusals_total counter\n"
            'llm_tap_refusals_total{reason="malformed"} 1.0\n')
    merged = merge_expositions([page, page, page], [None, "0", "1"])
    assert 'llm_tap_admission_seats{worker="0"} 8\nllm_tap_admission_seats{worker="1"} 8\n' in merged
    assert 'llm_tap_refusals_total{reason="malformed"} 3.0' in merged
    # The gauges of workers that died are left out; a gauge only they had leaves no header behind.
    assert "admission" not in merge_expositions([page], [None])
    assert 'g{a="b",worker="0"} NaN' in merge_expositions(['# TYPE g gauge\ng{a="b"} NaN\n'])


# A vLLM page whose KV cache has 0.5 x 1000 blocks x 16 tokens = 8,000 tokens free; with a footprint of 800
# tokens (no request finished yet, so the --admission-footprint flag: 50 whole blocks), 10 seats; 3 requests
# waiting (the gate is open).
ENGINE_PAGE = (
    "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\n"
    "# TYPE vllm:cache_config_info gauge\n"
    "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"1000\"} 1.0\n"
    "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n"
)


def test_admission_gauges_are_right_with_two_workers() -> None:
    import http.server
    import threading

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = ENGINE_PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    engine = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    popen, _, metrics, _ = _spawn(f"http://127.0.0.1:{engine.server_address[1]}", 2,
                                  "--admission", "--admission-footprint", "800")
    try:
        async def page() -> dict[str, list[tuple[dict[str, str], float]]]:
            async with aiohttp.ClientSession() as s, s.get(metrics) as r:
                fams = promtext.parse_page(await r.text()).families
            return {name: [(x.labels, x.value) for x in fam.samples] for name, fam in fams.items()}

        deadline = time.monotonic() + 20
        while True:
            fams = asyncio.run(page())
            readable = fams.get(C.TAP_ADMISSION_ENGINE_READABLE.name, [])
            if len(readable) == 2 and all(v == 1 for _, v in readable) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for d, want in ((C.TAP_ADMISSION_SEATS, 10.0), (C.TAP_ADMISSION_QUEUE, 3.0), (C.TAP_ADMISSION_FOOTPRINT, 800.0),
                        (C.TAP_ADMISSION_OPEN, 1.0), (C.TAP_ADMISSION_ENGINE_READABLE, 1.0)):
            assert sorted(fams[d.name], key=lambda s: s[0]["worker"]) == [({"worker": "0"}, want), ({"worker": "1"}, want)], d.name
    finally:
        popen.send_signal(signal.SIGTERM)
        popen.communicate(timeout=30)
        engine.shutdown()
        engine.server_close()
