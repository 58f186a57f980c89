"""The goodput rule: when one finished request counts as good. The tap and the simulator both judge by it.

A request is good when its outcome is ok and it met BOTH latency objectives its class sets (a missing
objective does not constrain; `<=`, as a histogram's `le`):

- streamed: it produced output (a TTFT was measured), TTFT <= the TTFT objective and TPOT <= the TPOT
  objective. A single output token has no TPOT to hold against the objective (the tap counts it as 0).
- not streamed: the user sees nothing until the end, so the whole response must have arrived by the time a
  stream meeting both objectives would have finished (`response_deadline`), with at least one token.

Definitions of TTFT and TPOT: docs/metrics.md, "Goodput tap".
"""

from __future__ import annotations


def streamed_good(ttft: float | None, tpot: float | None, ttft_max: float | None, tpot_max: float | None) -> bool:
    """Whether a completed stream met both objectives. `ttft` None: no output arrived (not good); `tpot` None
    with a TTFT: a single token, which no TPOT objective can fail."""
    if ttft is None or (ttft_max is not None and ttft > ttft_max):
        return False
    return tpot is None or tpot_max is None or tpot <= tpot_max


def response_deadline(ttft_max: float | None, tpot_max: float | None, n_out: int) -> float | None:
    """How long after its arrival a non-streamed response of `n_out` tokens may take and still be good: as long
    as a stream meeting both objectives would take, TTFT + (n_out - 1) x TPOT. None: unbounded (no TTFT
    objective); a missing TPOT objective adds nothing per token."""
    if ttft_max is None:
        return None
    return ttft_max + (n_out - 1) * (tpot_max or 0.0)


def response_good(e2e: float | None, n_out: int, ttft_max: float | None, tpot_max: float | None) -> bool:
    """Whether a completed non-streamed response of `n_out` tokens, whole after `e2e` seconds, met both objectives."""
    if e2e is None or n_out < 1:
        return False
    deadline = response_deadline(ttft_max, tpot_max, n_out)
    return deadline is None or e2e <= deadline
