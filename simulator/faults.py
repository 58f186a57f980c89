"""Run-time fault injection: the incidents the alert tests stage against the simulator.

One mutable state, changed by start-up flags and by `POST /admin/faults` (a JSON object of the fields to
change), read by the engine every step. Validation errors name the field and the accepted values.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from llmslo.argtypes import Bound
from simulator import limits

ERROR_MODES = ("http500", "abort")


class FaultError(ValueError):
    """A bad fault setting; the message names the field and what it accepts, `field` the field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@dataclass
class FaultState:
    slowdown: float = 1.0  # multiplies every step's time
    error_rate: float = 0.0  # share of requests that fail
    error_mode: str = "http500"  # http500: refused with HTTP 500; abort: connection broken mid-stream
    stall_until: float | None = None  # engine clock time the stall ends; math.inf = until cleared
    kv_capacity_factor: float = 1.0  # share of KV blocks left usable

    def stalled(self, now: float) -> bool:
        return self.stall_until is not None and now < self.stall_until

    def draw_error(self, rng: random.Random) -> str | None:
        """The failure this request will suffer, if any."""
        if self.error_rate > 0 and rng.random() < self.error_rate:
            return self.error_mode
        return None

    def update(self, patch: dict, now: float) -> None:
        """Apply a partial update. `stall`: seconds from now, true (until cleared), or false/0/null (clear).
        `reset`: true puts everything back to normal first. Nothing changes unless every field is valid."""
        if not isinstance(patch, dict):
            raise FaultError("faults: the body must be a JSON object, e.g. {\"slowdown\": 3}")
        known = {"slowdown", "error_rate", "error_mode", "stall", "kv_capacity_factor", "reset"}
        unknown = sorted(set(patch) - known)
        if unknown:
            raise FaultError(f"faults: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}",
                             unknown[0])
        reset = patch.get("reset", False)
        if not isinstance(reset, bool):
            raise FaultError(f"faults: reset must be true or false, got {reset!r}", "reset")
        new = FaultState() if reset else FaultState(**vars(self))
        if "slowdown" in patch:
            new.slowdown = _number(patch, "slowdown", limits.SLOWDOWN)
        if "error_rate" in patch:
            new.error_rate = _number(patch, "error_rate", limits.ERROR_RATE)
        if "error_mode" in patch:
            mode = patch["error_mode"]
            if not isinstance(mode, str) or mode not in ERROR_MODES:
                raise FaultError(f"faults: error_mode must be one of {', '.join(ERROR_MODES)}, got {mode!r}",
                                 "error_mode")
            new.error_mode = mode
        if "kv_capacity_factor" in patch:
            new.kv_capacity_factor = _number(patch, "kv_capacity_factor", limits.KV_CAPACITY_FACTOR)
        if "stall" in patch:
            stall = patch["stall"]
            if stall is True:
                new.stall_until = math.inf
            elif stall is False or stall is None or (not isinstance(stall, bool) and stall == 0):
                new.stall_until = None
            else:
                seconds = _number(patch, "stall", limits.STALL)
                new.stall_until = math.inf if math.isinf(seconds) else now + seconds
        vars(self).update(vars(new))

    def to_json(self, now: float) -> dict:
        remaining: str | float | None = None
        until = self.stall_until
        if until is not None and self.stalled(now):
            remaining = "until cleared" if math.isinf(until) else round(until - now, 3)
        return {
            "slowdown": self.slowdown,
            "error_rate": self.error_rate,
            "error_mode": self.error_mode,
            "stalled": self.stalled(now),
            "stall_remaining_s": remaining,
            "kv_capacity_factor": self.kv_capacity_factor,
        }


def _number(patch: dict, name: str, bound: Bound) -> float:
    try:
        return float(bound.check(patch[name], name))
    except ValueError as e:
        raise FaultError(f"faults: {e}", name) from None
