"""The deadline tick (exporter.tap.proxy.TapProxy._tick) checks every connection, a slice per turn of the loop,
so that no tick holds the loop for long; a connection that closed before its slice is not checked."""

from __future__ import annotations

import asyncio

from exporter.tap.classes import SloConfig
from exporter.tap.proxy import TICK_SLICE, TapProxy
from exporter.tap.settings import TapSettings


class Conn:
    def __init__(self, checked: list[Conn]) -> None:
        self.checked = checked

    def check_deadlines(self, now: float) -> None:
        self.checked.append(self)


def test_a_tick_checks_every_connection_a_slice_per_turn_of_the_loop() -> None:
    async def run() -> tuple[list[int], list[Conn], list[Conn]]:
        proxy = TapProxy(TapSettings("http://127.0.0.1:9"), SloConfig((), {}))
        checked: list[Conn] = []
        conns = [Conn(checked) for _ in range(2 * TICK_SLICE + 10)]
        proxy.connections.update(conns)  # type: ignore[arg-type]
        proxy.tick_s = 3600.0  # one tick only
        proxy._tick()
        seen = [len(checked)]
        gone = next(c for c in conns if c not in checked)
        proxy.connections.discard(gone)  # type: ignore[arg-type]
        for _ in range(4):
            await asyncio.sleep(0)
            seen.append(len(checked))
        proxy.stop()
        return seen, checked, [gone]

    seen, checked, gone = asyncio.run(run())
    assert seen[0] == TICK_SLICE  # the first slice only, in the tick's own callback
    assert seen[-1] == 2 * TICK_SLICE + 9 and len(set(checked)) == len(checked)  # every other one, once
    assert gone[0] not in checked
