"""The tap's background pollers (admission, the model list, SLO reload) end the same way."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel a poller's task and wait until it has ended (its own cleanup included); None: nothing to do."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
