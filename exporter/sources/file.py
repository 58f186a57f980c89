"""Read a saved exposition page from a file:// URL, for debugging and tests.

`file:///abs/path` is absolute; `file://relative/path` is read relative to the working directory,
which is what people type on a command line.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import unquote, urlsplit

from exporter.sources import NOT_FOUND, PAGE_TOO_LARGE, READ_ERROR, TIMEOUT, FetchError


def url_to_path(url: str) -> Path:
    parts = urlsplit(url)
    if parts.netloc in ("", "localhost"):
        return Path(unquote(parts.path))
    return Path(unquote(parts.netloc + parts.path))


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)  # bounded even for endless files such as /dev/zero
    except FileNotFoundError:
        raise FetchError(NOT_FOUND, "no such file") from None
    except OSError as exc:
        raise FetchError(READ_ERROR, exc.strerror or type(exc).__name__) from None
    if len(data) > max_bytes:
        raise FetchError(PAGE_TOO_LARGE, f"more than {max_bytes} bytes")
    return data


async def fetch_file(url: str, *, timeout_s: float, max_bytes: int) -> bytes:
    try:
        return await asyncio.wait_for(asyncio.to_thread(_read_bounded, url_to_path(url), max_bytes), timeout_s)
    except TimeoutError:
        raise FetchError(TIMEOUT, f"file not read within {timeout_s:g}s") from None
