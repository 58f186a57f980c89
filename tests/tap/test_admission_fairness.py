"""Issue 34, fairness: Retry-After says when a seat is expected, a client back before its time is refused again
(exporter.tap.turns), and a client retrying faster than told gains nothing over one that honours it.

The attack, before: Retry-After was always 1 s; a client honouring it, next to one holding the KV with long streams
and retrying every 0.2 s, was refused again and again while the hog took the seats that freed."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable

import aiohttp
import pytest

from bench import bench_tap_admission as rt
from exporter.tap.admission import Admission
from exporter.tap.turns import GRACE_S, ClientKeys, Turns, header_name
from llmslo import conventions as C
from simulator.config import EngineConfig
from tests.tap.gate_harness import Client, run_clients
from tests.tap.test_admission import _chat, _post
from tests.tap.test_admission_predict import CHAT, SLO, Clock, engine

SECONDS = 120.0  # of virtual time
HOG = dict(streams=8, prompt=200, output=1500)  # long streams: the KV holds about five


def _run(hog_retry_s: float | None) -> dict:
    config = EngineConfig(served_model_name=rt.MODEL, num_gpu_blocks_override=rt.KV_BLOCKS)
    clients = [Client("hog", retry_s=hog_retry_s, **HOG), Client("polite", 1, 200, 100)]  # type: ignore[arg-type]
    return run_clients(config, clients, SECONDS, slowdown=rt.SLOWDOWN)


def test_a_client_retrying_every_0_2_s_gains_nothing_and_the_polite_one_is_refused_less() -> None:
    """On the bench's engine (600 KV blocks) in virtual time, a hog keeps 8 streams of 1,500 tokens going and
    retries every 0.2 s; a polite client keeps one short request going and honours Retry-After. Before (Retry-After
    always 1 s, no turns): the polite client 16 admitted and 82 refused (5.1 a request, 23 for one), the hog 34
    (36 when it honoured Retry-After too). Now: the polite client 18 admitted and 35 refused, the hog 34 (36)."""
    fast, told = _run(0.2), _run(None)
    hog, polite = fast["hog"], fast["polite"]
    assert hog.admitted <= told["hog"].admitted, "retrying faster than told takes no more seats"
    assert hog.early > 0.9 * hog.refused, "nearly all its retries came early and were refused as such"
    assert polite.early == 0 and polite.admitted >= 16
    assert polite.refused < 2 * polite.admitted, (polite.refused, polite.admitted)  # was 82 for 16
    assert len(set(polite.retry_after)) > 2 and max(polite.retry_after) > 1, "Retry-After follows the gate"


def _learned(finished_per_poll: float, waiting: float) -> Admission:
    """A gate that has read the engine for 31 s (the finish rate's longest span): KV full, `waiting` queued, finishing `finished_per_poll` a reading."""
    clock = Clock()
    gate = Admission("http://127.0.0.1:1", clock=clock, slo=SLO)
    for t in range(125):
        clock.now = t * 0.25
        gate.update(engine(clock.now, 0.0, waiting=waiting, finished=100 + finished_per_poll * t))
    return gate


def test_retry_after_is_when_a_seat_is_expected() -> None:
    """A backlog the engine drains in well under a second says 1 s; the same backlog behind long streams that
    finish one a second says the seconds until it is through (whole, at most 30)."""
    fast = _learned(10.0, waiting=30).decide_ticket(CHAT, SLO, "a:10.0.0.1")
    slow = _learned(0.25, waiting=10).decide_ticket(CHAT, SLO, "a:10.0.0.1")
    stuck = _learned(0.25, waiting=100).decide_ticket(CHAT, SLO, "a:10.0.0.1")
    assert fast.refusal == slow.refusal == C.REFUSED_ADMISSION_TTFT
    assert fast.retry_after_s == 1  # 31 ahead at 40 a second: 0.78 s of wait, 0.28 s past the 0.5 s objective
    assert slow.retry_after_s == 11  # 11 ahead at 1 a second, less the objective: 10.5 s
    assert stuck.retry_after_s == 30


def test_a_client_back_early_is_refused_with_the_time_left_and_goes_behind_those_that_waited() -> None:
    gate = _learned(0.25, waiting=2)
    clock = gate.clock
    objective = CHAT
    first = gate.decide_ticket(objective, SLO, "a:10.0.0.1")
    second = gate.decide_ticket(objective, SLO, "a:10.0.0.2")
    assert first.refusal and second.refusal and second.retry_after_s >= first.retry_after_s
    clock.now += 0.5  # type: ignore[attr-defined]
    early = gate.decide_ticket(objective, SLO, "a:10.0.0.1")
    assert early.refusal == C.REFUSED_ADMISSION_EARLY
    assert early.retry_after_s == first.retry_after_s  # the time left (0.5 s less), rounded up
    assert list(gate.state.turns._line) == ["a:10.0.0.2", "a:10.0.0.1"], "the early one went to the back"
    # the engine frees one seat: the client that waited as told is owed it, the early one (due too) is not
    clock.now += second.retry_after_s  # type: ignore[attr-defined]
    gate.update(engine(clock.now, 16 * 700.0, waiting=0, finished=132))  # type: ignore[attr-defined]
    gate.learned.start_seats = gate.learned.seats = 1.0  # one seat, still a finish a second
    assert gate.decide_ticket(objective, SLO, "a:10.0.0.3").refusal, "a newcomer waits behind the turns due"
    assert gate.decide_ticket(objective, SLO, "a:10.0.0.2").refusal == ""


def test_clients_are_told_apart_by_address_or_only_a_trusted_header() -> None:
    keys, trusting = ClientKeys(), ClientKeys(header_name("X-User"))
    with pytest.raises(argparse.ArgumentTypeError, match="not a header name"):
        header_name("x user")
    assert keys.header is None and trusting.header == b"x-user"
    assert keys.key(("10.0.0.1", 5000)) == keys.key(("10.0.0.1", 6000)) == "a:10.0.0.1"
    assert keys.key(("::ffff:10.0.0.1", 1, 0, 0)) == "a:10.0.0.1"
    assert keys.key(("2001:db8::1", 1, 0, 0)) == keys.key(("2001:db8::ffff", 1, 0, 0)), "one host's /64"
    assert keys.key(("2001:db8:0:1::1", 1, 0, 0)) != keys.key(("2001:db8::1", 1, 0, 0))
    assert keys.key("") == keys.key(None) == "", "a unix socket's client has no turn"
    alice, bob = trusting.key(("10.0.0.9", 1), b"alice"), trusting.key(("10.0.0.9", 1), b"bob")
    assert alice != bob and alice.startswith("h:") and "alice" not in alice
    assert trusting.key(("10.0.0.9", 1), None) == "a:10.0.0.9", "no header: the address"


def test_the_line_is_bounded_and_a_flood_replaces_only_its_back() -> None:
    turns = Turns(max_clients=3)
    for i, name in enumerate(("first", "second", "third", "flood-1", "flood-2")):
        turns.refused(name, float(i) * 0.01, 5.0)
    assert list(turns._line) == ["first", "second", "flood-2"] and len(turns) == 3
    assert turns.ahead("flood-2", 5.5) == (2, 2)  # both ahead are due (within a second of their time)
    assert turns.ahead("x", 5.0 + GRACE_S + 1) == (0, 0) and len(turns) == 0, "turns not taken lapse"
    turns.refused("first", 0.0, 5.0)
    assert turns.early("first", 1.0) == pytest.approx(4.0) and turns.early("first", 4.96) == 0.0


def test_an_early_retry_on_the_wire_is_429_with_the_time_left(stack: Callable) -> None:
    async def go() -> None:
        async with stack(slo=SLO) as st:
            gate = _learned(0.25, waiting=10)
            st.server.proxy.admission = gate
            st.server.renderer.extra = gate.render
            url = st.tap_url + "/v1/chat/completions"
            status, _, headers = await _post(url, _chat())
            assert status == 429 and headers["Retry-After"] == "11"
            status, body, headers = await _post(url, _chat())
            assert status == 429 and headers["Retry-After"] == "11", "the time left (the clock stood still)"
            error = json.loads(body)["error"]
            assert error["code"] == C.REFUSED_ADMISSION_EARLY and "retry after 11 s" in error["message"]
            async with aiohttp.ClientSession() as s:
                async with s.get(st.metrics_url + "/metrics") as r:
                    page = await r.text()
            assert f'{C.TAP_REFUSALS.name}{{reason="{C.REFUSED_ADMISSION_EARLY}"}} 1' in page

    asyncio.run(go())
