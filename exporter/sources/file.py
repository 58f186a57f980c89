"""Read a saved exposition page from a file:// URL, for debugging and tests.

`file:///abs/path` is absolute; `file://relative/path` is read relative to the working directory,
which is what people type on a command line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from urllib.parse import unquote, urlsplit

from exporter.daemon_worker import DaemonWorker
from exporter.sources import NOT_FOUND, PAGE_TOO_LARGE, READ_ERROR, TIMEOUT, FetchError


def url_to_path(url: str) -> str:
    """The file a file:// URL names (a string: pathlib's import would cost start-up time)."""
    parts = urlsplit(url)
    if parts.netloc in ("", "localhost"):
        return unquote(parts.path)
    return unquote(parts.netloc + parts.path)


def _read_bounded(path: str, max_bytes: int) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)  # bounded even for endless files such as /dev/zero
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


def _consume_outcome(future: asyncio.Future) -> None:
    """Mark a late read's error as seen: the cycle that wanted it already reported `timeout`."""
    if not future.cancelled():
        future.exception()


async def fetch_file(url: str, *, timeout_s: float, max_bytes: int, reader: FileReader | None = None,
                     key: str = "") -> bytes:
    """One read; pass the caller's long-lived `reader` (and the target as `key`) to bound hung reads."""
    reader = reader if reader is not None else FileReader(idle_s=1.0)
    return await reader.fetch(key or url, url, timeout_s=timeout_s, max_bytes=max_bytes)
