"""Fetch an engine's /metrics over HTTP with a deadline and a byte cap enforced while streaming.

The cap is checked chunk by chunk (after decompression), so a runaway or hostile page costs at
most `max_bytes` of memory, never the whole body.
"""

from __future__ import annotations

import asyncio
import ssl

import aiohttp

from exporter.sources import (
    CONNECTION_ERROR,
    CONNECTION_REFUSED,
    DNS_ERROR,
    PAGE_TOO_LARGE,
    TIMEOUT,
    TLS_ERROR,
    TRUNCATED,
    FetchError,
    http_status_reason,
)

CHUNK_BYTES = 64 * 1024
REQUEST_HEADERS = {
    # The classic text format is what every adapter and the parser expect.
    "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
    "User-Agent": "llmslo-exporter",
}


def new_session() -> aiohttp.ClientSession:
    """One pooled client for every target: keep-alive saves a handshake per target per cycle."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=64, enable_cleanup_closed=True),
        headers=REQUEST_HEADERS,
    )


async def fetch_http(
    session: aiohttp.ClientSession, url: str, *, timeout_s: float, max_bytes: int, headers: dict[str, str] | None = None,
) -> bytes | bytearray:
    try:
        async with asyncio.timeout(timeout_s):
            # No redirects: a discovered pod's page could otherwise send the exporter to any address
            # (another pod, the node, a cloud metadata endpoint); a 3xx is a down target, `http_3xx`.
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s), headers=headers,
                                   allow_redirects=False) as resp:
                if resp.status != 200:
                    raise FetchError(http_status_reason(resp.status))
                if resp.content_length is not None and resp.content_length > max_bytes and not resp.headers.get("Content-Encoding"):
                    raise FetchError(PAGE_TOO_LARGE, f"Content-Length {resp.content_length} > {max_bytes}")
                body = bytearray()
                async for chunk in resp.content.iter_chunked(CHUNK_BYTES):
                    if len(body) + len(chunk) > max_bytes:
                        raise FetchError(PAGE_TOO_LARGE, f"more than {max_bytes} bytes")
                    body += chunk
                return body  # not bytes(body): a copy would double the peak for a large page
    except FetchError:
        raise
    except TimeoutError:
        raise FetchError(TIMEOUT, f"no complete page within {timeout_s:g}s") from None
    except (aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError, ssl.SSLError) as exc:
        raise FetchError(TLS_ERROR, type(exc).__name__) from None
    except aiohttp.ClientConnectorDNSError as exc:
        raise FetchError(DNS_ERROR, type(exc).__name__) from None
    except aiohttp.ClientConnectorError as exc:
        if isinstance(exc.os_error, ConnectionRefusedError):
            raise FetchError(CONNECTION_REFUSED) from None
        raise FetchError(CONNECTION_ERROR, type(exc.os_error).__name__) from None
    except aiohttp.ClientPayloadError as exc:
        raise FetchError(TRUNCATED, type(exc).__name__) from None
    except (aiohttp.ClientError, OSError) as exc:
        raise FetchError(CONNECTION_ERROR, type(exc).__name__) from None
