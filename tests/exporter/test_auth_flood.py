"""Authentication cannot starve a scrape (issue #14, item 4).

bcrypt is made controllable here (a fake check that blocks until the test releases it), so the
mechanism is tested without timing: a credential that worked before is answered while every bcrypt
thread is stuck, the checks run in their own bounded pool (never the default one), and a full queue is
answered 429 at once. How long a real scrape takes under a real flood is a benchmark
(`python -m bench auth-flood`, BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from exporter import checkqueue, webconfig
from exporter import server as server_module
from exporter.server import BCRYPT_POOL, start_server
from exporter.webconfig import Authenticator, WebConfig
from tests.exporter.test_server import LOOPBACK, PLAIN_HTTP, basic, get, hashed, ready_holder, write

PASSWORD = "s3cret"


class FakeBcrypt:
    """Stands in for bcrypt: the right password passes at once; any other blocks until `release`."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[str] = []
        self.threads: set[str] = set()
        self.running = 0
        self.most_running = 0
        self.blocked = threading.Semaphore(0)  # one release per check that started blocking
        self._lock = threading.Lock()

    def __call__(self, password: str, hashed_password: bytes) -> bool:
        with self._lock:
            self.calls.append(password)
            self.threads.add(threading.current_thread().name)
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            if password == PASSWORD:
                return True
            self.blocked.release()
            assert self.release.wait(30), "the test never released the blocked checks"
            return False
        finally:
            with self._lock:
                self.running -= 1


@pytest.fixture
def fake_bcrypt(monkeypatch) -> FakeBcrypt:
    fake = FakeBcrypt()
    monkeypatch.setattr(webconfig, "_checkpw", fake)
    return fake


async def wait_for(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.005)


@asynccontextmanager
async def _serving(cfg: Path, fake_bcrypt) -> AsyncIterator[tuple[str, Any]]:
    """The exporter's server with the web config `cfg`: its /metrics URL and its bcrypt pool. On the way out
    every blocked check is released first, so that stopping never waits on one."""
    server = await start_server(ready_holder(), LOOPBACK, str(cfg))
    try:
        yield f"http://127.0.0.1:{server.port}/metrics", server.runner.app[BCRYPT_POOL]
    finally:
        fake_bcrypt.release.set()
        await server.stop()


def test_a_cached_credential_is_answered_while_every_bcrypt_thread_is_blocked(tmp_path, fake_bcrypt):
    cfg = write(tmp_path / "web.yml", f"{PLAIN_HTTP}basic_auth_users:\n  alice: '{hashed(PASSWORD)}'\n")

    async def go():
        async with _serving(cfg, fake_bcrypt) as (url, pool):
            first = (await get(url, basic("alice", PASSWORD)))[0]  # checked once, then cached
            flood = [asyncio.create_task(get(url, basic("alice", f"wrong-{i}"))) for i in range(4)]
            await wait_for(lambda: pool.pending == 4, "the wrong passwords never queued")
            await asyncio.to_thread(fake_bcrypt.blocked.acquire)  # a bcrypt thread is stuck in a check
            checks_before = len(fake_bcrypt.calls)
            during = (await get(url, basic("alice", PASSWORD)))[0]
            still_blocked = pool.pending == 4 and not any(t.done() for t in flood)
            checks_during = len(fake_bcrypt.calls) - checks_before
            fake_bcrypt.release.set()
            flooded = [status for status, _, _ in await asyncio.gather(*flood)]
            return first, during, still_blocked, checks_during, flooded

    first, during, still_blocked, checks_during, flooded = asyncio.run(go())
    assert first == 200
    assert during == 200 and still_blocked  # answered while all four checks were still waiting
    assert checks_during == 0  # from the cache: no bcrypt
    assert flooded == [401] * 4
    assert fake_bcrypt.most_running == checkqueue.WORKERS  # bounded
    assert fake_bcrypt.threads and all(name.startswith("llmslo-bcrypt") for name in fake_bcrypt.threads)


def test_a_full_queue_is_answered_429_without_a_check(tmp_path, fake_bcrypt):
    cfg = write(tmp_path / "web.yml", f"{PLAIN_HTTP}basic_auth_users:\n  alice: '{hashed(PASSWORD)}'\n")

    async def go():
        async with _serving(cfg, fake_bcrypt) as (url, pool):
            pool.max_per_source = 3
            assert (await get(url, basic("alice", PASSWORD)))[0] == 200
            flood = [asyncio.create_task(get(url, basic("alice", f"wrong-{i}"))) for i in range(3)]
            await wait_for(lambda: pool.pending == 3, "the wrong passwords never queued")
            # the bcrypt thread is inside the first wrong check (counted) before the count is taken
            await asyncio.to_thread(fake_bcrypt.blocked.acquire)
            checks = len(fake_bcrypt.calls)
            over = await get(url, basic("alice", "one-more"))
            unknown_user = await get(url, basic("mallory", "x"))
            cached = (await get(url, basic("alice", PASSWORD)))[0]
            checked_meanwhile = len(fake_bcrypt.calls) - checks
            fake_bcrypt.release.set()
            await asyncio.gather(*flood)
            after = (await get(url, basic("alice", "one-more")))[0]  # room again: checked, and wrong
            return over, unknown_user, cached, checked_meanwhile, after

    over, unknown_user, cached, checked_meanwhile, after = asyncio.run(go())
    assert over[0] == unknown_user[0] == 429 and over[2]["Retry-After"] == "1"
    assert cached == 200
    assert checked_meanwhile == 0
    assert after == 401


def test_a_flood_from_one_source_leaves_room_for_a_client_seen_for_the_first_time(tmp_path, fake_bcrypt):
    """20 wrong passwords at once from 127.0.0.1 hold at most MAX_PER_SOURCE places (the rest get 429);
    a user no check has seen yet, from 127.0.0.2, is queued and checked, not refused."""
    cfg = write(tmp_path / "web.yml", f"{PLAIN_HTTP}basic_auth_users:\n  alice: '{hashed(PASSWORD)}'\n  bob: '{hashed(PASSWORD)}'\n")

    async def go():
        async with _serving(cfg, fake_bcrypt) as (url, pool):
            flood = [asyncio.create_task(get(url, basic("alice", f"wrong-{i}"))) for i in range(20)]
            await wait_for(lambda: pool.pending + sum(t.done() for t in flood) == 20, "the flood never settled")
            held = pool.pending
            newcomer = asyncio.create_task(get(
                url, basic("bob", PASSWORD), connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))))
            await wait_for(lambda: pool.pending == held + 1 or newcomer.done(), "the newcomer was neither queued nor answered")
            fake_bcrypt.release.set()
            flooded = sorted(status for status, _, _ in await asyncio.gather(*flood))
            return held, (await newcomer)[0], flooded

    held, newcomer, flooded = asyncio.run(go())
    assert newcomer == 200
    assert held == checkqueue.MAX_PER_SOURCE
    assert flooded == [401] * held + [429] * (20 - held)


def test_the_default_thread_pool_is_never_used_for_bcrypt(tmp_path, fake_bcrypt, monkeypatch):
    used = []
    real_to_thread = asyncio.to_thread

    async def recording_to_thread(fn, *args, **kwargs):
        used.append(getattr(fn, "__qualname__", repr(fn)))
        return await real_to_thread(fn, *args, **kwargs)

    monkeypatch.setattr(server_module.asyncio, "to_thread", recording_to_thread)
    cfg = write(tmp_path / "web.yml", f"{PLAIN_HTTP}basic_auth_users:\n  alice: '{hashed(PASSWORD)}'\n")

    async def go():
        server = await start_server(ready_holder(), LOOPBACK, str(cfg))
        try:
            return (await get(f"http://127.0.0.1:{server.port}/metrics", basic("alice", PASSWORD)))[0]
        finally:
            await server.stop()

    assert asyncio.run(go()) == 200
    assert not [name for name in used if "check" in name or "verify" in name]
    assert fake_bcrypt.threads and all(name.startswith("llmslo-bcrypt") for name in fake_bcrypt.threads)


def test_wrong_passwords_never_evict_a_credential_that_worked(fake_bcrypt):
    fake_bcrypt.release.set()  # wrong passwords fail at once here
    auth = Authenticator(WebConfig(path="web.yml", basic_auth_users={"alice": hashed(PASSWORD)}))
    right = basic("alice", PASSWORD)["Authorization"]
    assert auth.cached(right) is None and auth.verify(right) is True and auth.cached(right) is True
    for i in range(1000):
        assert auth.check(basic("alice", f"wrong-{i}")["Authorization"]) is False
    assert auth.cached(right) is True  # the flood filled only the failures' cache
    retried = basic("alice", "wrong-999")["Authorization"]
    calls = len(fake_bcrypt.calls)
    assert [auth.check(retried) for _ in range(5)] == [False] * 5
    assert len(fake_bcrypt.calls) == calls  # a retried wrong password costs one check, not one per request
    assert auth.cached(basic("alice", "wrong-0")["Authorization"]) is None  # the oldest failures make room


def test_a_changed_password_is_checked_again(fake_bcrypt):
    auth = Authenticator(WebConfig(path="web.yml", basic_auth_users={"alice": hashed(PASSWORD)}))
    right = basic("alice", PASSWORD)["Authorization"]
    assert auth.check(right) is True
    rotated = Authenticator(WebConfig(path="web.yml", basic_auth_users={"alice": hashed("other")}))
    assert rotated.cached(right) is None  # a reloaded web config starts with empty caches
    # The cache key holds the stored hash: the same header against another hash is a new check.
    auth.web.basic_auth_users["alice"] = hashed("other")
    assert auth.cached(right) is None


# ------------------------------------------------------------------------------------------------------
# A flood of wrong passwords from many source addresses while a client with uncached credentials scrapes
# ------------------------------------------------------------------------------------------------------
CHECK_S = 0.02  # added to each real check (cost-4 hashes): a cost-10 check's time, without taking a core
FLOOD_CONNECTIONS_PER_SOURCE = 6  # more than one source may queue: some of each source's requests are refused
LEGIT_SCRAPES = 8
PROMETHEUS_TIMEOUT_S = 10.0  # Prometheus' default scrape_timeout


class SlowCheck:
    """The real bcrypt check plus CHECK_S of sleep, counted."""

    def __init__(self) -> None:
        self.real = webconfig._checkpw
        self.checks = 0

    def __call__(self, password: str, hashed_password: bytes) -> bool:
        self.checks += 1
        ok = self.real(password, hashed_password)
        time.sleep(CHECK_S)
        return ok


async def _flood_connection(session: aiohttp.ClientSession, url: str, stop: asyncio.Event, statuses: Counter) -> None:
    """Request after request with a fresh wrong password (nothing to cache); a refusal is retried 20 ms later."""
    while not stop.is_set():
        status = 0
        try:
            async with session.get(url, headers=basic("alice", secrets.token_hex(8))) as r:
                await r.read()
                status = r.status
        except aiohttp.ClientError:
            pass
        statuses[status] += 1
        if status != 401:
            await asyncio.sleep(0.02)


async def _flood_from(address: str, url: str, stop: asyncio.Event, statuses: Counter) -> None:
    connector = aiohttp.TCPConnector(local_addr=(address, 0), limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(_flood_connection(session, url, stop, statuses)
                               for _ in range(FLOOD_CONNECTIONS_PER_SOURCE)))


async def _legit_scrape(url: str, user: str) -> tuple[int, float]:
    """One scrape from 127.0.0.2 with credentials no check has seen: its status (0 when it outlasts Prometheus'
    timeout) and seconds."""
    session_kw = {"connector": aiohttp.TCPConnector(local_addr=("127.0.0.2", 0)),
                  "timeout": aiohttp.ClientTimeout(total=PROMETHEUS_TIMEOUT_S)}
    started = time.monotonic()
    try:
        status = (await get(url, basic(user, PASSWORD), **session_kw))[0]
    except asyncio.TimeoutError:
        status = 0
    return status, time.monotonic() - started


@pytest.mark.parametrize("flood_sources", [4, 16, 64])
def test_uncached_credentials_get_through_a_flood_from_many_addresses(tmp_path, monkeypatch, flood_sources):
    """Each of LEGIT_SCRAPES scrapes uses a user no check has seen yet (as after an exporter restart, a web-config
    reload or for a new replica) while every flooding address keeps more checks waiting than it may queue."""
    slow = SlowCheck()
    monkeypatch.setattr(webconfig, "_checkpw", slow)
    users = "".join(f"  prom-{i}: '{hashed(PASSWORD)}'\n" for i in range(LEGIT_SCRAPES))
    cfg = write(tmp_path / "web.yml", f"{PLAIN_HTTP}basic_auth_users:\n  alice: '{hashed(PASSWORD)}'\n{users}")

    async def go():
        server = await start_server(ready_holder(), LOOPBACK, str(cfg))
        url = f"http://127.0.0.1:{server.port}/metrics"
        stop, flood_statuses = asyncio.Event(), Counter()
        flood = [asyncio.create_task(_flood_from(f"127.0.0.{10 + i}", url, stop, flood_statuses))
                 for i in range(flood_sources)]
        try:
            await wait_for(lambda: flood_statuses[429] > 0 and slow.checks > flood_sources, "the flood never filled up")
            scrapes = [await _legit_scrape(url, f"prom-{i}") for i in range(LEGIT_SCRAPES)]
            return scrapes, dict(flood_statuses)
        finally:
            stop.set()
            await asyncio.gather(*flood)
            await server.stop()

    scrapes, flood_statuses = asyncio.run(go())
    print(f"{flood_sources} flooding addresses: legitimate scrapes {[s for s, _ in scrapes]}, slowest "
          f"{max(t for _, t in scrapes):.2f} s; the flood's answers {flood_statuses}")
    assert [status for status, _ in scrapes] == [200] * LEGIT_SCRAPES
    assert flood_statuses.get(401, 0) > 0 and flood_statuses.get(429, 0) > 0  # the flood was checked, and refused


def test_checks_go_round_robin_by_source_and_a_source_that_succeeded_goes_first():
    async def go():
        queue, gate, order = checkqueue.FairCheckQueue(max_sources=8, max_per_source=4), threading.Event(), []

        def check(name: str, ok: bool) -> bool:
            assert gate.wait(10)
            order.append(name)
            return ok

        gate.set()
        assert await queue.run(check, "c0", True, source="c", user="carol")  # (c, carol) succeeded once
        gate.clear()
        tasks = [asyncio.create_task(queue.run(check, f"a{i}", False, source="a")) for i in range(4)]
        tasks += [asyncio.create_task(queue.run(check, f"b{i}", False, source="b")) for i in range(4)]
        tasks.append(asyncio.create_task(queue.run(check, "c1", True, source="c", user="carol")))
        gone = asyncio.create_task(queue.run(check, "d0", False, source="d"))  # its client goes away while it waits
        await asyncio.sleep(0.05)
        gone.cancel()
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.gather(*tasks)
        pending_after = queue.pending
        queue.close()
        return order, pending_after

    order, pending_after = asyncio.run(go())
    assert order == ["c0", "a0", "c1", "a1", "b0", "a2", "b1", "a3", "b2", "b3"]  # d0 never ran
    assert pending_after == 0


def test_a_new_source_takes_the_place_of_the_one_that_asked_for_the_most_checks():
    async def go():
        queue, gate = checkqueue.FairCheckQueue(max_sources=2, max_per_source=2), threading.Event()

        def check() -> bool:
            assert gate.wait(10)
            return False

        async def attempt(source: str) -> str:
            try:
                return str(await queue.run(check, source=source))
            except checkqueue.Refused:
                return "refused"

        running = asyncio.create_task(attempt("x"))  # holds the thread
        heavy = [asyncio.create_task(attempt("heavy")) for _ in range(6)]  # 2 wait, 4 refused: demand 7
        light = asyncio.create_task(attempt("light"))
        await asyncio.sleep(0.05)
        newcomer = asyncio.create_task(attempt("new"))  # both places taken: "heavy" asked for the most
        another = asyncio.create_task(attempt("another"))  # "light" and "new" asked for no more than it
        await asyncio.sleep(0.05)
        sources_while_waiting = queue.waiting_sources
        gate.set()
        results = await asyncio.gather(running, *heavy, light, newcomer, another)
        pending_after = queue.pending
        queue.close()
        return results, sources_while_waiting, pending_after

    results, sources_while_waiting, pending_after = asyncio.run(go())
    assert results[:8] == ["False"] + ["refused"] * 6 + ["False"]
    assert results[8:10] == ["False", "refused"]
    assert sources_while_waiting == 2 and pending_after == 0
