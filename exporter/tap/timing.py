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
  bytes the response carried is not believed (`plausible_usage`).
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


def plausible_usage(n: int, max_tokens: int | None, choices: int, body_bytes: int) -> bool:
    """Whether an engine-reported completion_tokens count can be true.

    It cannot exceed what the request allowed (max_tokens per choice, `n` choices) nor the
    bytes of the response that carried it: every output token costs a streamed event (or at
    least a byte of text) on the wire, so more tokens than bytes means a broken or lying
    upstream (e.g. `"completion_tokens": 1e23`), whose count would inflate goodput tokens.
    """
    if max_tokens is not None and n > max_tokens * max(choices, 1):
        return False
    return n <= max(body_bytes, 1)


def gave_up(t: RequestTiming, now: float, ttft_max: float | None, tpot_max: float | None, streamed: bool,
            max_tokens: int | None) -> bool:
    """Whether a client that left at `now` left only after its objective could no longer be met.

    Such a client was failed by the service (it usually stopped waiting for a hung or far too
    slow engine), so it counts against the SLIs; one that left while still on time did not.

    Streamed: no output yet and the TTFT objective has passed; or the first token came after
    it; or the stream as the client saw it was slower than the TPOT objective: with k output
    events delivered, (now - first token) / k > TPOT objective (the next token could not have
    come before `now`). Not streamed: the response could no longer arrive by the time a good
    one must (`within_objectives`): now - arrival > TTFT + (max_tokens - 1) x TPOT; without
    max_tokens and with a TPOT objective, that time is unbounded, so never.
    """
    waited = now - t.arrival
    if streamed:
        if t.first_token_at is None:
            return ttft_max is not None and waited > ttft_max
        if ttft_max is not None and t.first_token_at - t.arrival > ttft_max:
            return True
        return tpot_max is not None and (now - t.first_token_at) / max(t.output_events, 1) > tpot_max
    if ttft_max is None:
        return False
    if not tpot_max:
        return waited > ttft_max
    return max_tokens is not None and waited > ttft_max + (max_tokens - 1) * tpot_max
