"""Run-time fault injection: the incidents the alert tests stage against the simulator.

One mutable state, changed by start-up flags and by `POST /admin/faults` (a JSON object of the fields to
change), read by the engine every step. Validation errors name the field and the accepted values.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

ERROR_MODES = ("http500", "abort")


class FaultError(ValueError):
    """A bad fault setting; the message names the field and what it accepts."""


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
            raise FaultError(f"faults: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        new = FaultState() if patch.get("reset") is True else FaultState(**vars(self))
        if "slowdown" in patch:
            new.slowdown = _number(patch, "slowdown", low=0.01, high=1000.0)
        if "error_rate" in patch:
            new.error_rate = _number(patch, "error_rate", low=0.0, high=1.0)
        if "error_mode" in patch:
            if patch["error_mode"] not in ERROR_MODES:
                raise FaultError(f"faults: error_mode must be one of {', '.join(ERROR_MODES)}, got {patch['error_mode']!r}")
            new.error_mode = patch["error_mode"]
        if "kv_capacity_factor" in patch:
            new.kv_capacity_factor = _number(patch, "kv_capacity_factor", low=0.01, high=1.0)
        if "stall" in patch:
            stall = patch["stall"]
            if stall is True:
                new.stall_until = math.inf
            elif stall in (False, None, 0):
                new.stall_until = None
            else:
                new.stall_until = now + _number(patch, "stall", low=0.0, high=86400.0)
        vars(self).update(vars(new))

    def to_json(self, now: float) -> dict:
        remaining = None
        if self.stalled(now):
            remaining = "until cleared" if math.isinf(self.stall_until) else round(self.stall_until - now, 3)
        return {
            "slowdown": self.slowdown,
            "error_rate": self.error_rate,
            "error_mode": self.error_mode,
            "stalled": self.stalled(now),
            "stall_remaining_s": remaining,
            "kv_capacity_factor": self.kv_capacity_factor,
        }


def _number(patch: dict, name: str, low: float, high: float) -> float:
    value = patch[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise FaultError(f"faults: {name} must be a number from {low} to {high}, got {value!r}")
    return float(value)
