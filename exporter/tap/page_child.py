"""`python -m exporter.tap.page_child`: the admission gate's page reader, a child process of the tap.

Started once by exporter.tap.page_reader (the tap's side). Its first stdin line is the source (a JSON PageSource);
then each line `N` asks for one reading: the child fetches the engine's /metrics (at most `max_bytes` after
decompression, a redirect refused), parses it as the gate does (exporter.tap.gate_reading.read_text) and answers one
JSON line `{"n": N, ...}`: the reading, or the stage that failed and why. The page never enters the tap's process:
parsed there, even in a thread, an 8 MiB page held the GIL against the event loop relaying streams (issue 34).

The child runs at a lower priority (NICENESS) than the tap, so that on a busy node the relay is served first and a
slow reading only ages (the gate fails open once it is stale). It exits when its stdin closes: when the tap exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import sys
import time
from dataclasses import asdict
from typing import Any, BinaryIO, TextIO

import aiohttp

from exporter.tap.gate_reading import EngineReadError, read_text
from exporter.tap.page_reader import STAGE_FETCH, STAGE_READ, PageSource

NICENESS = 10
CHUNK_BYTES = 64 * 1024


class PageFetchError(Exception):
    """The engine answered, but not with a page to read (status, size)."""


async def fetch(session: aiohttp.ClientSession, source: PageSource) -> str:
    """The page's text; raises past `max_bytes` (counted as the body arrives, decompressed)."""
    async with session.get(source.url, allow_redirects=False) as resp:
        if resp.status != 200:
            raise PageFetchError(f"HTTP status {resp.status}")
        body = bytearray()
        async for piece in resp.content.iter_chunked(CHUNK_BYTES):
            body += piece
            if len(body) > source.max_bytes:
                raise PageFetchError(f"the page is larger than {source.max_bytes} bytes")
    return body.decode("utf-8", "replace")


def session_for(source: PageSource) -> aiohttp.ClientSession:
    context = ssl.create_default_context(cafile=source.ca_file or None) if source.url.startswith("https://") else None
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=context or True, limit=1),
        timeout=aiohttp.ClientTimeout(total=source.timeout_s), auto_decompress=True,
    )


def _error(stage: str, e: BaseException, reason: str = "") -> dict[str, Any]:
    said = str(e) if isinstance(e, (PageFetchError, EngineReadError)) else f"{type(e).__name__}: {e}"
    return {"stage": stage, "reason": reason, "error": said[:200]}


async def answer(session: aiohttp.ClientSession, source: PageSource) -> dict[str, Any]:
    """One reading of the page, or the stage that failed and why (the answer's fields but `n`)."""
    try:
        text = await fetch(session, source)
    except Exception as e:  # noqa: BLE001  (whatever the engine answers, the reader goes on)
        return _error(STAGE_FETCH, e)
    try:
        return {"reading": asdict(read_text(text, source.engine))}
    except EngineReadError as e:
        return _error(STAGE_READ, e, e.reason)
    except Exception as e:  # noqa: BLE001
        return _error(STAGE_READ, e)


async def serve(lines: BinaryIO, out: TextIO) -> None:
    """Answer each request line until stdin closes (a blocking read: nothing else runs on this loop)."""
    source = PageSource(**json.loads(lines.readline() or b"{}"))
    async with session_for(source) as session:
        for line in iter(lines.readline, b""):
            cpu = time.process_time()
            reply = {"n": int(line), **await answer(session, source)}
            reply["cpu_s"] = time.process_time() - cpu  # what the reading cost: the tap rests in proportion
            out.write(json.dumps(reply) + "\n")
            out.flush()


def main() -> None:
    with contextlib.suppress(OSError):
        os.nice(NICENESS)
    try:
        asyncio.run(serve(sys.stdin.buffer, sys.stdout))
    except (BrokenPipeError, KeyboardInterrupt):
        pass


if __name__ == "__main__":
    main()
