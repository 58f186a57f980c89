"""The outcome rules (exporter.tap.outcomes) as pure functions: no sockets, no loop."""

from __future__ import annotations

import pytest

from exporter.tap.outcomes import ended_outcome, left_outcome, outcome_for_status
from llmslo import conventions as C


@pytest.mark.parametrize(("status", "want"), [
    (200, C.OUTCOME_OK), (204, C.OUTCOME_OK), (304, C.OUTCOME_OK),
    (400, C.OUTCOME_CLIENT_ERROR), (404, C.OUTCOME_CLIENT_ERROR), (422, C.OUTCOME_CLIENT_ERROR),
    (499, C.OUTCOME_CLIENT_ERROR),
    (429, C.OUTCOME_UPSTREAM_ERROR), (500, C.OUTCOME_UPSTREAM_ERROR), (503, C.OUTCOME_UPSTREAM_ERROR),
    (599, C.OUTCOME_UPSTREAM_ERROR), (600, C.OUTCOME_UPSTREAM_ERROR),
])
def test_status(status: int, want: str) -> None:
    assert outcome_for_status(status) == want


def test_status_rule_is_the_conventions_rule() -> None:
    for status in range(100, 700):
        assert (outcome_for_status(status) == C.OUTCOME_CLIENT_ERROR) == C.http_status_is_client_fault(status)


def _ended(status_outcome: str = C.OUTCOME_OK, *, error_event: bool = False, stream: bool = False,
           complete: bool = False, unparsed_close: bool = False) -> str:
    return ended_outcome(status_outcome, error_event=error_event, stream=stream, complete=complete,
                         unparsed_close=unparsed_close)


def test_ended() -> None:
    assert _ended() == C.OUTCOME_OK  # an untimed or plain body that ended by its framing
    assert _ended(stream=True, complete=True) == C.OUTCOME_OK
    assert _ended(stream=True) == C.OUTCOME_TRUNCATED  # no [DONE] nor finish_reason
    assert _ended(unparsed_close=True) == C.OUTCOME_TRUNCATED
    assert _ended(error_event=True, stream=True, complete=True) == C.OUTCOME_ABORTED  # an error event wins
    assert _ended(C.OUTCOME_UPSTREAM_ERROR, stream=True) == C.OUTCOME_UPSTREAM_ERROR  # the status decides first
    assert _ended(C.OUTCOME_CLIENT_ERROR, unparsed_close=True) == C.OUTCOME_CLIENT_ERROR
    assert _ended(C.OUTCOME_UPSTREAM_ERROR, error_event=True) == C.OUTCOME_ABORTED


def test_left() -> None:
    ok = C.OUTCOME_OK
    assert left_outcome(ok, complete=True, responded=True, gave_up=True) == ok  # closed after [DONE]
    assert left_outcome(C.OUTCOME_UPSTREAM_ERROR, complete=False, responded=True, gave_up=True) == \
        C.OUTCOME_UPSTREAM_ERROR  # it left an error response: the error counts
    assert left_outcome(ok, complete=False, responded=True, gave_up=True) == C.OUTCOME_CLIENT_GAVE_UP
    assert left_outcome(ok, complete=False, responded=False, gave_up=True) == C.OUTCOME_CLIENT_GAVE_UP
    assert left_outcome(ok, complete=False, responded=True, gave_up=False) == C.OUTCOME_CLIENT_DISCONNECTED
    assert left_outcome(ok, complete=False, responded=False, gave_up=False) == C.OUTCOME_CLIENT_DISCONNECTED
    assert left_outcome(C.OUTCOME_UPSTREAM_ERROR, complete=False, responded=False, gave_up=False) == \
        C.OUTCOME_CLIENT_DISCONNECTED  # no head yet: the status outcome is not known
