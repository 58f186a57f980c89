"""Slowloris at scale against the real tap process (`python -m exporter.tap --head-timeout 1`).

1,000 connections trickle never-ending request heads, a byte every 0.2-0.4 s, and reconnect
whenever the tap closes them; meanwhile 300 legitimate streamed requests, each on a new
connection, must arrive whole. The trickling connections never pause as long as the head
timeout, so only a deadline on the whole head (not one per read) can close them: each must get
its 408, and the tap must count them in llm_tap_refusals_total{reason="head_timeout"}.
The benchmark's version (default settings, old tap alongside): `python -m bench tap-abuse`.
"""

from __future__ import annotations

import asyncio
import collections
import random
import re
import resource
import time
from typing import TYPE_CHECKING

import pytest

from bench.slowloris import Fleet, read_chunked, refusals
from tests.tap.conftest import spawn_cli_tap

if TYPE_CHECKING:
    from tests.tap.conftest import Proc  # the upstream_proc fixture's type

TRICKLERS = 1000
LEGIT = 300
LEGIT_SPREAD_S = 3.0  # the legitimate requests start evenly over this long
HEAD_TIMEOUT_S = 1.0
TRICKLE_GAP_S = (0.2, 0.4)  # well under the head timeout: an idle timeout would never fire
GUARD_S = 30.0  # against hangs only; nothing is asserted about time
TRICKLE_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n" + b"X-Trickle: 1\r\n" * 2000  # never ends
BODY = b'{"model":"chat-a","stream":true,"messages":[{"role":"user","content":"hi"}]}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nx-test-chunks: 3\r\n"
    b"x-test-delay-ms: 10\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)


async def _legit(port: int) -> str:
    """One streamed request on a new connection: "ok" when the whole stream arrived, else what went wrong."""
    writer = None
    try:
        async with asyncio.timeout(GUARD_S):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(REQUEST)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head.split(b" ", 2)[1].decode()
            if status != "200":
                return f"status {status}"
            body = await read_chunked(reader)
            tokens = re.findall(rb'"content":"(tok\d) "', body)
            if tokens != [b"tok0", b"tok1", b"tok2"] or not body.endswith(b"data: [DONE]\n\n"):
                return f"incomplete stream: {tokens}"
            return "ok"
    except TimeoutError:
        return "hung"
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        return type(e).__name__
    finally:
        if writer is not None:
            writer.transport.abort()


async def _scenario(port: int, metrics_url: str) -> tuple[collections.Counter[str], Fleet, int, dict[str, float],
                                                          dict[str, float]]:
    before = await asyncio.to_thread(refusals, metrics_url)
    fleet = Fleet(port, TRICKLE_HEAD, TRICKLE_GAP_S, random.Random(7))
    for first in range(0, TRICKLERS, 100):
        await asyncio.gather(*(fleet.open(slot) for slot in range(first, first + 100)))
    tasks = []
    start = time.monotonic()
    for i in range(LEGIT):
        await asyncio.sleep(max(0.0, start + i * LEGIT_SPREAD_S / LEGIT - time.monotonic()))
        tasks.append(asyncio.ensure_future(_legit(port)))
    results = collections.Counter(await asyncio.gather(*tasks))
    # Every trickling connection has been open for longer than the head timeout by now; wait for the last answers.
    deadline = time.monotonic() + GUARD_S
    while len(fleet.slots_answered) < TRICKLERS and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    answered = sum(fleet.answers.values())  # each counted by the tap before it was sent
    after = await asyncio.to_thread(refusals, metrics_url)
    fleet.stop()
    return results, fleet, answered, before, after


def test_slowloris_does_not_starve_legitimate_streams(upstream_proc: Proc) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"open-file hard limit {hard}: this test holds {TRICKLERS} connections at each end")
    if soft != resource.RLIM_INFINITY and soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536, hard))
    tap = spawn_cli_tap(upstream_proc.url, "--head-timeout", str(HEAD_TIMEOUT_S))
    try:
        results, fleet, answered, before, after = asyncio.run(_scenario(tap.port, tap.metrics_url))
    finally:
        tap.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    # The legitimate streams arrived whole (at least 99% of them).
    assert results["ok"] >= LEGIT * 99 // 100, results
    # Every trickling connection was answered 408, although none ever paused as long as the head timeout ...
    assert len(fleet.slots_answered) == TRICKLERS
    assert set(fleet.answers) == {"408"}, fleet.answers
    assert min(fleet.bytes_before_answer) >= 1  # ... and each had been sending bytes (trickling, not idle)
    # ... and the tap counted each of those refusals by its reason.
    grown = after["head_timeout"] - before["head_timeout"]
    assert grown >= answered >= TRICKLERS, (before, after, answered)
    assert after["connection_limit"] == before["connection_limit"]
