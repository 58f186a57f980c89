"""The tap's side of the admission page reader: one long-lived child process (exporter.tap.page_child) that fetches
and parses the engine's /metrics and returns only the small reading.

Why a process: the page is untrusted and up to MAX_PAGE_BYTES; parsed on the tap's loop, or in a thread of the tap
(which still holds the GIL against the loop), an 8 MiB page slowed every stream the tap relayed (issue 34). Here the
event loop writes one short line per poll and reads one short JSON line back.

The child is started on the first poll and kept; one that exits, or answers late (`deadline_s`) or too much
(ANSWER_LIMIT), is killed and started again on a later poll (not sooner than RESTART_S after the last start, so a
child that cannot start does not cost the tap a process a poll). Its memory counts towards the tap's pod: it holds
at most one page (MAX_PAGE_BYTES) and what parsing it takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STAGE_FETCH = "fetch"  # the page could not be fetched (refused, timed out, not 200, too large)
STAGE_READ = "read"  # the page was fetched but says nothing the gate can believe
ANSWER_LIMIT = 4 << 20  # bytes of one answer line: a reading is a few kB (its histograms' buckets)
RESTART_S = 5.0
# The most of one core the reader spends on pages: after a reading that cost C seconds of CPU it rests C x (1/share - 1)
# (GatePoller._run). A MAX_PAGE_BYTES page costs about 0.3 s: read every 0.25 s, it would keep a core busy, and the
# tap's pod (its CPU limit shared by the tap and this child) would be throttled, the relay with it.
MAX_CPU_SHARE = 0.2
STOP_S = 2.0
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the `exporter` package the tap runs  # for the child to exit once its stdin is closed, before it is killed


@dataclass(frozen=True)
class PageSource:
    """What the child reads: the page's URL, TLS trust, the fetch's timeout, the engine kind and the size cap."""

    url: str
    ca_file: str
    timeout_s: float
    engine: str
    max_bytes: int


class EngineUnreachable(Exception):
    """The engine's page could not be fetched (refused, timed out, not 200, larger than the cap)."""


class PageReaderError(Exception):
    """The child could not give an answer (it could not start, exited, answered late or wrongly)."""


class PageReader:
    """One child process, asked for one answer at a time (GatePoller.poll awaits each in turn)."""

    def __init__(self, source: PageSource, deadline_s: float) -> None:
        self.source = source
        self.deadline_s = deadline_s
        self._proc: asyncio.subprocess.Process | None = None
        self._started = -RESTART_S
        self._asked = 0
        self.cpu_s = 0.0  # the CPU time the last answer cost the child

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    @property
    def rest_s(self) -> float:
        """How long to wait before the next poll so that reading pages takes at most MAX_CPU_SHARE of a core."""
        return self.cpu_s * (1 / MAX_CPU_SHARE - 1)

    async def ask(self) -> dict[str, Any]:
        """The child's answer for one poll: {"reading": {...}} or {"stage", "reason", "error"}."""
        proc = await self._running()
        self._asked += 1
        try:
            assert proc.stdin is not None
            proc.stdin.write(b"%d\n" % self._asked)
            await proc.stdin.drain()
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation that comes as the answer
            # does, and the poller's task then never ended (the tap hung on SIGTERM)
            async with asyncio.timeout(self.deadline_s):
                return await self._answer(proc, self._asked)
        except Exception as e:  # late, exited, or an answer that is no answer (cancelled: the next ask skips it)
            self._kill()
            await proc.wait()
            if isinstance(e, PageReaderError):
                raise
            raise PageReaderError(f"the page reader failed: {type(e).__name__}: {e}"[:200]) from e

    async def _answer(self, proc: asyncio.subprocess.Process, asked: int) -> dict[str, Any]:
        assert proc.stdout is not None
        while True:
            line = await proc.stdout.readline()
            if not line:
                raise PageReaderError(f"the page reader exited ({await proc.wait()})")
            answer = json.loads(line)
            if answer.get("n") == asked:  # an earlier poll's answer (cancelled meanwhile) is skipped
                cpu = float(answer.get("cpu_s", 0.0))
                self.cpu_s = cpu if 0 <= cpu < math.inf else 0.0
                return answer

    async def _running(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        await self.close()
        if time.monotonic() - self._started < RESTART_S:
            raise PageReaderError(f"the page reader stopped; it is started again at most every {RESTART_S:g} s")
        self._started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(  # from where this tap's `exporter` was imported, not the cwd
            sys.executable, "-m", "exporter.tap.page_child", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, limit=ANSWER_LIMIT, cwd=PACKAGE_ROOT)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(asdict(self.source)).encode() + b"\n")  # on stdin: the URL may hold a password
        self._proc = proc
        return proc

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()

    async def close(self) -> None:
        """Stop the child: its stdin closed (it exits once its answer in hand is written), killed after STOP_S."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            async with asyncio.timeout(STOP_S):
                await proc.wait()
        except TimeoutError:
            self._proc = proc
            self._kill()
            with contextlib.suppress(TimeoutError):  # a tap that stops never waits on its child for long
                async with asyncio.timeout(STOP_S):
                    await proc.wait()
        except asyncio.CancelledError:
            self._proc = proc
            self._kill()
            raise
