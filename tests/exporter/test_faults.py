"""Bad engines and bad GPUs: the exporter marks the target down with a reason, keeps serving
/metrics promptly, never crashes and leaks nothing over many cycles.

The faulty engine is a real HTTP server on loopback, in its own thread and event loop (a separate
peer, as an engine is), so what the exporter's loop holds can be counted on its own.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import threading
import time
import tracemalloc
from dataclasses import dataclass, field

import aiohttp
import pynvml
import pytest
from aiohttp import web

from exporter.collector import Collector
from exporter.config import ExporterConfig, Limits, TargetConfig
from exporter.gpu import FakeProvider, open_provider
from exporter.server import start_server
from exporter.snapshot import CollectionLoop, SnapshotHolder
from exporter.sources import FetchError
from exporter.sources.fetch import fetch_page
from exporter.sources.http import new_session
from exporter.targets import TargetSet
from llmslo import conventions as c

VLLM_PAGE = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
"""
HUGE_PAGE_BYTES = 200 * 1024 * 1024
CHUNK = b"vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n" * 1200  # ~64 KiB of valid lines


@dataclass
class FaultEngine:
    """A misbehaving engine: one path per fault. Runs in a thread with its own loop."""

    base: str = ""
    huge_bytes_sent: int = 0
    huge_finished: threading.Event = field(default_factory=threading.Event)
    loop: asyncio.AbstractEventLoop | None = None

    def routes(self) -> dict:
        async def ok(request):
            return web.Response(body=VLLM_PAGE, content_type="text/plain")

        async def hang(request):  # never answers; lets go once the client has gone
            while request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(0.02)
            return web.Response(status=204)

        async def error(request):
            return web.Response(status=500, text="Internal Server Error")

        async def garbage(request):
            return web.Response(body=b"<html><body><h1>502 Bad Gateway</h1>\n\x00\xff\xfe binary junk\n</body></html>\n")

        async def truncated(request):  # promises 20000 bytes, sends 1000, hangs up
            resp = web.StreamResponse(headers={"Content-Length": "20000", "Content-Type": "text/plain"})
            await resp.prepare(request)
            await resp.write(VLLM_PAGE[:1000] if len(VLLM_PAGE) > 1000 else VLLM_PAGE[:200])
            request.transport.close()
            return resp

        async def cut_mid_line(request):  # well framed, but the page stops in the middle of a line
            return web.Response(body=VLLM_PAGE[: VLLM_PAGE.index(b"} 1.0")], content_type="text/plain")

        async def huge(request):  # 200 MB of valid lines, streamed until the client stops reading
            resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await resp.prepare(request)
            try:
                while self.huge_bytes_sent < HUGE_PAGE_BYTES:
                    await resp.write(CHUNK)
                    self.huge_bytes_sent += len(CHUNK)
            except (ConnectionResetError, ConnectionError, RuntimeError):
                pass
            finally:
                self.huge_finished.set()
            return resp

        return {"/ok": ok, "/hang": hang, "/500": error, "/garbage": garbage, "/truncated": truncated,
                "/cut": cut_mid_line, "/huge": huge}


@pytest.fixture
def engine():
    fe = FaultEngine()
    ready = threading.Event()
    stop: list = []

    def serve():
        loop = asyncio.new_event_loop()
        fe.loop = loop
        app = web.Application()
        for path, handler in fe.routes().items():
            app.router.add_get(path, handler)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
        fe.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        done = asyncio.Event()
        stop.append((loop, done))
        ready.set()
        loop.run_until_complete(done.wait())
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield fe
    loop, done = stop[0]
    loop.call_soon_threadsafe(done.set)
    thread.join(10)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens here once the socket is closed


def fault_targets(engine: FaultEngine, timeout: float = 0.5) -> list[TargetConfig]:
    t = dict(kind="vllm", timeout_s=timeout, max_page_bytes=1024 * 1024)
    return [
        TargetConfig(url=f"http://127.0.0.1:{closed_port()}/metrics", name="down", **t),
        TargetConfig(url=f"{engine.base}/hang", name="hang", **t),
        TargetConfig(url=f"{engine.base}/500", name="http500", **t),
        TargetConfig(url=f"{engine.base}/garbage", name="garbage", **t),
        TargetConfig(url=f"{engine.base}/truncated", name="truncated", **t),
        TargetConfig(url=f"{engine.base}/cut", name="cut", **t),
        TargetConfig(url=f"{engine.base}/huge", name="huge", **t),
        TargetConfig(url=f"{engine.base}/ok", name="ok", **t),
    ]


EXPECTED_REASONS = {
    "down": "connection_refused", "hang": "timeout", "http500": "http_500", "garbage": "parse_error",
    "truncated": "truncated", "cut": "truncated", "huge": "page_too_large", "ok": "",
}


def value(snapshot, metric: c.MetricDef, **labels: str) -> float:
    found = [s.value for s in snapshot.samples
             if s.metric.name == metric.name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (metric.name, labels, found)
    return found[0]


def test_each_fault_marks_its_target_down_with_its_reason(engine):
    async def go():
        targets = fault_targets(engine)
        config = ExporterConfig(targets=tuple(targets), interval_s=2)
        async with new_session() as session:
            started = time.monotonic()
            snap = await Collector(config, session, None, "n").collect(targets)
            return snap, time.monotonic() - started

    snap, took = asyncio.run(go())
    reasons = {t.target: t.reason for t in snap.targets}
    assert reasons == EXPECTED_REASONS
    assert took < 1.5  # all at once, each within its own 0.5 s deadline
    for name, reason in EXPECTED_REASONS.items():
        assert value(snap, c.EXPORTER_TARGET_UP, target=name) == (0 if reason else 1)
        if reason:
            assert value(snap, c.EXPORTER_LAST_ERROR, target=name, reason=reason) == 1
    assert value(snap, c.EXPORTER_PARSE_ERRORS, target="garbage") >= 1
    assert value(snap, c.REQUESTS_RUNNING, engine="vllm") == 3  # the good target is untouched


def test_a_200_mb_page_is_cut_off_without_being_read_into_memory(engine):
    max_bytes = 4 * 1024 * 1024

    async def go():
        async with new_session() as session:
            with pytest.raises(FetchError) as err:
                await fetch_page(session, f"{engine.base}/huge", timeout_s=10, max_bytes=max_bytes)
            return err.value.reason

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    try:
        reason = asyncio.run(go())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reason == "page_too_large"
    assert engine.huge_finished.wait(5)  # the engine saw the connection close
    assert engine.huge_bytes_sent < HUGE_PAGE_BYTES // 4, engine.huge_bytes_sent
    assert peak < 3 * max_bytes, f"peak traced memory {peak / 2**20:.1f} MiB"
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    assert rss_growth < 64 * 1024 * 1024, f"RSS grew {rss_growth / 2**20:.1f} MiB"


def test_metrics_answers_promptly_while_a_target_hangs(engine):
    async def go():
        targets = (TargetConfig(kind="vllm", url=f"{engine.base}/hang", name="hang", timeout_s=1.0),
                   TargetConfig(kind="vllm", url=f"{engine.base}/ok", name="ok"))
        config = ExporterConfig(targets=targets, interval_s=1.2)
        holder = SnapshotHolder()
        server = await start_server(holder, config.listen.__class__("127.0.0.1", 0))
        async with new_session() as session, aiohttp.ClientSession() as client:
            loop = CollectionLoop(Collector(config, session, None, "n"), TargetSet(targets), holder, config.interval_s)
            task = asyncio.create_task(loop.run_forever())
            base = f"http://127.0.0.1:{server.port}"
            try:
                async with client.get(f"{base}/healthz") as r:
                    assert r.status == 200
                async with client.get(f"{base}/readyz") as r:
                    assert r.status == 503  # the first cycle waits on the hung target
                async with client.get(f"{base}/metrics") as r:
                    assert r.status == 503
                while not holder.ready:
                    await asyncio.sleep(0.02)
                latencies = []
                deadline = time.monotonic() + 2.0  # spans a whole second cycle stuck on the hung target
                while time.monotonic() < deadline:
                    t0 = time.monotonic()
                    async with client.get(f"{base}/metrics") as r:
                        body = await r.text()
                        assert r.status == 200
                    latencies.append(time.monotonic() - t0)
                    await asyncio.sleep(0.05)
                async with client.get(f"{base}/readyz") as r:
                    assert r.status == 200
                return latencies, body
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await server.stop()

    latencies, body = asyncio.run(go())
    assert len(latencies) > 10
    assert max(latencies) < 0.3, f"slowest /metrics took {max(latencies):.3f}s"
    assert 'llm_exporter_target_up{engine="vllm",target="hang"} 0' in body
    assert 'llm_exporter_target_last_error{engine="vllm",reason="timeout",target="hang"} 1' in body
    assert 'llm_exporter_target_up{engine="vllm",target="ok"} 1' in body


def test_a_gpu_lost_mid_run_reads_as_down_and_nothing_else_changes(engine):
    provider = FakeProvider(4)

    async def go():
        targets = (TargetConfig(kind="vllm", url=f"{engine.base}/ok", name="ok"),)
        config = ExporterConfig(targets=targets)
        async with new_session() as session:
            collector = Collector(config, session, provider, "n")
            before = await collector.collect(targets)
            provider.lose(2)
            lost = await collector.collect(targets)
            provider.restore(2)
            back = await collector.collect(targets)
            return before, lost, back

    before, lost, back = asyncio.run(go())

    def gpu_up(snap) -> dict[str, float]:
        return {s.labels[c.LABEL_GPU]: s.value for s in snap.samples if s.metric.name == c.GPU_UP.name}

    assert gpu_up(before) == {"0": 1, "1": 1, "2": 1, "3": 1}
    assert gpu_up(lost) == {"0": 1, "1": 1, "2": 0, "3": 1}
    assert gpu_up(back) == {"0": 1, "1": 1, "2": 1, "3": 1}
    assert lost.gpus_up == 3 and lost.targets[0].up
    lost_series = [s for s in lost.samples if s.labels.get(c.LABEL_GPU) == "2" and s.metric.name != c.GPU_UP.name]
    assert lost_series == []  # no stale readings for the lost GPU


class HangingProvider:
    """A GPU provider whose reads block until released: a hung NVML call."""

    def __init__(self, inner: FakeProvider):
        self.inner = inner
        self.release = threading.Event()
        self.release.set()

    def devices(self):
        return self.inner.devices()

    def read(self, index):
        self.release.wait()
        return self.inner.read(index)

    def poll_xid_events(self):
        return self.inner.poll_xid_events()

    def close(self):
        self.inner.close()


def test_a_hung_nvml_call_neither_blocks_the_cycle_nor_piles_up_threads(engine):
    provider = HangingProvider(FakeProvider(2))

    def gpu_threads() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "llmslo-gpu")

    async def go():
        targets = (TargetConfig(kind="vllm", url=f"{engine.base}/ok", name="ok"),)
        config = ExporterConfig(targets=targets, gpu_timeout_s=0.3)
        async with new_session() as session:
            collector = Collector(config, session, provider, "n")
            first = await collector.collect(targets)
            provider.release.clear()
            t0 = time.monotonic()
            hung = await collector.collect(targets)
            hung_took = time.monotonic() - t0
            still = await collector.collect(targets)
            threads_while_hung = gpu_threads()
            provider.release.set()
            await asyncio.sleep(0.1)
            recovered = await collector.collect(targets)
            return first, hung, hung_took, still, threads_while_hung, recovered

    first, hung, hung_took, still, threads_while_hung, recovered = asyncio.run(go())
    assert first.gpus_up == 2
    assert hung_took < 1.0 and hung.targets[0].up
    assert hung.gpus_up == 0 and still.gpus_up == 0
    assert sum(1 for s in hung.samples if s.metric.name == c.GPU_UP.name) == 2  # reported as down, not vanished
    assert threads_while_hung == 1  # the second cycle did not start another NVML call
    assert recovered.gpus_up == 2


def test_no_nvml_library_means_no_gpus_and_a_logged_reason(engine, monkeypatch, caplog):
    def no_library():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    with caplog.at_level("WARNING"):
        provider = open_provider("nvml")
    assert "gpu_nvml_unavailable" in caplog.text
    assert provider.devices() == []

    async def go():
        targets = (TargetConfig(kind="vllm", url=f"{engine.base}/ok", name="ok"),)
        async with new_session() as session:
            return await Collector(ExporterConfig(targets=targets), session, provider, "n").collect(targets)

    snap = asyncio.run(go())
    assert snap.targets[0].up and snap.gpus_up == 0
    assert not [s for s in snap.samples if s.metric.name.startswith("llm_gpu_")]


def test_many_cycles_of_faults_leak_no_fds_tasks_or_threads(engine):
    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def go():
        targets = [t for t in fault_targets(engine, timeout=0.05) if t.name != "huge"]
        config = ExporterConfig(targets=tuple(targets), interval_s=1, limits=Limits())
        async with new_session() as session:
            collector = Collector(config, session, FakeProvider(2), "n")
            marks = {}
            for cycle in range(1, 41):
                snap = await collector.collect(targets)
                if cycle in (10, 40):
                    await asyncio.sleep(0.1)  # let closed connections settle
                    marks[cycle] = (fds(), len(asyncio.all_tasks()), threading.active_count())
            return marks, snap

    threads_before = threading.active_count()
    marks, snap = asyncio.run(go())
    (fd10, tasks10, _), (fd40, tasks40, threads40) = marks[10], marks[40]
    assert fd40 <= fd10 + 2, (fd10, fd40)
    assert tasks40 == tasks10, (tasks10, tasks40)
    # Worker threads: the loop's default executor (parsing, file reads) and at most one NVML thread.
    executor_max = min(32, (os.cpu_count() or 1) + 4)
    assert threads40 <= threads_before + executor_max + 1, (threads_before, threads40)
    assert value(snap, c.EXPORTER_CYCLES) == 40
    assert {t.target: t.reason for t in snap.targets} == {k: v for k, v in EXPECTED_REASONS.items() if k != "huge"}


def _threads_reading_files() -> int:
    """Threads whose stack is inside the file source's blocking read, hung or not."""
    import sys

    count = 0
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code.co_name == "_read_bounded":
                count += 1
                break
            frame = frame.f_back
    return count


def _unblock_fifo(path) -> None:
    """Open and close the write end: every reader blocked opening the FIFO wakes up and reads EOF."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # ENXIO: no reader is waiting any more
        pass


def test_a_hung_file_read_is_not_started_again_each_cycle(tmp_path):
    fifo = tmp_path / "hung.fifo"
    os.mkfifo(fifo)  # opening it for reading blocks until a writer appears: a read that never returns
    good = tmp_path / "good.prom"
    good.write_bytes(VLLM_PAGE)
    targets = (TargetConfig(kind="vllm", url=f"file://{fifo}", name="fifo", timeout_s=0.2),
               TargetConfig(kind="vllm", url=f"file://{good}", name="good"))
    config = ExporterConfig(targets=targets, interval_s=1)

    async def go():
        async with new_session() as session:
            collector = Collector(config, session, None, "n")
            cycles = []
            try:
                for _ in range(6):
                    t0 = time.monotonic()
                    snap = await collector.collect(targets)
                    running = [s.value for s in snap.samples if s.metric.name == c.REQUESTS_RUNNING.name]
                    cycles.append((time.monotonic() - t0, {t.target: t.reason for t in snap.targets}, running))
                stuck = _threads_reading_files()
            finally:
                _unblock_fifo(fifo)  # before the loop closes, whatever the outcome, so no thread is left hung
            for _ in range(100):
                if _threads_reading_files() == 0:
                    break
                await asyncio.sleep(0.02)
            return cycles, stuck, _threads_reading_files()

    cycles, stuck, left = asyncio.run(go())
    assert stuck == 1, f"{stuck} threads blocked on the FIFO after 6 cycles (one per cycle without the fix)"
    assert left == 0
    for duration, reasons, running in cycles:
        assert reasons == {"fifo": "timeout", "good": ""}  # the other target keeps working every cycle
        assert running == [3.0]
        assert duration < 1.0
