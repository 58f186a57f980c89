"""The injector's counters and their page: what it injected, what it left alone and why, what failed.

Every reason is one of a fixed set (pod.SKIP_REASONS, review.ERROR_REASONS), and each is on the page from
the start at 0, so `increase()` sees the first skip of a kind and an alert can tell a quiet webhook (no
reviews) from one that is not asked (the series exist, nothing moves).
"""

from __future__ import annotations

import threading

from exporter.tap_inject.pod import SKIP_REASONS
from exporter.tap_inject.review import ERROR_REASONS, INJECTED, Answer
from llmslo import conventions as c


class Counters:
    """Thread-safe: the server answers each connection in its own thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.injected = 0
        self.skipped = dict.fromkeys(SKIP_REASONS, 0)
        self.errors = dict.fromkeys(ERROR_REASONS, 0)

    def count(self, answer: Answer) -> None:
        self.add(answer.outcome, error=answer.error)

    def add(self, outcome: str, error: bool = False) -> None:
        with self._lock:
            if error:
                self.errors[outcome] += 1
            elif outcome == INJECTED:
                self.injected += 1
            else:
                self.skipped[outcome] += 1

    def render(self) -> bytes:
        """The Prometheus text exposition (0.0.4) of the three families."""
        with self._lock:
            injected, skipped, errors = self.injected, dict(self.skipped), dict(self.errors)
        lines: list[str] = []
        for metric, values in ((c.TAP_INJECTOR_INJECTED, {"": injected}), (c.TAP_INJECTOR_SKIPPED, skipped),
                               (c.TAP_INJECTOR_ERRORS, errors)):
            lines += [f"# HELP {metric.name} {metric.help}", f"# TYPE {metric.name} counter"]
            for reason, value in values.items():
                labels = f'{{{c.LABEL_REASON}="{reason}"}}' if reason else ""
                lines.append(f"{metric.name}{labels} {value}")
        return ("\n".join(lines) + "\n").encode()


__all__ = ["Counters"]
