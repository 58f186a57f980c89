"""What a timed request's outcome is (docs/metrics.md, "Outcomes"): pure rules, no sockets.

The exchange (exporter.tap.exchange) gathers the facts as the response goes by; these functions
decide. Each rule is one of the places a request ends: the response head arrives (its status), the
body ends by its framing, or the client goes away first.
"""

from __future__ import annotations

from llmslo import conventions as C


def outcome_for_status(status: int) -> str:
    """A response's outcome by its status: a client's own 4xx is its fault, not the engine's
    (conventions.http_status_is_client_fault); 429 (the engine out of capacity) and 5xx are the engine's."""
    if C.http_status_is_client_fault(status):
        return C.OUTCOME_CLIENT_ERROR
    if status >= 400:
        return C.OUTCOME_UPSTREAM_ERROR
    return C.OUTCOME_OK


def ended_outcome(status_outcome: str, *, error_event: bool, stream: bool, complete: bool, unparsed_close: bool) -> str:
    """The outcome of a body that ended by its framing (or by a close, for a close-delimited one).

    `status_outcome`: outcome_for_status of its head; `error_event`: the engine sent an error event
    mid-stream; `stream`: a timed SSE stream, `complete` whether it ended with its final event;
    `unparsed_close`: a timed JSON body delimited by the close that did not parse whole."""
    if error_event:
        return C.OUTCOME_ABORTED
    if status_outcome != C.OUTCOME_OK:
        return status_outcome
    if stream and not complete:
        return C.OUTCOME_TRUNCATED  # no [DONE] nor finish_reason: the client did not get the whole answer
    if unparsed_close:
        return C.OUTCOME_TRUNCATED  # cut by a close: only a complete JSON body tells it ended
    return C.OUTCOME_OK


def left_outcome(status_outcome: str, *, complete: bool, responded: bool, gave_up: bool) -> str:
    """The outcome of a request whose client went away before its response ended.

    `complete`: it got the whole answer (real clients close after [DONE]); `responded`: the head had
    arrived; `gave_up`: it stopped waiting only once its objective was lost (policy.gave_up)."""
    if complete or (responded and status_outcome != C.OUTCOME_OK):
        return status_outcome
    if gave_up:
        return C.OUTCOME_CLIENT_GAVE_UP
    return C.OUTCOME_CLIENT_DISCONNECTED
