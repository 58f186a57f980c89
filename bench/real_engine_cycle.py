"""`python -m bench.real_engine_cycle ours|fetch SPEC.json`: one engine page's collection, driven from stdin.

Each stdin line is a number N: run N cycles back to back and answer one JSON line with this process's CPU
seconds (`time.process_time`, every thread), wall seconds and the last cycle's output (series and bytes).

* `ours`: the exporter's cycle, `CollectionLoop.run_once` (bench.collection_worker's `ours`) on the pages in
  SPEC with no GPUs (`--gpu off`): fetch, parse the wanted families, adapt, guard, render and gzip.
* `fetch`: the direct path, only fetching the same pages with the exporter's own client
  (`exporter.sources.http.fetch_http` on the same pooled session): what reading the engine's page costs
  before anything is done with it.

SPEC.json: {"urls": [...], "node": "bench-node"}.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from bench.collection_worker import ours, output_series
from bench.cycle_protocol import serve
from exporter.config import DEFAULT_MAX_PAGE_BYTES, DEFAULT_TIMEOUT_S
from exporter.sources.http import fetch_http, new_session


async def fetch_only(spec: dict, session: aiohttp.ClientSession) -> Callable[[], Awaitable[bytes]]:
    async def cycle() -> bytes:
        pages = await asyncio.gather(*(
            fetch_http(session, url, timeout_s=DEFAULT_TIMEOUT_S, max_bytes=DEFAULT_MAX_PAGE_BYTES)
            for url in spec["urls"]))
        return b"".join(pages)

    return cycle


async def main(mode: str, spec_path: str) -> None:
    spec = {"gpu": "off", **json.loads(Path(spec_path).read_text())}
    session = new_session()
    try:
        cycle = await (ours if mode == "ours" else fetch_only)(spec, session)
        await serve(cycle, lambda body: {"series": output_series(body), "bytes": len(body)})
    finally:
        await session.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
