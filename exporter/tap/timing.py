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
- E2E: arrival -> end of the response body; for a stream whose upstream holds the connection open after
  its complete answer, arrival -> the answer's last event (`answered_at`).
- complete: the stream ended with the engine's final event (`[DONE]`, or a `finish_reason`
  for engines that send no `[DONE]`); a stream without it is `truncated`, never `ok`.
- n_out is checked: a usage count above what the request allowed (max_tokens x n) or above the
  bytes the response carried is not believed (exporter.tap.policy.plausible_usage).

Whether a request was good is llmslo.goodput's rule, applied by exporter.tap.policy.
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


def has_finish_reason(payload: dict[str, Any]) -> bool:
    """True when a chunk's choice carries a finish_reason: the engine's last event for it."""
    choices = payload.get("choices")
    return isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") for c in choices)


def completion_tokens(payload: Any) -> int | None:
    """`usage.completion_tokens` of a chunk or a whole response, when present and sane."""
    if not isinstance(payload, dict):
        return None
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    n = usage.get("completion_tokens")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None


def prompt_tokens(payload: Any) -> int | None:
    """`usage.prompt_tokens` of a chunk or a whole response, when present and a whole number (the admission
    gate's exact request sizes, exporter.tap.seats)."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
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
    usage_prompt_tokens: int | None = None  # usage.prompt_tokens, when the engine reported it
    # The stream's `[DONE]` reached the client: the response is complete from the client's point of
    # view, so a client closing the connection afterwards (as real clients do) is not a disconnect.
    delivered: bool = False
    finished: bool = False  # an event carried a finish_reason (engines that send no `[DONE]` end so)
    # When the last event of a complete answer arrived (`[DONE]`, or the finish_reason / usage events before
    # it): the answer's end, should the upstream hold its connection open after it (exporter.tap.exchange).
    answered_at: float | None = None

    @property
    def complete(self) -> bool:
        """The stream carried the engine's final event: nothing the client was owed is missing."""
        return self.delivered or self.finished

    @property
    def answer_end(self) -> float | None:
        """The latest of the answer's last event and its last output event (None before either)."""
        times = [x for x in (self.answered_at, self.last_token_at) if x is not None]
        return max(times) if times else None

    def on_headers(self, t: float) -> None:
        if self.headers_at is None:
            self.headers_at = t

    def on_output_event(self, t: float) -> None:
        """One event that carries output arrived (completed) at time t."""
        if self.first_token_at is None:
            self.first_token_at = t
        self.last_token_at = t
        self.output_events += 1

    def on_usage(self, n: int, prompt: int | None = None) -> None:
        self.usage_tokens = n
        if prompt is not None:
            self.usage_prompt_tokens = prompt

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
