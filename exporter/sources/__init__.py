"""Sources fetch a page's bytes and nothing else; failures become short, stable reason strings.

The reasons are label values of `llm_exporter_target_last_error{reason}` and appear in logs, so
they must stay few and stable: dashboards and alerts match on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:  # aiohttp is imported only when an http(s) target is fetched (start-up time)
    import aiohttp

    from exporter.sources.file import FileReader

TIMEOUT = "timeout"
CONNECTION_REFUSED = "connection_refused"
CONNECTION_ERROR = "connection_error"
DNS_ERROR = "dns_error"
TLS_ERROR = "tls_error"
PAGE_TOO_LARGE = "page_too_large"
TRUNCATED = "truncated"
PARSE_ERROR = "parse_error"
NOT_FOUND = "not_found"
READ_ERROR = "read_error"
UNKNOWN_ENGINE = "unknown_engine"  # `auto` could not recognise the page
NO_ENGINE_METRICS = "no_engine_metrics"  # the page has none of the families the adapter reads
ADAPTER_ERROR = "adapter_error"


def http_status_reason(status: int) -> str:
    return f"http_{status}"


class FetchError(Exception):
    """A page could not be fetched; `reason` is one of the constants above."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def is_file_url(url: str) -> bool:
    return urlsplit(url).scheme == "file"


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
