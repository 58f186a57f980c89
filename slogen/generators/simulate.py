"""A step-by-step model of how Prometheus evaluates slogen's rules on synthetic traffic.

Used to write promtool tests whose expectations are computed, not hand-picked: given a
scenario (per-step share of bad events), it yields every window's error ratio and every
tier's state at each evaluation. It mirrors the rules exactly for the inputs the tests
feed: counters that start at 0 on the evaluation grid (so `rate()` needs no extrapolation
and equals increase / window), range selectors [t - W, t], one sample per step, and
sum_over_time over the recorded base-window rates for derived windows.
"""

from __future__ import annotations

from dataclasses import dataclass

from slogen.generators.options import SLOContext
from slogen.generators.sli import windows as sli_windows
from slogen.model import Tier

ROBUST_MARGIN = 0.05  # a checkpoint is robust when no deciding ratio is within 5% of its threshold


@dataclass(frozen=True)
class TierState:
    firing: bool
    robust: bool


@dataclass
class Simulation:
    step: int  # ms
    bad: list[float]  # share of bad events (or 1/0 saturated state for gauge SLIs) in step k
    states: dict[str, list[TierState]]  # tier name -> state at each step

    def fire_steps(self, tier: str) -> list[int]:
        s = self.states[tier]
        return [k for k in range(1, len(s)) if s[k].firing and not s[k - 1].firing]

    def resolve_steps(self, tier: str) -> list[int]:
        s = self.states[tier]
        return [k for k in range(1, len(s)) if not s[k].firing and s[k - 1].firing]


def simulate(ctx: SLOContext, tiers: list[Tier], bad: list[float], step: int, gauge: bool) -> Simulation:
    """Evaluate every enabled tier at each step 0..len(bad)-1.

    Request SLIs: step k adds one unit of traffic, `bad[k]` of it bad (step 0 is the counters'
    first sample, so bad[0] is ignored). Gauge SLIs: bad[k] is 1 while saturated.
    """
    n = len(bad)
    base = ctx.base_window
    m = base // step
    # Cumulative counts: E[k] bad events, T[k] events up to step k.
    if gauge:
        E = _cumsum([bad[k] for k in range(n)])
        T = _cumsum([1.0] * n)

        def window(k: int, steps: int) -> tuple[float, float]:
            lo = max(0, k - steps)  # samples j in [k - steps, k]
            return E[k] - (E[lo - 1] if lo > 0 else 0.0), T[k] - (T[lo - 1] if lo > 0 else 0.0)
    else:
        E = _cumsum([0.0] + [bad[k] for k in range(1, n)])
        T = _cumsum([0.0] + [1.0] * (n - 1))

        def window(k: int, steps: int) -> tuple[float, float]:
            lo = max(0, k - steps)
            if k - lo < 1:
                return 0.0, 0.0
            return E[k] - E[lo], T[k] - T[lo]

    # Base-window rates at every step, and their prefix sums for derived windows.
    base_e, base_t = zip(*(window(k, m) for k in range(n))) if n else ((), ())
    PE, PT = _cumsum(list(base_e)), _cumsum(list(base_t))

    def ratio(k: int, w: int) -> float | None:
        steps = w // step
        if w == base or w <= ctx.derive_above or ctx.opts.sloth_compat:
            e, t = window(k, steps)
        else:
            lo = max(0, k - steps)
            e = PE[k] - (PE[lo - 1] if lo > 0 else 0.0)
            t = PT[k] - (PT[lo - 1] if lo > 0 else 0.0)
        return e / t if t > 0 else None

    thresholds = {t.name: t.factor * float(ctx.error_budget) for t in tiers}
    states: dict[str, list[TierState]] = {t.name: [] for t in tiers}
    for k in range(n):
        for t in tiers:
            thr = thresholds[t.name]
            rs = [ratio(k, t.window.short_window), ratio(k, t.window.long_window)]
            firing = all(r is not None and r > thr for r in rs)
            margins = [abs(r - thr) / thr if (r is not None and thr > 0) else (1.0 if r is None else abs(r)) for r in rs]
            if firing:
                robust = all(mg >= ROBUST_MARGIN for mg in margins)
            else:
                robust = any(r is None or (r < thr and mg >= ROBUST_MARGIN) for r, mg in zip(rs, margins))
            states[t.name].append(TierState(firing, robust))
    return Simulation(step, bad, states)


def _cumsum(xs: list[float]) -> list[float]:
    out, acc = [], 0.0
    for x in xs:
        acc += x
        out.append(acc)
    return out


__all__ = ["Simulation", "TierState", "simulate", "sli_windows"]
