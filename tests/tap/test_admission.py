"""KV admission (exporter.tap.admission): the gate refuses at the floor, admits again when seats
return, never cuts an admitted stream, and fails open when the engine cannot be read."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from exporter.promtext import parse_page
from exporter.tap.admission import Admission
from exporter.tap.classes import Objective, SloClass, SloConfig
from exporter.tap.cli import add_arguments
from exporter.tap.gate_reading import ENGINE_KINDS, WANTED, EngineReadError, Reading, read_engine, wanted
from exporter.tap.seats import MIN_SAMPLES
from llmslo import conventions as C
from llmslo.histograms import histogram_quantile as quantile
from tests.helpers.needs import shared_dir

BLOCKS, BLOCK_SIZE = 1001, 16  # 16,000 KV tokens: vLLM V1 sets one block aside as its null block
INTERACTIVE = Objective("interactive", 0.5, 0.05)
SLO = SloConfig((SloClass("interactive", 0.5, 0.05, ("chat-*",)),), {})  # the gauges' objectives: the tightest


def vllm_page(usage: float, waiting: int, prompt_tokens: int = 500, output_tokens: int = 100, finished: int = 10) -> str:
    """A vLLM page with the families admission reads; `finished` requests of the given sizes."""
    lines = [
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {usage}',
        "# TYPE vllm:num_requests_waiting gauge",
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}',
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{BLOCK_SIZE}",engine="0",num_gpu_blocks="{BLOCKS}"}} 1.0',
    ]
    for name, n in (("vllm:request_prompt_tokens", prompt_tokens), ("vllm:request_generation_tokens", output_tokens)):
        lines.append(f"# TYPE {name} histogram")
        for le in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000):
            lines.append(f'{name}_bucket{{engine="0",le="{le:.1f}",model_name="m"}} {finished if n <= le else 0}')
        lines.append(f'{name}_bucket{{engine="0",le="+Inf",model_name="m"}} {finished}')
        lines.append(f'{name}_count{{engine="0",model_name="m"}} {finished}')
        lines.append(f'{name}_sum{{engine="0",model_name="m"}} {finished * n}')
    return "\n".join(lines) + "\n"


def reading(usage: float, waiting: int = 0, **kw: Any) -> Reading:
    return read_engine(parse_page(vllm_page(usage, waiting, **kw), WANTED).families)


def test_seats_are_free_kv_tokens_over_the_p99_footprint() -> None:
    r = reading(0.25, waiting=3)
    assert r.free_tokens == pytest.approx(0.75 * (BLOCKS - 1) * BLOCK_SIZE) and r.waiting == 3
    assert quantile(0.99, r.prompt) == pytest.approx(497)  # 200 + 0.99 x 300: in the 200-500 bucket, interpolated
    gate = Admission("http://127.0.0.1:1")
    gate.update(r)
    assert gate.learned.footprint == pytest.approx(497 + 99.5)
    # a request holds whole blocks: 596.5 tokens take ceil(596.5 / 16) = 38 blocks, 608 tokens
    assert BLOCK_SIZE == 16 and gate.learned.seats == pytest.approx(12000 / 608)


def test_seats_count_whole_blocks_so_they_never_admit_a_request_that_would_not_fit() -> None:
    """127 free blocks of 32 and requests of 547 tokens (18 blocks each): seven fit, not the 7.4 a token count says."""
    gate = Admission("http://127.0.0.1:1", min_seats=1, max_queue=0)
    gate.update(Reading(127 * 32.0, 0.0, ((50.0, 100.0), (math.inf, 100.0)), ((500.0, 100.0), (math.inf, 100.0)), 32.0))
    assert gate.learned.footprint == pytest.approx(49.5 + 495) and gate.learned.seats == pytest.approx(127 / 18)
    assert [gate.admit() for _ in range(8)] == [True] * 7 + [False]


def test_the_footprint_comes_from_the_recent_window_with_a_fallback_before_any_request() -> None:
    now = [0.0]
    gate = Admission("http://127.0.0.1:1", window_s=60, fallback_footprint=3000, clock=lambda: now[0])
    gate.update(reading(0.0, finished=0))
    assert gate.learned.footprint == 3000 and gate.learned.seats == pytest.approx(16000 / 3008)  # 188 whole blocks of 16
    now[0] = 10
    gate.update(reading(0.0, prompt_tokens=50, output_tokens=10, finished=5))
    assert gate.learned.footprint == pytest.approx(49.7 + 9.95)
    # 100 long requests finish later: the window's delta is all long ones (the 5 short ones are before it)
    now[0] = 100
    gate.update(reading(0.0, prompt_tokens=1500, output_tokens=800, finished=105))
    assert gate.learned.footprint > 2000


def test_the_gate_refuses_at_the_floor_and_admits_again_when_seats_return() -> None:
    gate = Admission("http://127.0.0.1:1", min_seats=2, max_queue=4, clock=time.monotonic)
    assert gate.admit(), "no reading yet: the gate fails open"
    gate.update(reading(0.0))
    assert gate.learned.seats > 20 and gate.admit()
    gate.update(reading(0.95))  # 800 free tokens: about 1.3 seats of ~600
    assert not gate.is_open() and not gate.admit() and gate.state.health.refusals == 1
    gate.update(reading(0.5))
    assert gate.admit(), "seats returned"
    gate.update(reading(0.0, waiting=5, finished=11))  # the engine shows it (finished): its seat is retired
    assert not gate.admit(), "queue above the ceiling"
    gate.update(reading(0.84, waiting=2, finished=11))  # 2,560 free tokens: 4.2 seats of 608, 2 kept free
    assert gate.admit() and gate.admit() and gate.admit() and not gate.admit(), "admitted since the reading take seats"
    gate.update(reading(0.84, waiting=2, finished=11))
    assert not gate.admit(), "a reading that does not show the admitted keeps counting them (issue 34)"
    gate.update(reading(0.84, waiting=2, finished=14))
    assert gate.admit(), "one that shows them (3 more finished) retires them"


def test_below_capacity_a_burst_within_one_poll_is_admitted_whole() -> None:
    """Requests admitted since the reading take seats; they join the queue only beyond the free seats. The
    gate used to count each as queued, capping it at max_queue + 1 requests per poll however idle the
    engine (issue 25: a burst of 24 a real vLLM served at once got 19 refused)."""
    gate = Admission("http://127.0.0.1:1", min_seats=1, max_queue=4, clock=time.monotonic)
    gate.update(reading(0.0, waiting=0, prompt_tokens=8, output_tokens=16))  # 16,000 free tokens, ~24-token requests
    assert gate.learned.seats == 500  # two whole blocks of 16 a request
    burst = 10 * (gate.settings.max_queue + 1)  # ten times the old per-poll cap
    assert all(gate.admit() for _ in range(burst)) and gate.state.health.refusals == 0
    # a queue the engine reports still closes the gate, whatever the seats
    gate.update(reading(0.0, waiting=5, prompt_tokens=8, output_tokens=16))
    assert not gate.admit()


def test_a_burst_still_cannot_take_more_seats_than_the_reading_found_free() -> None:
    gate = Admission("http://127.0.0.1:1", min_seats=1, max_queue=100, clock=time.monotonic)
    gate.update(reading(0.5, waiting=0))  # 8,000 free tokens, footprint ~600 (608 in whole blocks): 13.2 seats
    admitted = sum(gate.admit() for _ in range(40))
    assert admitted == int(gate.learned.seats - gate.settings.min_seats) + 1 == 13, admitted
    assert gate.state.health.refusals == 27


def test_a_stale_reading_fails_open() -> None:
    now = [0.0]
    gate = Admission("http://127.0.0.1:1", poll_s=0.25, clock=lambda: now[0])
    gate.update(reading(1.0, waiting=100))
    assert not gate.admit(INTERACTIVE)
    now[0] = 10.0
    assert not gate.readable and gate.admit(INTERACTIVE)


def test_flags_and_their_defaults() -> None:
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    base = ["--listen", ":0", "--upstream", "http://x", "--metrics-listen", ":0"]
    a = p.parse_args(base)
    # the floors are the operator's overrides, off by default: the objectives decide
    assert not a.admission and a.admission_min_seats is None and a.admission_max_queue is None
    assert a.admission_poll_interval == 0.25 and a.admission_sheddable == [] and a.admission_shed_margin == 0.5
    a = p.parse_args(base + ["--admission", "--admission-min-seats", "2.5", "--admission-max-queue", "0",
                             "--admission-poll-interval", "0.1", "--admission-sheddable", "batch",
                             "--admission-sheddable", "bulk", "--admission-shed-margin", "0.25"])
    assert a.admission and a.admission_min_seats == 2.5 and a.admission_max_queue == 0
    assert a.admission_sheddable == ["batch", "bulk"] and a.admission_shed_margin == 0.25
    for bad in (["--admission-poll-interval", "0"], ["--admission-max-queue", "-1"], ["--admission-min-seats", "x"],
                ["--admission-shed-margin", "0"], ["--admission-shed-margin", "1.5"],
                ["--admission-shed-margin", "nan"]):
        with pytest.raises(SystemExit):
            p.parse_args(base + bad)


class FakeEngine:
    """A /metrics page that the test changes, and a switch that breaks it."""

    def __init__(self) -> None:
        self.page = vllm_page(0.0, 0)
        self.status = 200

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.page, status=self.status)


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


def test_the_poller_reads_the_engine_and_fails_open_when_it_cannot() -> None:
    async def go() -> None:
        engine = FakeEngine()
        app = web.Application()
        app.router.add_get("/metrics", engine.metrics)
        runner, url = await _serve(app)
        gate = Admission(url, poll_s=0.05, timeout_s=0.5, slo=SLO)
        try:
            assert await gate.poll() and gate.readable and gate.is_open()
            engine.page = vllm_page(0.99, 9)
            assert await gate.poll() and gate.is_open(), "a queue at one reading only is not a backlog"
            assert await gate.poll() and not gate.is_open(), "a full engine's backlog at two readings is"
            engine.status = 500
            assert not await gate.poll() and "500" in gate.state.health.last_error
            page = gate.render().decode()
            assert f"{C.TAP_ADMISSION_OPEN.name} 0" in page and f"{C.TAP_ADMISSION_ENGINE_READABLE.name} 1" in page
            gate.start()  # the poller keeps failing; once the last reading is stale the gate admits
            await asyncio.sleep(gate.settings.poll_s * 4 + gate.settings.timeout_s + 0.2)
            assert not gate.readable and gate.is_open()
            assert f"{C.TAP_ADMISSION_ENGINE_READABLE.name} 0" in gate.render().decode()
            engine.status = 200
            await asyncio.sleep(0.3)
            assert gate.readable and not gate.is_open(), "readable again: the full engine is refused again"
        finally:
            await gate.stop()
            await runner.cleanup()
        unreachable = Admission("http://127.0.0.1:1", timeout_s=0.5)
        try:
            assert not await unreachable.poll() and unreachable.admit()
        finally:
            await unreachable.stop()

    asyncio.run(go())


async def _post(url: str, body: dict[str, Any], **headers: str) -> tuple[int, bytes, Any]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url, data=json.dumps(body).encode(),
                          headers={"Content-Type": "application/json", **headers}) as r:
            return r.status, await r.read(), r.headers


def _chat() -> dict[str, Any]:
    return {"model": "chat-a", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def test_refused_with_429_and_retry_after_counted_and_admitted_streams_are_never_cut(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            gate = Admission(st.upstream_url, min_seats=1, max_queue=0)
            st.server.proxy.admission = gate
            st.server.renderer.extra = gate.render
            gate.update(reading(0.0))
            url = st.tap_url + "/v1/chat/completions"
            # A long stream admitted while the gate is open...
            slow = asyncio.ensure_future(_post(url, _chat(), **{"x-request-id": "slow", "x-test-chunks": "10",
                                                                 "x-test-delay-ms": "60"}))
            await asyncio.sleep(0.15)
            gate.update(reading(0.999, waiting=3))  # ...then the engine fills up
            status, body, headers = await _post(url, _chat(), **{"x-request-id": "refused"})
            # what an OpenAI client expects of a 429: JSON with the error's message, type and code
            assert status == 429 and headers["Retry-After"] == "1" and headers["Content-Type"] == "application/json"
            assert json.loads(body) == {"error": {
                "message": "The engine is at capacity (too few free KV-cache seats); retry after 1 s.",
                "type": "rate_limit_exceeded", "param": None, "code": C.REFUSED_ADMISSION_KV}}
            assert "refused" not in st.upstream.records, "a refused request never reaches the engine"
            async with aiohttp.ClientSession() as s:  # other paths are not gated
                async with s.get(st.tap_url + "/v1/models") as r:
                    assert r.status == 200
            status, body, _ = await slow
            assert status == 200 and body.endswith(b"data: [DONE]\n\n"), "the admitted stream ran to its end"
            gate.update(reading(0.2))  # seats return
            await asyncio.sleep(1.0)  # the client honours its Retry-After (before it, it is refused as early)
            status, _, _ = await _post(url, _chat(), **{"x-request-id": "again"})
            assert status == 200
            outcomes = sorted(r.outcome for r in st.records)
            assert outcomes == [C.OUTCOME_OK, C.OUTCOME_OK, C.OUTCOME_REFUSED]
            async with aiohttp.ClientSession() as s:
                async with s.get(st.metrics_url + "/metrics") as r:
                    page = await r.text()
            assert f'{C.TAP_REQUESTS.name}{{model="chat-a",slo_class="default",outcome="refused"}} 1' in page
            assert f"{C.TAP_ADMISSION_OPEN.name} 1" in page
            assert f'{C.TAP_REFUSALS.name}{{reason="{C.REFUSED_ADMISSION_KV}"}} 1' in page  # each refusal says why
            assert f'{C.TAP_REFUSALS.name}{{reason="{C.REFUSED_ADMISSION_QUEUE}"}} 0' in page

    asyncio.run(go())


def test_refused_is_a_bad_outcome_for_availability_and_goodput() -> None:
    assert C.OUTCOME_REFUSED in C.OUTCOMES and C.OUTCOME_REFUSED in C.TAP_BAD_OUTCOMES
    assert C.OUTCOME_REFUSED not in C.TAP_NEUTRAL_OUTCOMES + C.TAP_LATE_OUTCOMES


def test_every_engine_kind_with_kv_blocks_is_read_through_its_adapter() -> None:
    """Admission reads the engine through the exporter's adapters: every sample page whose adapter gives free KV
    blocks and the block size is gated (detected or named); the others are unreadable, and the gate fails open."""
    from tests.exporter.sample_pages import SAMPLE_PAGES, SHARED_PAGES

    shared_dir(SHARED_PAGES, "engine sample pages")
    readable = set()
    for page, kind in SAMPLE_PAGES.items():
        text = (SHARED_PAGES / page).read_text()
        try:
            named = read_engine(parse_page(text, wanted(kind)).families, kind)
        except EngineReadError:
            with pytest.raises(EngineReadError):
                read_engine(parse_page(text, WANTED).families)
            continue
        assert named == read_engine(parse_page(text, WANTED).families), page  # detected as the kind it is
        assert named.free_tokens > 0 and named.waiting >= 0, page
        readable.add(kind)
    assert readable == {"vllm", "sglang", "trtllm-triton", "trtllm-serve"}, readable  # TGI, llama.cpp: no KV blocks
    assert set(ENGINE_KINDS) == {"vllm", "sglang", "tgi", "trtllm-triton", "trtllm-serve", "llamacpp"}


def test_a_sglang_page_is_gated_like_a_vllm_one() -> None:
    page = "\n".join((
        "# TYPE sglang:num_queue_reqs gauge", 'sglang:num_queue_reqs{model_name="m"} 7',
        "# TYPE sglang:max_total_num_tokens gauge", 'sglang:max_total_num_tokens{model_name="m"} 16000',
        "# TYPE sglang:kv_available_tokens gauge", 'sglang:kv_available_tokens{model_name="m"} 10000',
        "# TYPE sglang:kv_evictable_tokens gauge", 'sglang:kv_evictable_tokens{model_name="m"} 2000',
        "# TYPE sglang:page_size gauge", 'sglang:page_size{model_name="m"} 16',
    )) + "\n"
    r = read_engine(parse_page(page, WANTED).families)
    assert r.waiting == 7 and r.free_tokens == 12000  # 750 pages of 16 tokens, the evictable ones included
    gate = Admission("http://127.0.0.1:1", fallback_footprint=1000, max_queue=4)
    gate.update(r)
    assert gate.learned.seats == pytest.approx(r.free_tokens / 1008) and not gate.is_open()  # 63 pages a request; 7 waiting > 4


def test_the_tap_learns_exact_request_sizes_and_counts_its_requests_in_flight(stack: Callable) -> None:
    """The seat estimate's inputs from the tap itself (exporter.tap.seats): each finished request's usage
    (prompt and completion tokens, exact) and each running request's output so far and max_tokens."""
    async def go() -> None:
        async with stack() as st:
            gate = Admission(st.upstream_url)
            st.server.proxy.admission = gate
            gate.in_flight = st.server.proxy.in_flight
            url = st.tap_url + "/v1/chat/completions"
            slow = asyncio.ensure_future(_post(url, {**_chat(), "max_tokens": 300}, **{
                "x-test-chunks": "10", "x-test-delay-ms": "50"}))
            await asyncio.sleep(0.2)
            (flight,) = st.server.proxy.in_flight()
            assert flight.max_tokens == 300 and 1 <= flight.produced < 10
            await slow
            for _ in range(MIN_SAMPLES):
                await _post(url, _chat(), **{"x-test-chunks": "3", "x-test-usage-tokens": "3"})
            assert st.server.proxy.in_flight() == []
            sizes = gate.sizes.sizes()
            assert sizes is not None and sizes.source == "tap"
            assert sizes.footprint == 7 + 10 and sizes.prompt_mean == 7  # the stub engine's usage: 7 prompt tokens
            gate.update(reading(0.5))  # the exact sizes win over the page's histograms
            assert gate.learned.footprint == 17

    asyncio.run(go())


def test_an_implausible_prompt_count_is_not_learned_as_a_size(stack: Callable) -> None:
    """usage.prompt_tokens far beyond the request's bytes (a lying or broken engine) would inflate the footprint
    and close the gate for everyone: it is not taken."""
    from exporter.tap import policy
    from exporter.tap.http1 import RequestHead
    from exporter.tap.timing import RequestTiming

    async def go() -> None:
        async with stack() as st:
            gate = Admission(st.upstream_url)
            proxy = st.server.proxy
            proxy.admission = gate
            plan = policy.Plan("chat-a", True, False, proxy.slo.resolve({}, "chat-a"), 100, 1, request_bytes=500)
            for prompt in (40, 500 + policy.PROMPT_TOKENS_OVER_BYTES + 1):
                timing = RequestTiming(arrival=0.0)
                timing.on_usage(10, prompt)
                head = RequestHead(b"POST", b"/v1/chat/completions", b"1.1", [])
                proxy.record(policy.finish(head, plan, timing, C.OUTCOME_OK, 200, True, 1000, "chat-a"))
            assert list(gate.sizes._ring) == [(40, 10)]

    asyncio.run(go())
