"""`python -m bench.page_server DIR`: serve every DIR/NAME.prom at /NAME over loopback HTTP, as engines would.

Runs in its own process so a benchmark measures the exporter's CPU, not the server's. Pages are read once and
gzipped once at start; a client that accepts gzip (aiohttp does by default, and vLLM's prometheus_client
endpoint compresses for it) gets the compressed bytes, so serving costs the server almost nothing.
Prints the port on stdout once listening; stops on SIGTERM or when stdin closes.
"""

from __future__ import annotations

import asyncio
import gzip
import signal
import sys
from pathlib import Path

from aiohttp import web

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _app(pages: dict[str, tuple[bytes, bytes]]) -> web.Application:
    async def serve(request: web.Request) -> web.Response:
        page = pages.get(request.match_info["name"])
        if page is None:
            raise web.HTTPNotFound()
        plain, packed = page
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            return web.Response(body=packed, headers={"Content-Type": CONTENT_TYPE, "Content-Encoding": "gzip"})
        return web.Response(body=plain, headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/{name}", serve)
    return app


async def _main(directory: Path) -> None:
    pages = {}
    for path in sorted(directory.glob("*.prom")):
        plain = path.read_bytes()
        pages[path.stem] = (plain, gzip.compress(plain, compresslevel=6))
    runner = web.AppRunner(_app(pages), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(runner.addresses[0][1], flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_reader(sys.stdin.fileno(), stop.set)  # the parent went away (or closed our stdin)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(_main(Path(sys.argv[1])))
