"""The one reusable thread for NVML calls: results and errors reach the caller, the thread is reused, and it
goes away when idle."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from exporter.daemon_worker import DaemonWorker


def _threads(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


def test_results_and_exceptions_reach_the_caller_from_one_reused_thread() -> None:
    worker = DaemonWorker("test-worker-a", idle_s=5.0)

    async def go() -> None:
        seen = set()
        for i in range(5):
            doubled, ident = await worker.submit(lambda x: (x * 2, threading.get_ident()), i)
            assert doubled == i * 2 and ident != threading.get_ident()
            seen.add(ident)
        assert len(seen) == 1, "every call ran on the same thread"
        with pytest.raises(ZeroDivisionError):
            await worker.submit(lambda: 1 / 0)
        assert await worker.submit(lambda: "still alive") == "still alive"

    asyncio.run(go())
    assert len(_threads("test-worker-a")) == 1 and _threads("test-worker-a")[0].daemon


def test_the_thread_exits_when_idle_and_a_later_call_starts_a_new_one() -> None:
    worker = DaemonWorker("test-worker-b", idle_s=0.1)

    async def call() -> str:
        return await worker.submit(lambda: "ok")

    assert asyncio.run(call()) == "ok"
    deadline = time.monotonic() + 3
    while _threads("test-worker-b") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _threads("test-worker-b"), "an idle worker leaves no thread behind"
    assert asyncio.run(call()) == "ok"


def test_a_call_that_outlives_its_event_loop_does_not_kill_the_thread() -> None:
    worker = DaemonWorker("test-worker-c", idle_s=5.0)
    release = threading.Event()

    async def abandon() -> None:
        worker.submit(release.wait, 5)  # never awaited: the loop closes while the call runs

    asyncio.run(abandon())
    release.set()

    async def after() -> int:
        return await worker.submit(lambda: 42)

    assert asyncio.run(after()) == 42
