"""Read a saved exposition page from a file:// URL, for debugging and tests.

`file:///abs/path` is absolute; `file://relative/path` is read relative to the working directory,
which is what people type on a command line.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Collection, Sequence
from stat import S_ISREG
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from exporter.sources import NOT_FOUND, PAGE_TOO_LARGE, READ_ERROR, TIMEOUT, FetchError

if TYPE_CHECKING:  # the event loop's side, imported when a loop reads: `--once` over files runs without one
    import asyncio

    from exporter.daemon_worker import DaemonWorker


def url_to_path(url: str) -> str:
    """The file a file:// URL names (a string: pathlib's import would cost start-up time)."""
    parts = urlsplit(url)
    if parts.netloc in ("", "localhost"):
        return unquote(parts.path)
    return unquote(parts.netloc + parts.path)


def _read_bounded(path: str, max_bytes: int) -> bytes:
    try:
        with open(path, "rb") as f:
            # A regular file is read at its size (plus one byte, to see it grew): a read of max_bytes + 1 asks
            # for a buffer that large first, four times the cost of a saved page's read. Anything else (a pipe,
            # /dev/zero) is read up to the bound, which holds for endless files too.
            st = os.fstat(f.fileno())
            ask = st.st_size + 1 if S_ISREG(st.st_mode) and st.st_size < max_bytes else max_bytes + 1
            data = f.read(ask)
            if len(data) == ask <= max_bytes:  # it grew since: the rest, up to the bound
                data += f.read(max_bytes + 1 - ask)
    except FileNotFoundError:
        raise FetchError(NOT_FOUND, "no such file") from None
    except OSError as exc:
        raise FetchError(READ_ERROR, exc.strerror or type(exc).__name__) from None
    if len(data) > max_bytes:
        raise FetchError(PAGE_TOO_LARGE, f"more than {max_bytes} bytes")
    return data


class FileReader:
    """Reads file:// pages in daemon threads, with at most one read in flight per target.

    WHY: a read can block for good (a FIFO nobody writes, a hung network mount). With a read
    started every cycle in the default thread pool, each cycle would strand one more pool thread
    until the pool, shared with parsing, was exhausted; and pool threads are joined at exit, so
    the process could not exit either. As with NVML (exporter/daemon_worker.py), a target whose
    previous read has not returned is reported `timeout` without starting another, and its one
    thread is a daemon.
    """

    def __init__(self, idle_s: float = 60.0) -> None:
        self.idle_s = idle_s
        self._workers: dict[str, DaemonWorker] = {}
        self._pending: dict[str, asyncio.Future] = {}

    async def fetch(self, key: str, url: str, *, timeout_s: float, max_bytes: int) -> bytes:
        """The file's bytes within `timeout_s`; `key` names the target (one read in flight per key)."""
        import asyncio

        from exporter.daemon_worker import DaemonWorker

        pending = self._pending.get(key)
        if pending is not None and not pending.done():
            raise FetchError(TIMEOUT, "the previous read of this file has not returned")
        worker = self._workers.get(key)
        if worker is None:
            worker = self._workers[key] = DaemonWorker(f"llmslo-file-{key}"[:60], self.idle_s)
        future = worker.submit(_read_bounded, url_to_path(url), max_bytes)
        future.add_done_callback(_consume_outcome)
        self._pending[key] = future
        try:
            data = await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except TimeoutError:
            raise FetchError(TIMEOUT, f"file not read within {timeout_s:g}s") from None
        if self._pending.get(key) is future:  # returned: nothing to guard any more, and the page is not kept
            del self._pending[key]
        return data

    def forget(self, keep: Collection[str]) -> None:
        """Drop the state of targets that are gone, except a hung read's (so it is never started twice)."""
        for key in set(self._workers) - set(keep):
            pending = self._pending.get(key)
            if pending is None or pending.done():
                self._workers.pop(key, None)
                self._pending.pop(key, None)


class ThreadRead:
    """One file read started in a daemon thread of its own, waited for without an event loop.

    The same bound as FileReader's: a read that never returns is `timeout` at its deadline, and its thread
    keeps nothing from exiting."""

    def __init__(self, url: str, max_bytes: int) -> None:
        self.finished = 0.0  # perf_counter when the read returned
        self._data: bytes | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        threading.Thread(target=self._read, args=(url_to_path(url), max_bytes), daemon=True,
                         name=f"llmslo-file-{url}"[:60]).start()

    def _read(self, path: str, max_bytes: int) -> None:
        try:
            self._data = _read_bounded(path, max_bytes)
        except BaseException as exc:  # handed to the waiting caller, never lost
            self._error = exc
        self.finished = time.perf_counter()
        self._done.set()

    def result(self, started: float, timeout_s: float) -> tuple[bytes, float]:
        """The bytes and when they were read, once read within `timeout_s` of `started` (perf_counter)."""
        if not self._done.wait(max(0.0, started + timeout_s - time.perf_counter())):
            raise FetchError(TIMEOUT, f"file not read within {timeout_s:g}s")
        data, self._data = self._data, None  # the caller's is the only reference
        if self._error is not None:
            raise self._error
        return data, self.finished  # type: ignore[return-value]


class SavedPages:
    """file:// pages for a cycle without an event loop (`--once`), asked for in order.

    One daemon thread reads them in that order, ahead of the caller (a thread per page costs more than the read
    of a saved page). A read that outlasts its target's deadline (a FIFO nobody writes, a hung network mount) is
    `timeout`, as FileReader's is, and each page after it then gets a thread of its own (ThreadRead), timed
    from then: one hung file takes down only its own target."""

    def __init__(self, pages: Sequence[tuple[str, int]]) -> None:
        self._pages = pages  # (url, max_bytes) each
        self._done: list[tuple[bytes | None, BaseException | None, float] | None] = [None] * len(pages)
        self._ready = threading.Condition()
        self._stuck = False  # the reader is held by a read past its deadline: the rest have threads of their own
        self._own: dict[int, ThreadRead] = {}
        self._since = 0.0  # when the own threads started
        threading.Thread(target=self._read_all, daemon=True, name="llmslo-files").start()

    def _read_all(self) -> None:
        for i, (url, max_bytes) in enumerate(self._pages):
            if self._stuck:
                return
            data = error = None
            try:
                data = _read_bounded(url_to_path(url), max_bytes)
            except BaseException as exc:  # handed to the waiting caller, never lost
                error = exc
            with self._ready:
                self._done[i] = (data, error, time.perf_counter())
                self._ready.notify_all()

    def result(self, i: int, started: float, timeout_s: float) -> tuple[bytes, float]:
        """Page `i`'s bytes and when they were read, within `timeout_s` of `started` (perf_counter)."""
        if self._stuck:
            return self._own[i].result(self._since, timeout_s)
        with self._ready:
            if not self._ready.wait_for(lambda: self._done[i] is not None, started + timeout_s - time.perf_counter()):
                self._stuck = True
                self._since = time.perf_counter()
                self._own = {j: ThreadRead(*self._pages[j]) for j in range(i + 1, len(self._pages))}
                raise FetchError(TIMEOUT, f"file not read within {timeout_s:g}s")
            data, error, finished = self._done[i]  # type: ignore[misc]
            self._done[i] = (None, None, finished)  # the caller's is the only reference
        if error is not None:
            raise error
        return data, finished  # type: ignore[return-value]


def _consume_outcome(future: asyncio.Future) -> None:
    """Mark a late read's error as seen: the cycle that wanted it already reported `timeout`."""
    if not future.cancelled():
        future.exception()


async def fetch_file(url: str, *, timeout_s: float, max_bytes: int, reader: FileReader | None = None,
                     key: str = "") -> bytes:
    """One read; pass the caller's long-lived `reader` (and the target as `key`) to bound hung reads."""
    reader = reader if reader is not None else FileReader(idle_s=1.0)
    return await reader.fetch(key or url, url, timeout_s=timeout_s, max_bytes=max_bytes)
