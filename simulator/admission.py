"""Admission to the HTTP API: vLLM's `--max-num-queued-reqs` and `--max-num-queued-tokens`, with bounded defaults.

WHY: every request the API accepts is held in memory until it finishes (its prompt ids, its handler, its
connection), so an unbounded queue lets any client grow the simulator without limit. vLLM (v0.12+) refuses
a request with 503 when its requests in flight (waiting or running) reach `max_num_queued_reqs`, or the
prompt tokens of requests still waiting for prefill reach `max_num_queued_tokens`; both are off there by
default. The simulator mirrors the names and the 503 (with Retry-After), but ships bounds by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator import limits as L

RETRY_AFTER_S = 1  # what a refused client is told to wait: the queue moves every step


@dataclass(frozen=True)
class QueueLimits:
    max_num_queued_reqs: int = L.DEFAULT_MAX_NUM_QUEUED_REQS
    max_num_queued_tokens: int = L.DEFAULT_MAX_NUM_QUEUED_TOKENS


class PrefillTicket:
    """One admitted request's prompt tokens, counted until its first token (or its end) releases them."""

    __slots__ = ("_admission", "tokens")

    def __init__(self, admission: Admission, tokens: int) -> None:
        self._admission, self.tokens = admission, tokens
        admission.prefill_tokens += tokens

    def release(self) -> None:
        self._admission.prefill_tokens -= self.tokens
        self.tokens = 0


class Admission:
    """The API's counters: requests in flight (from before their body is read to their end) and prompt
    tokens waiting for prefill; `refusal()` says why a new request may not enter, or None."""

    def __init__(self, limits: QueueLimits) -> None:
        self.limits = limits
        self.in_flight = 0
        self.prefill_tokens = 0
        self.refused = 0

    def refusal(self) -> str | None:
        lim = self.limits
        if self.in_flight >= lim.max_num_queued_reqs:
            why = (f"the server is busy: {self.in_flight} requests in flight, the limit is {lim.max_num_queued_reqs} "
                   "(--max-num-queued-reqs); try again later")
        elif self.prefill_tokens >= lim.max_num_queued_tokens:
            why = (f"the server has a backlog of {self.prefill_tokens} prompt tokens waiting for prefill, the limit is "
                   f"{lim.max_num_queued_tokens} (--max-num-queued-tokens); try again later")
        else:
            return None
        self.refused += 1
        return why
