"""Per-request timing: a pure state machine fed with timestamps and parsed stream events.

No clock and no I/O here: the proxy passes the time at which each read completed, so the
same code is exercised by unit tests with made-up timestamps. Definitions (docs/metrics.md,
"Goodput tap"):

- TTFB: arrival at the tap -> upstream response headers.
- TTFT: arrival -> first event carrying output (non-empty `content`, `reasoning_content` /
  `reasoning`, a tool-call delta, or non-empty `text` for /v1/completions). The role-only
  first chunk of a chat stream is not output.
- TPOT: (t_last_token - t_first_token) / (n_out - 1), 0 when n_out <= 1.
- n_out: `usage.completion_tokens` when the stream reports it, else the number of output
  events (usage_source "chunks").
- E2E: arrival -> end of the response body.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmslo.conventions import USAGE_SOURCE_CHUNKS, USAGE_SOURCE_ENGINE

_OUTPUT_DELTA_KEYS = ("content", "reasoning_content", "reasoning")


def carries_output(payload: Any) -> bool:
    """True when a streamed chat or completions chunk delivers output to the user."""
    if not isinstance(payload, dict):
        return False
    choices = payload.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            for key in _OUTPUT_DELTA_KEYS:
                value = delta.get(key)
                if isinstance(value, str) and value:
                    return True
            if delta.get("tool_calls"):
                return True
        text = choice.get("text")
        if isinstance(text, str) and text:
            return True
    return False


def completion_tokens(payload: Any) -> int | None:
    """`usage.completion_tokens` of a chunk or a whole response, when present and sane."""
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    n = usage.get("completion_tokens")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def is_usage_only(payload: Any) -> bool:
    """The extra final chunk `stream_options.include_usage` adds: empty choices plus usage."""
    return isinstance(payload, dict) and payload.get("choices") == [] and isinstance(payload.get("usage"), dict)


@dataclass(frozen=True, slots=True)
class Timings:
    """What one request measured; latencies in seconds, None when the event never happened."""

    ttfb: float | None
    ttft: float | None
    tpot: float | None
    e2e: float | None
    n_out: int
    usage_source: str


@dataclass(slots=True)
class RequestTiming:
    """Timestamps of one request as its response flows through the tap."""

    arrival: float
    headers_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    end_at: float | None = None
    output_events: int = 0
    usage_tokens: int | None = None
    # The stream's `[DONE]` reached the client: the response is complete from the client's point of
    # view, so a client closing the connection afterwards (as real clients do) is not a disconnect.
    delivered: bool = False

    def on_headers(self, t: float) -> None:
        if self.headers_at is None:
            self.headers_at = t

    def on_output_event(self, t: float) -> None:
        """One event that carries output arrived (completed) at time t."""
        if self.first_token_at is None:
            self.first_token_at = t
        self.last_token_at = t
        self.output_events += 1

    def on_usage(self, n: int) -> None:
        self.usage_tokens = n

    def on_end(self, t: float) -> None:
        if self.end_at is None:
            self.end_at = t

    def result(self, streamed: bool = True) -> Timings:
        """Derive the latencies; a non-streamed response is timed as E2E only."""
        n_out = self.usage_tokens if self.usage_tokens is not None else self.output_events
        source = USAGE_SOURCE_ENGINE if self.usage_tokens is not None else USAGE_SOURCE_CHUNKS
        ttfb = None if self.headers_at is None else self.headers_at - self.arrival
        e2e = None if self.end_at is None else self.end_at - self.arrival
        if not streamed or self.first_token_at is None or self.last_token_at is None:
            return Timings(ttfb, None, None, e2e, n_out, source)
        ttft = self.first_token_at - self.arrival
        tpot = (self.last_token_at - self.first_token_at) / (n_out - 1) if n_out > 1 else 0.0
        return Timings(ttfb, ttft, tpot, e2e, n_out, source)


def within_objectives(t: Timings, ttft_max: float | None, tpot_max: float | None, streamed: bool = True) -> bool:
    """Whether one successfully completed request counts as goodput.

    Streamed: TTFT <= ttft_max and TPOT <= tpot_max (a missing objective does not constrain),
    and at least one output token arrived. Not streamed: the user sees nothing until the end,
    so the response must be complete by the time a stream meeting both objectives would have
    finished: E2E <= ttft_max + (n_out - 1) * tpot_max.
    """
    if streamed:
        if t.ttft is None or t.tpot is None:
            return False
        return (ttft_max is None or t.ttft <= ttft_max) and (tpot_max is None or t.tpot <= tpot_max)
    if t.e2e is None or t.n_out < 1:
        return False
    if ttft_max is None:
        return True  # no TTFT objective: the deadline is unbounded
    return t.e2e <= ttft_max + (t.n_out - 1) * (tpot_max or 0.0)
