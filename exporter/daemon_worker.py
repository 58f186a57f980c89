"""One long-lived daemon thread for blocking calls that may hang (NVML), reused from cycle to cycle.

WHY not a thread per call: the GPUs are read every cycle, and starting a thread each time is
fixed cost for nothing. WHY not a ThreadPoolExecutor: its threads are joined at interpreter
exit, so one NVML call that never returns would keep the process from ever exiting; a daemon
thread does not. Calls run one after another; a caller must not queue a second call behind
its own hung one (the collector checks its last future first), so one thread is all there is.

The thread ends after `idle_s` without work, so a process that stops collecting (tests, a
restart of the runtime) is left with no thread; the next call simply starts a new one.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

Job = Callable[[], None]


class DaemonWorker:
    """Runs `fn(*args)` in its one daemon thread and hands the outcome to the caller's event loop."""

    def __init__(self, name: str, idle_s: float) -> None:
        self.name = name
        self.idle_s = idle_s
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders "queue a job" against "the idle thread decides to exit"
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """A future of the running loop that gets fn's result or exception; the call runs in the thread."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def deliver(setter: Callable[[Any], None], value: Any) -> None:
            if not future.done():
                setter(value)

        def job() -> None:
            try:
                result = fn(*args)
            except BaseException as exc:  # delivered to the awaiting coroutine, never lost
                outcome: tuple[Callable[[Any], None], Any] = (future.set_exception, exc)
            else:
                outcome = (future.set_result, result)
            try:
                loop.call_soon_threadsafe(deliver, *outcome)
            except RuntimeError:  # the loop closed while the call ran: nobody is waiting any more
                pass

        with self._lock:
            self._jobs.put(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
        return future

    def _run(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():  # nothing was queued while we timed out: really idle
                        self._thread = None
                        return
                continue
            job()
            del job  # its future holds the result (a whole page, for a file read): not kept while idle
