"""`python -m bench.relay_floor --upstream PORT`: the floor of a proxy written as the tap is (Python on uvloop).

Each client connection gets its own upstream connection and bytes pass both ways as they come:
no parsing, no timing, no counters. What it costs per relayed chunk is what the tap's own work
(HTTP framing, SSE timing, usage injection, accounting) is measured against: the rest is the
event loop's and the kernel's, which nginx pays too. Logs the tap's `event=tap_listening` line.
"""

from __future__ import annotations

import argparse
import asyncio
import sys


class _Upstream(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    def __init__(self, port: int) -> None:
        self.port = port
        self.upstream: asyncio.Transport | None = None
        self.early: list[bytes] = []  # what the client sent before the upstream connection was up

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            upstream, _ = await loop.create_connection(lambda: _Upstream(self.transport), "127.0.0.1", self.port)
        except OSError:
            self.transport.close()
            return
        self.upstream = upstream
        for data in self.early:
            upstream.write(data)
        self.early = []

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.early.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def _serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(lambda: _Client(port), "127.0.0.1", 0)
    listening = server.sockets[0].getsockname()[1]
    print(f"event=tap_listening proxy=http://127.0.0.1:{listening} metrics=none", file=sys.stderr, flush=True)
    await asyncio.Event().wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", type=int, required=True)
    args = p.parse_args()
    from exporter.tap.cli import _runner

    with _runner("auto") as runner:  # the tap's own loop choice (uvloop when installed)
        runner.run(_serve(args.upstream))


if __name__ == "__main__":
    main()
