"""The admission gate's poller: the I/O around the sans-IO gate state (exporter.tap.gate_state).

Every `poll_s` it asks the page reader (exporter.tap.page_reader: a child process that fetches the engine's /metrics
with a timeout, at most MAX_PAGE_BYTES, and parses and reads it), feeds the reading to the state with the time and
the tap's requests in flight, and logs what changed: the engine unreadable (once) and readable again, the gate
opening and closing. The event loop relaying streams never holds the page, nor shares the GIL with its parse
(issue 34). A page that costs the reader much CPU is read less often (page_reader.MAX_CPU_SHARE), never so rarely
that the reading goes stale for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from exporter.logs import TAP_LOGGER, event
from exporter.tap.background import cancel_and_wait
from exporter.tap.gate_reading import EngineReadError, Reading, reading_of
from exporter.tap.gate_state import STALE_POLLS, GateState
from exporter.tap.page_reader import STAGE_FETCH, EngineUnreachable, PageReader, PageSource
from exporter.tap.seats import InFlight
from llmslo import conventions as C

PARSE_DEADLINE_S = 10.0  # beyond the fetch's timeout, for the page reader's answer (a MAX_PAGE_BYTES page: 0.3 s CPU)
MAX_PAGE_BYTES = 8 << 20


class GatePoller:
    """Reads the engine's page into one GateState until stopped; `flights`: the tap's requests in flight now."""

    def __init__(self, state: GateState, url: str, ca_file: str, engine: str, clock: Callable[[], float],
                 flights: Callable[[], Iterable[InFlight]]) -> None:
        self.state, self.url, self.clock, self.flights = state, url, clock, flights
        timeout_s = state.settings.timeout_s
        self.page = PageReader(PageSource(url, ca_file, timeout_s, engine, MAX_PAGE_BYTES), timeout_s + PARSE_DEADLINE_S)
        self._task: asyncio.Task[None] | None = None

    async def poll(self) -> bool:
        """Read the engine once; on failure the previous reading stays (until it is stale), or none when the page
        was read but not believed. True when a reading was taken. Never raises (but for cancellation)."""
        state = self.state
        state.health.polls += 1
        was_open = state.is_open(self.clock())
        asked_at = self.clock()
        try:
            reading = await self._ask()
        except EngineReadError as e:
            self._unreadable(e.reason, e, forget=True)  # a page that says something impossible is not believed at all
            return False
        except Exception as e:  # noqa: BLE001  (whatever the engine answers, the tap goes on)
            self._unreadable(C.ADMISSION_READ_UNREACHABLE, e, forget=False)  # the last reading stays until stale
            return False
        had_error = state.health.last_error
        now = self.clock()
        why = state.update(reading, now, asked_at=asked_at, flights=list(self.flights()))
        if why:
            if not had_error:
                self._log_unreadable(why, state.health.last_error)
            return False
        if had_error:
            event("tap_admission_engine_readable", logger=TAP_LOGGER, url=self.url)
        k = state.learned
        event("tap_admission_reading", logging.DEBUG, logger=TAP_LOGGER, running=f"{reading.counters.running:g}",
              waiting=f"{reading.waiting:g}", free_tokens=f"{reading.free_tokens:.0f}",
              admitted=state.admitted_since(now), refused=state.health.refusals, itl=f"{k.rates.itl_s or 0:.4f}",
              drain=f"{k.rates.finish_rate or 0:.2f}")
        if state.is_open(now) != was_open:
            event(f"tap_admission_{'open' if not was_open else 'closed'}", logger=TAP_LOGGER, seats=f"{k.seats:.1f}",
                  footprint=f"{k.footprint:.0f}", waiting=f"{k.waiting:.0f}")
        return True

    def _unreadable(self, reason: str, e: Exception, *, forget: bool) -> None:
        if self.state.unreadable(reason, f"{type(e).__name__}: {e}", forget=forget):
            self._log_unreadable(reason, self.state.health.last_error)

    def _log_unreadable(self, reason: str, error: str) -> None:
        event("tap_admission_engine_unreadable", logging.WARNING, logger=TAP_LOGGER, url=self.url, reason=reason,
              error=error, note="the gate admits while it cannot read the engine")

    async def _ask(self) -> Reading:
        """One reading from the page reader: EngineReadError when the page was read but is not believed, another
        error when it could not be fetched (or the reader failed)."""
        answer = await self.page.ask()
        if "reading" in answer:
            return reading_of(answer["reading"])
        error = str(answer.get("error", ""))
        if answer.get("stage") == STAGE_FETCH:
            raise EngineUnreachable(error)
        raise EngineReadError(error, str(answer.get("reason") or C.ADMISSION_READ_NOT_ENGINE))

    async def _run(self) -> None:
        poll_s = self.state.settings.poll_s
        while True:
            started = self.clock()
            await self.poll()
            rest = min(self.page.rest_s, STALE_POLLS * poll_s)
            await asyncio.sleep(max(0.0, poll_s - (self.clock() - started), rest))

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        await self.page.close()
