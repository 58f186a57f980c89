"""Progress lines on stderr for long runs: silent for the first seconds, then at most one line a second.

`llmslo-sim plan` takes tens of seconds; without a word it looks hung. A short run stays quiet so scripts that
read stderr see nothing new, and stdout (the result, maybe JSON) is never touched.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

QUIET_S = 3.0  # runs shorter than this print no progress
EVERY_S = 1.0  # at most one line per second after that


class Progress:
    def __init__(self, prog: str, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 quiet_s: float = QUIET_S, every_s: float = EVERY_S) -> None:
        self.prog, self.stream, self.clock = prog, stream or sys.stderr, clock
        self.quiet_s, self.every_s = quiet_s, every_s
        self.start = clock()
        self.last: float | None = None
        self.count = 0

    def say(self, text: str, step: bool = True) -> None:
        """Print `text` (with the elapsed time and how many steps so far) unless the run is young or a line
        went out less than `every_s` ago. `step=False`: news from within a step (a long probe under way)."""
        self.count += step
        now = self.clock()
        if now - self.start < self.quiet_s or (self.last is not None and now - self.last < self.every_s):
            return
        self.last = now
        print(f"{self.prog}: {text} [{self.count} so far, {now - self.start:.0f} s]", file=self.stream, flush=True)
