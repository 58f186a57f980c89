"""Sources fetch a page's bytes and nothing else; failures become short, stable reason strings.

The reasons are label values of `llm_exporter_target_last_error{reason}` and appear in logs, so
they must stay few and stable: dashboards and alerts match on them. `exporter.sources.fetch` picks the source
for a URL; the sources import these reasons from here.
"""

from __future__ import annotations

from urllib.parse import urlsplit

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
