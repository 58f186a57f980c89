"""No failure hides from the SLIs: a hung or stalled engine ends in `upstream_timeout`, a client that
gave up on a late request in `client_gave_up`, and only a client leaving while on time is neutral."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.deadlines import DeadlineError, derive_deadlines
from exporter.tap.policy import gave_up
from exporter.tap.timing import RequestTiming
from llmslo import conventions as C
from tests.tap.test_faults import body, wait_for

CHAT = "/v1/chat/completions"
CLASSES = SloConfig((SloClass("interactive", 0.5, 0.05, ("chat-*",)),), {"ttft": (0.5,), "tpot": (0.05,), "e2e": ()})




# -- deadlines derived from the objectives -------------------------------------------------------
def test_default_deadlines_are_floors_or_ten_times_the_largest_objective() -> None:
    d = derive_deadlines(CLASSES)
    assert (d.first_token_s, d.stall_s, d.response_s) == (60.0, 30.0, 600.0)
    slow = SloConfig((SloClass("batch", 30.0, 4.0),), {"ttft": (30.0,), "tpot": (4.0,), "e2e": (90.0,)})
    d = derive_deadlines(slow)
    assert (d.first_token_s, d.stall_s, d.response_s) == (300.0, 40.0, 900.0)


@pytest.mark.parametrize(("kw", "flag", "objective"), [
    ({"first_token_s": 0.5}, "--first-token-timeout", 0.5),
    ({"first_token_s": 0.2}, "--first-token-timeout", 0.5),
    ({"stall_s": 0.05}, "--stall-timeout", 0.05),
    ({"response_s": 0.4}, "--response-timeout", 0.5),
])
def test_a_deadline_never_shorter_than_its_objective(kw: dict[str, float], flag: str, objective: float) -> None:
    with pytest.raises(DeadlineError) as e:
        derive_deadlines(CLASSES, **kw)
    assert flag in str(e.value) and "still on time" in str(e.value)
    (name,) = kw
    assert getattr(derive_deadlines(CLASSES, **{name: objective * 1.01}), name) == objective * 1.01


def test_cli_refuses_a_deadline_shorter_than_an_objective(tmp_path: Any) -> None:
    from exporter.tap.cli import main

    slo = tmp_path / "slo.yaml"
    slo.write_text('version: prometheus/v1\nservice: s\nslos:\n- name: g\n  objective: 99\n  sli:\n    plugin:\n'
                   '      id: llmslo/goodput\n      options: {slo_class: i, ttft: "2", tpot: "0.1"}\n')
    rc = main(["--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1", "--metrics-listen", "127.0.0.1:0",
               "--slo", str(slo), "--first-token-timeout", "1.5"])
    assert rc == 2


# -- the gave-up rule, as a pure function ----------------------------------------------------------
def _timing(first: float | None = None, events: int = 0) -> RequestTiming:
    t = RequestTiming(arrival=0.0)
    if first is not None:
        for i in range(events):
            t.on_output_event(first + 0.01 * i)
    return t


@pytest.mark.parametrize(("timing", "now", "streamed", "max_tokens", "expected"), [
    (_timing(), 0.4, True, None, False),  # no token yet, TTFT objective (0.5) not passed: on time
    (_timing(), 0.6, True, None, True),  # no token and the TTFT objective passed
    (_timing(0.6, 3), 0.7, True, None, True),  # the first token itself came late
    (_timing(0.1, 3), 0.2, True, None, False),  # (0.2 - 0.1) / 3 = 0.033 <= 0.05: streaming on time
    (_timing(0.1, 3), 0.5, True, None, True),  # (0.5 - 0.1) / 3 = 0.133 > 0.05: too slow when it left
    (_timing(), 3.0, False, None, False),  # not streamed, no max_tokens: a good answer could still come
    (_timing(), 3.0, False, 100, False),  # 0.5 + 99 x 0.05 = 5.45 s: still possible
    (_timing(), 6.0, False, 100, True),  # past it
])
def test_gave_up_only_once_the_objective_can_no_longer_be_met(
    timing: RequestTiming, now: float, streamed: bool, max_tokens: int | None, expected: bool
) -> None:
    assert gave_up(timing, now, 0.5, 0.05, streamed, max_tokens) is expected


def test_without_objectives_a_client_never_gives_up() -> None:
    assert not gave_up(_timing(), 1e6, None, None, True, None)
    assert not gave_up(_timing(0.1, 2), 1e6, None, None, True, None)


# -- a hung engine, through a real tap ----------------------------------------------------------------
def test_engine_hung_before_its_response_head_gets_504_and_upstream_timeout(stack: Callable) -> None:
    async def go() -> None:
        async with stack(slo=CLASSES, first_token_timeout_s=0.6) as st:
            async with aiohttp.ClientSession() as s:
                t0 = time.monotonic()
                async with s.post(st.tap_url + CHAT, data=body(), headers={"x-request-id": "h", "x-test-hang-ms": "60000"}) as r:
                    assert r.status == 504
                    assert b"first token" in await r.read()
                waited = time.monotonic() - t0
            assert 0.6 <= waited < 5.0
            rec = st.upstream.records.get("h")
            await wait_for(lambda: len(st.records) == 1)
            assert st.records[0].outcome == C.OUTCOME_UPSTREAM_TIMEOUT and not st.records[0].good
            assert st.value(C.TAP_REQUESTS.name, outcome=C.OUTCOME_UPSTREAM_TIMEOUT) == 1
            # The engine's request is cancelled: the tap closed the upstream connection.
            await wait_for(lambda: rec is not None and rec.cancelled or "h" not in st.upstream.records)

    asyncio.run(go())


def test_engine_that_starts_a_stream_but_never_sends_a_token_is_broken_off(stack: Callable) -> None:
    """The role chunk (headers and bytes) went out: too late for a 504, so the stream is cut as for a break."""

    async def go() -> None:
        async with stack(slo=CLASSES, first_token_timeout_s=0.6) as st:
            async with aiohttp.ClientSession() as s:
                r = await s.post(st.tap_url + CHAT, data=body(), headers={"x-request-id": "r", "x-test-first-ms": "60000"})
                assert r.status == 200
                assert b"assistant" in await r.content.readuntil(b"\n\n")
                with pytest.raises(aiohttp.ClientPayloadError):
                    await r.read()
            await wait_for(lambda: len(st.records) == 1)
            assert st.records[0].outcome == C.OUTCOME_UPSTREAM_TIMEOUT
            await wait_for(lambda: st.upstream.records["r"].cancelled)

    asyncio.run(go())


def test_stream_that_stalls_mid_way_is_broken_off(stack: Callable) -> None:
    async def go() -> None:
        async with stack(slo=CLASSES, stall_timeout_s=0.5) as st:
            async with aiohttp.ClientSession() as s:
                r = await s.post(st.tap_url + CHAT, data=body(), headers={
                    "x-request-id": "s", "x-test-chunks": "3", "x-test-delay-ms": "60000"})
                await r.content.readuntil(b"\n\n")  # role
                assert b"tok0" in await r.content.readuntil(b"\n\n")
                with pytest.raises(aiohttp.ClientPayloadError):
                    await r.read()
            await wait_for(lambda: len(st.records) == 1)
            assert st.records[0].outcome == C.OUTCOME_UPSTREAM_TIMEOUT
            assert st.records[0].timings.ttft is not None  # it got a token, then nothing

    asyncio.run(go())


def test_non_streamed_request_with_no_response_gets_504(stack: Callable) -> None:
    async def go() -> None:
        async with stack(slo=CLASSES, response_timeout_s=0.6) as st:
            async with aiohttp.ClientSession() as s:
                async with s.post(st.tap_url + CHAT, data=body(stream=False), headers={"x-test-hang-ms": "60000"}) as r:
                    assert r.status == 504
                # Untimed paths get the same deadline on their response head (not accounted).
            await wait_for(lambda: len(st.records) == 1)
            assert st.records[0].outcome == C.OUTCOME_UPSTREAM_TIMEOUT

    asyncio.run(go())


def test_a_slow_client_is_not_taken_for_a_stalled_engine(stack: Callable) -> None:
    """While the client does not read, the upstream is paused: that silence is not the engine's."""

    async def go() -> None:
        async with stack(slo=CLASSES, stall_timeout_s=0.4) as st:
            reader, writer = await asyncio.open_connection(*st.tap_url.removeprefix("http://").split(":"))
            payload = body()
            writer.write(b"POST %s HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\nx-test-chunks: 400\r\n"
                         b"x-test-chunk-bytes: 16384\r\nx-request-id: slow\r\n\r\n%s" % (CHAT.encode(), len(payload), payload))
            await writer.drain()
            await asyncio.sleep(1.5)  # not reading: socket buffers fill, the tap pauses the upstream
            got = 0
            while True:
                data = await reader.read(1 << 20)
                if not data:
                    break
                got += len(data)
                if b"0\r\n\r\n" in data[-7:]:
                    break
            writer.close()
            await wait_for(lambda: len(st.records) == 1)
            assert st.records[0].outcome == C.OUTCOME_OK, st.records[0].outcome
            assert got > 400 * 16384

    asyncio.run(go())


# -- clients that leave ----------------------------------------------------------------------------
def test_client_leaving_after_the_ttft_objective_passed_gave_up(stack: Callable) -> None:
    """The TTFT objective is 0.5 s: leaving at 0.1 s is the client's choice, at 0.9 s the service's failure."""

    async def go() -> None:
        async with stack(slo=CLASSES) as st:
            async with aiohttp.ClientSession() as s:
                for rid, wait in (("early", 0.1), ("late", 0.9)):
                    with pytest.raises(asyncio.TimeoutError):
                        await asyncio.wait_for(
                            s.post(st.tap_url + CHAT, data=body(), headers={"x-request-id": rid, "x-test-hang-ms": "5000"}),
                            wait,
                        )
            await wait_for(lambda: len(st.records) == 2)
            outcome = {r.request_id: r.outcome for r in st.records}
            assert outcome == {"early": C.OUTCOME_CLIENT_DISCONNECTED, "late": C.OUTCOME_CLIENT_GAVE_UP}
            assert st.value(C.TAP_REQUESTS.name, outcome=C.OUTCOME_CLIENT_GAVE_UP) == 1

    asyncio.run(go())


def test_client_leaving_a_stream_slower_than_its_tpot_objective_gave_up(stack: Callable) -> None:
    async def go() -> None:
        async with stack(slo=CLASSES) as st:
            async with aiohttp.ClientSession() as s:
                for rid, delay in (("steady", "5"), ("crawling", "300")):
                    r = await s.post(st.tap_url + CHAT, data=body(), headers={
                        "x-request-id": rid, "x-test-chunks": "50", "x-test-delay-ms": delay})
                    await r.content.readuntil(b"\n\n")  # role
                    for _ in range(3):
                        await r.content.readuntil(b"\n\n")
                    r.close()
            await wait_for(lambda: len(st.records) == 2)
            outcome = {r.request_id: r.outcome for r in st.records}
            assert outcome == {"steady": C.OUTCOME_CLIENT_DISCONNECTED, "crawling": C.OUTCOME_CLIENT_GAVE_UP}

    asyncio.run(go())
