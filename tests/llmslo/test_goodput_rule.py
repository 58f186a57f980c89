"""The goodput rule (llmslo.goodput), the one the tap and the simulator both judge by."""

from __future__ import annotations

import pytest

from llmslo.goodput import response_deadline, response_good, streamed_good


@pytest.mark.parametrize(("ttft", "tpot", "ttft_max", "tpot_max", "good"), [
    (0.5, 0.05, 0.5, 0.05, True),  # both on the edge: `le`, as the histograms
    (0.5000001, 0.05, 0.5, 0.05, False),  # TTFT over
    (0.5, 0.0500001, 0.5, 0.05, False),  # TPOT over: BOTH objectives must hold
    (9.0, 9.0, None, None, True),  # no objective constrains nothing
    (0.1, 9.0, 0.5, None, True),
    (9.0, 0.01, None, 0.05, True),
    (None, None, 10.0, 10.0, False),  # no output arrived
    (None, None, None, None, False),
    (0.4, None, 0.5, 0.001, True),  # a single token: no TPOT to fail
    (0.6, None, 0.5, 0.001, False),
])
def test_a_stream_is_good_within_both_objectives(ttft: float | None, tpot: float | None, ttft_max: float | None,
                                                 tpot_max: float | None, good: bool) -> None:
    assert streamed_good(ttft, tpot, ttft_max, tpot_max) is good


def test_a_response_must_be_whole_by_when_a_good_stream_would_be() -> None:
    assert response_deadline(0.5, 0.05, 11) == pytest.approx(1.0)
    assert response_deadline(0.5, None, 11) == 0.5  # no TPOT objective: nothing per token
    assert response_deadline(None, 0.05, 11) is None  # no TTFT objective: unbounded
    assert response_good(1.0, 11, 0.5, 0.05)
    assert not response_good(1.0001, 11, 0.5, 0.05)
    assert response_good(1e9, 11, None, 0.05)
    assert not response_good(0.1, 0, 0.5, 0.05)  # no token: not good however fast
    assert not response_good(None, 5, 0.5, 0.05)  # never ended
