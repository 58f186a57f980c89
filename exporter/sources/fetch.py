"""Fetch a page from whichever source its URL names; each source is imported on first use (start-up time)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.sources import is_file_url

if TYPE_CHECKING:  # aiohttp is imported only when an http(s) target is fetched
    import aiohttp

    from exporter.sources.file import FileReader


async def fetch_page(
    session: aiohttp.ClientSession | None, url: str, *, timeout_s: float, max_bytes: int,
    files: FileReader | None = None, key: str = "",
) -> bytes | bytearray:
    """The page at an http(s):// or file:// URL, at most `max_bytes` long, within `timeout_s`.

    `session` is needed for http(s) only. `files` (with the target as `key`) is the caller's
    long-lived file reader, which keeps a hung file read from being started again every cycle.
    """
    if is_file_url(url):
        from exporter.sources import file as file_source

        return await file_source.fetch_file(url, timeout_s=timeout_s, max_bytes=max_bytes, reader=files, key=key)
    from exporter.sources import http as http_source

    if session is None:
        raise ValueError(f"{url}: an http(s) page needs a client session")
    return await http_source.fetch_http(session, url, timeout_s=timeout_s, max_bytes=max_bytes)
