"""KV admission reads a page it does not control: a page that lies is not believed (issue 25).

Each hostile page below once either closed the gate for everyone while the engine still counted as readable
(NaN or +Inf usage, a NaN queue, NaN num_gpu_blocks, block_size "0") or opened it on a full engine (-Inf
usage, infinite blocks, duplicate series, made-up data-parallel engines); a bad request-size histogram
pinned the footprint at 1 token. Now each is refused with a reason, the gate fails open at once with its
readable gauge at 0 and the reason counted, and a duplicate series counts once.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from aiohttp import web

from exporter.promtext import parse_page
from exporter.tap.admission import Admission
from exporter.tap.gate_poller import MAX_PAGE_BYTES
from exporter.tap.gate_reading import WANTED, EngineReadError, read_engine, read_text
from exporter.tap.page_reader import MAX_CPU_SHARE, RESTART_S
from llmslo import conventions as C
from tests.tap.conftest import spawn_cli_tap
from tests.tap.test_admission import BLOCK_SIZE, BLOCKS, SLO, reading, vllm_page
from tests.tap.test_reload_hostile import _peak_rss, _tap_memory_limit

FULL = 1.0  # the engine these pages describe is full: no free block, and a backlog
BACKLOG = 5


def page(usage: object = FULL, waiting: object = BACKLOG, blocks: object = BLOCKS, block_size: object = BLOCK_SIZE) -> str:
    """vllm_page with any of its values replaced by text a page could carry."""
    text = vllm_page(0.123, 7)
    text = text.replace('model_name="m"} 0.123', f'model_name="m"}} {usage}')
    text = text.replace('vllm:num_requests_waiting{engine="0",model_name="m"} 7',
                        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}')
    return text.replace(f'block_size="{BLOCK_SIZE}",engine="0",num_gpu_blocks="{BLOCKS}"',
                        f'block_size="{block_size}",engine="0",num_gpu_blocks="{blocks}"')


USAGE_LINE = 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 1.0\n'
HOSTILE = {
    "NaN usage": (page(usage="NaN"), C.ADMISSION_READ_NON_FINITE),
    "+Inf usage": (page(usage="+Inf"), C.ADMISSION_READ_NON_FINITE),
    "-Inf usage": (page(usage="-Inf"), C.ADMISSION_READ_NON_FINITE),
    "usage above 1": (page(usage=1.5), C.ADMISSION_READ_OUT_OF_RANGE),
    "usage below 0": (page(usage=-0.5), C.ADMISSION_READ_OUT_OF_RANGE),
    "NaN queue": (page(waiting="NaN"), C.ADMISSION_READ_NON_FINITE),
    "negative queue": (page(waiting=-3), C.ADMISSION_READ_OUT_OF_RANGE),
    # a cache config whose numbers are not numbers is no cache config: the page has no KV blocks to read
    "NaN num_gpu_blocks": (page(blocks="NaN"), C.ADMISSION_READ_NOT_ENGINE),
    "infinite num_gpu_blocks": (page(blocks="+Inf"), C.ADMISSION_READ_NOT_ENGINE),
    "block_size 0": (page(block_size="0"), C.ADMISSION_READ_OUT_OF_RANGE),
    "NaN block_size": (page(block_size="NaN"), C.ADMISSION_READ_NOT_ENGINE),
    # 100 data-parallel engines that have a usage series but no cache config of their own
    "made-up engines": (page().replace(USAGE_LINE, "".join(
        f'vllm:kv_cache_usage_perc{{engine="{i}",model_name="m"}} 0.0\n' for i in range(1, 101)) + USAGE_LINE),
        C.ADMISSION_READ_NOT_ENGINE),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_page_that_lies_is_refused_with_its_reason(name: str) -> None:
    text, reason = HOSTILE[name]
    with pytest.raises(EngineReadError) as e:
        read_engine(parse_page(text, WANTED).families)
    assert e.value.reason == reason, (name, str(e.value))


def test_the_pages_are_otherwise_readable_and_full() -> None:
    """The same page with honest values: the engine is full and the gate closes (so the hostile values are
    what the test is about)."""
    r = read_engine(parse_page(page(), WANTED).families)
    assert r.free_tokens == 0 and r.waiting == BACKLOG
    gate = Admission("http://127.0.0.1:1", slo=SLO)
    gate.update(r)
    # no free seat, a backlog and nothing finishing: the predicted wait is unbounded, past the TTFT objective
    assert not gate.is_open() and gate.refusal() == C.REFUSED_ADMISSION_TTFT


def read_as_the_gate_does(text: str):
    return read_text(text)


def test_a_duplicate_series_counts_once() -> None:
    """The same usage and queue series twice on the page (half the cache free, 3 waiting): not 2x the free
    blocks, not 6 waiting (the gate parses as the exporter does: a series' first value is kept)."""
    text = page(usage=0.5, waiting=3)
    dup = text.replace(USAGE_LINE.replace("1.0", "0.5"), USAGE_LINE.replace("1.0", "0.5") * 2)
    waiting = 'vllm:num_requests_waiting{engine="0",model_name="m"} 3\n'
    dup = dup.replace(waiting, waiting * 2)
    assert dup.count("vllm:num_requests_waiting{") == 2 and dup.count("vllm:kv_cache_usage_perc{") == 2
    one, two = read_as_the_gate_does(text), read_as_the_gate_does(dup)
    assert two.free_tokens == one.free_tokens == 500 * BLOCK_SIZE and two.waiting == one.waiting == 3


def test_a_bad_histogram_keeps_the_last_footprint() -> None:
    """Buckets that fall (or are NaN) are not a histogram: the reading is taken, its request sizes are not, so
    the footprint stays what it was instead of dropping to 1 token and opening the gate to everything."""
    gate = Admission("http://127.0.0.1:1", fallback_footprint=600)
    gate.update(reading(0.5))
    before = gate.learned.footprint
    text = vllm_page(0.5, 0).replace('vllm:request_prompt_tokens_bucket{engine="0",le="1000.0",model_name="m"} 10',
                                     'vllm:request_prompt_tokens_bucket{engine="0",le="1000.0",model_name="m"} 2')
    bad = read_engine(parse_page(text, WANTED).families)
    assert bad.bad_histogram and bad.prompt == () and bad.free_tokens > 0
    gate.update(bad)
    assert gate.learned.footprint == before > 500
    # a NaN anywhere in what the gate reads is a page not to believe at all
    with pytest.raises(EngineReadError) as e:
        read_as_the_gate_does(vllm_page(0.5, 0).replace('le="+Inf",model_name="m"} 10', 'le="+Inf",model_name="m"} NaN'))
    assert e.value.reason == C.ADMISSION_READ_NON_FINITE


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_the_gate_refuses_each_page_as_it_parses_them(name: str) -> None:
    text, reason = HOSTILE[name]
    with pytest.raises(EngineReadError) as e:
        read_as_the_gate_does(text)
    # the gate's checked parse drops non-finite samples before the adapters see them, and says so
    assert e.value.reason in (reason, C.ADMISSION_READ_NON_FINITE), (name, str(e.value))


def test_the_poller_fails_open_at_once_on_a_lying_page_and_counts_why() -> None:
    """A real HTTP engine page: honest and full (the gate closes), then NaN usage (the gate opens at once, its
    readable gauge 0, the reason counted), then honest again (it closes)."""
    served = {"text": page()}

    async def go() -> list[tuple[bool, bool, dict[str, int]]]:
        app = web.Application()
        app.router.add_get("/metrics", lambda _: web.Response(text=served["text"]))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        gate = Admission(f"http://127.0.0.1:{port}", poll_s=30, slo=SLO)
        seen = []
        try:
            for text in (page(), page(usage="NaN"), page()):
                served["text"] = text
                await gate.poll()
                seen.append((gate.is_open(), gate.readable, dict(gate.state.health.read_errors)))
            rendered = gate.render().decode()
        finally:
            await gate.stop()
            await runner.cleanup()
        assert f'{C.TAP_ADMISSION_READ_ERRORS.name}{{reason="{C.ADMISSION_READ_NON_FINITE}"}} 1' in rendered
        return seen

    (open1, readable1, _), (open2, readable2, errors2), (open3, readable3, errors3) = asyncio.run(go())
    assert (open1, readable1) == (False, True)
    assert (open2, readable2) == (True, False) and errors2[C.ADMISSION_READ_NON_FINITE] == 1
    assert (open3, readable3) == (False, True) and errors3 == errors2


def test_infinite_seats_are_never_shown() -> None:
    gate = Admission("http://127.0.0.1:1")
    gate.update(reading(0.0))
    assert math.isfinite(gate.learned.seats)


# -- a page as large as the gate reads (issue 34) ------------------------------------------------------------------
JUNK = 'vllm:num_requests_running{{engine="0",model_name="j-{:07d}"}} 1\n'


def big_page(size: int = MAX_PAGE_BYTES) -> bytes:
    """An honest page (half the cache free, 3 waiting) padded to `size` bytes with made-up models' series of a
    family the gate reads (every line to be looked at: the parser's most expensive page)."""
    head = (page(usage=0.5, waiting=3) + "# TYPE vllm:num_requests_running gauge\n").encode()
    lines = (size - len(head)) // len(JUNK.format(0))
    body = head + "".join(JUNK.format(i) for i in range(lines)).encode()
    return body + b"#" * (size - len(body) - 1) + b"\n"


class PageServer:
    """A threaded HTTP server (off the test's event loop) serving `body` at /metrics; records each fetch's
    client port and time."""

    def __init__(self, body: bytes) -> None:
        self.body, self.fetches = body, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                server.fetches.append((self.client_address[1], time.monotonic()))
                self.send_response(200)
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


@contextmanager
def serving(body: bytes) -> Iterator[PageServer]:
    server = PageServer(body)
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def socket_owner(client_port: int, pids: list[int]) -> list[int]:
    """Which of `pids` holds the loopback TCP socket whose local port is `client_port`."""
    inodes = {line.split()[9] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
              if line.split()[1].endswith(f":{client_port:04X}")}
    owners = []
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                owners.append(pid)
                break
    return owners


def test_an_8_mib_page_never_enters_the_taps_process() -> None:
    """The page is fetched and parsed by the gate's page reader, a child process: the connection that fetched it
    is the child's, not the tap's (parsed in a thread of the tap, the page held the GIL against the loop relaying
    streams: issue 34), and the reading it gives back is the honest part of the page."""
    body = big_page()
    assert len(body) == MAX_PAGE_BYTES

    async def poll(server: PageServer) -> tuple[float, float, list[int]]:
        gate = Admission(server.url, poll_s=30, slo=SLO)
        try:
            assert await gate.poll() and gate.learned.reading is not None, gate.state.health.last_error
            # looked at while the fetching connection is still open (kept alive)
            return gate.learned.reading.free_tokens, gate.learned.reading.waiting, socket_owner(server.fetches[-1][0], [
                os.getpid(), *children(os.getpid())])
        finally:
            await gate.stop()

    with serving(body) as server:
        free, waiting, owners = asyncio.run(poll(server))
    assert free == 500 * BLOCK_SIZE and waiting == 3
    assert len(owners) == 1 and owners[0] != os.getpid(), f"the page was fetched by {owners} (this process: {os.getpid()})"


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_costly_page_is_read_for_at_most_a_fifth_of_a_core() -> None:
    """An 8 MiB page costs the reader about 0.3 s of CPU: read every 0.25 s it kept a core busy, and in the tap's pod
    (one CPU limit for the tap and its reader) the relay was throttled with it. The poller rests in proportion to
    what a reading cost (page_reader.MAX_CPU_SHARE); the gate stays readable all along."""
    window_s = 5.0

    async def go(server: PageServer) -> tuple[float, float, bool, int]:
        gate = Admission(server.url, poll_s=0.25, slo=SLO)
        try:
            assert await gate.poll(), gate.state.health.last_error
            cost, child = gate.poller.page.cpu_s, gate.poller.page.pid
            assert child is not None and cost > 0
            before, fetched = _cpu_s(child), len(server.fetches)
            gate.start()
            await asyncio.sleep(window_s)
            return _cpu_s(child) - before, cost, gate.readable, len(server.fetches) - fetched
        finally:
            await gate.stop()

    with serving(big_page()) as server:
        used, cost, readable, readings = asyncio.run(go(server))
    assert readable and readings >= 2, (readable, readings)
    # a reading begun within the window may end beyond it: one reading's cost (twice, for the variation) of slack
    assert used <= MAX_CPU_SHARE * window_s + 2 * cost + 0.1, (used, cost, readings)


def test_an_8_mib_page_polled_keeps_the_tap_and_its_reader_under_the_pods_memory_limit() -> None:
    """The real tap (`--admission`) polling an 8 MiB page: its peak RSS and its page reader's, together (one pod),
    stay under the shipped manifest's memory limit for the tap container."""
    with serving(big_page()) as server:
        tap = spawn_cli_tap(server.url, "--admission")
        try:
            deadline = time.monotonic() + 60
            while len(server.fetches) < 4 and time.monotonic() < deadline:
                time.sleep(0.2)
            assert len(server.fetches) >= 4, server.fetches
            [reader] = children(tap.popen.pid)
            peak = _peak_rss(tap.popen.pid) + _peak_rss(reader)
            limit = _tap_memory_limit()
            assert peak < limit, (_peak_rss(tap.popen.pid), _peak_rss(reader), limit)
        finally:
            tap.stop()


def test_a_page_past_the_cap_is_not_read_and_a_dead_reader_is_started_again() -> None:
    """One byte past MAX_PAGE_BYTES is refused as unreachable (the cap holds in the reader); a reader that dies
    (here SIGKILL, as the OOM killer would) costs a poll, and is started again RESTART_S after its start."""

    async def go(server: PageServer) -> None:
        gate = Admission(server.url, poll_s=30, slo=SLO)
        try:
            server.body = big_page(MAX_PAGE_BYTES + 1)
            assert not await gate.poll() and "larger than" in gate.state.health.last_error
            assert gate.state.health.read_errors[C.ADMISSION_READ_UNREACHABLE] == 1
            server.body = page(usage=0.5, waiting=3).encode()
            assert await gate.poll() and gate.readable
            first = gate.poller.page.pid
            assert first is not None
            os.kill(first, signal.SIGKILL)
            assert not await gate.poll() and gate.state.health.read_errors[C.ADMISSION_READ_UNREACHABLE] == 2, gate.state.health.last_error
            await asyncio.sleep(RESTART_S)
            assert await gate.poll() and gate.readable, gate.state.health.last_error
            assert gate.poller.page.pid not in (None, first)
        finally:
            await gate.stop()

    with serving(b"") as server:
        asyncio.run(go(server))


def test_a_poll_cancelled_as_its_answer_arrives_ends_and_the_gate_stops() -> None:
    """The tap stopping (SIGTERM) cancels the poller; a cancellation that came just as the reader's answer did was
    swallowed (Python 3.11's asyncio.wait_for returns the answer instead), the poller went on polling and the tap
    never exited (seen once in bench tap-admission-page). Staged: the poll's task is cancelled from the moment the
    real answer is in hand; the poll must end cancelled, and stop() must return."""

    async def go(server: PageServer) -> bool:
        gate = Admission(server.url, poll_s=30, slo=SLO)
        try:
            assert await gate.poll(), gate.state.health.last_error  # the reader is running
            answer = gate.poller.page._answer
            task: asyncio.Task[bool] | None = None

            async def answer_then_cancelled(*args: object) -> dict:
                got = await answer(*args)  # type: ignore[arg-type]
                assert task is not None
                task.cancel()  # the cancellation arrives with the answer
                return got

            gate.poller.page._answer = answer_then_cancelled  # type: ignore[method-assign]
            task = asyncio.ensure_future(gate.poll())
            await asyncio.wait([task], timeout=20)
            return task.cancelled()
        finally:
            async with asyncio.timeout(10):
                await gate.stop()

    with serving(page(usage=0.5, waiting=3).encode()) as server:
        assert asyncio.run(go(server)), "the cancelled poll went on as if never cancelled"
