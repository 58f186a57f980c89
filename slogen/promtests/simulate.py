"""A step-by-step model of how Prometheus evaluates slogen's rules on synthetic traffic.

Used to write promtool tests whose expectations are computed, not hand-picked: given a
scenario (per-step share of bad events), it yields every window's error ratio and every
tier's state at each evaluation. It mirrors the rules exactly for the inputs the tests
feed: counters that start at 0 on the evaluation grid (so `rate()` needs no extrapolation
and equals increase / window), range selectors [t - W, t], one sample per step, and
sum_over_time over the recorded base-window rates for derived windows.

It models the low-traffic guard too: a guarded page tier fires only when its long window holds
more than N - 0.5 bad events (`rate x seconds`; avg_over_time of the base rate where that window
is derived), and its ticket twin (`<tier>-low-traffic`) fires on the same burn with fewer. Traffic
is uniform by default; the low-traffic scenarios pass the requests of each step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from slogen.model import Tier
from slogen.rules.alerts import low_traffic_tier
from slogen.rules.options import SLOContext
from slogen.rules.sli import windows as sli_windows
from slogen.rules.tiers import HOLD_EXPECTED_EVENTS, held_windows, page_min_bad_events

ROBUST_MARGIN = 0.05  # a checkpoint is robust when no deciding ratio is within 5% of its threshold
ROBUST_EVENTS = 0.25  # ... and no guard's count of bad events within a quarter event of its N - 0.5


@dataclass(frozen=True)
class TierState:
    firing: bool
    robust: bool


@dataclass
class Simulation:
    step: int  # ms
    bad: list[float]  # share of bad events (or 1/0 saturated state for gauge SLIs) in step k
    states: dict[str, list[TierState]]  # tier name -> state at each step
    # (tier, firing edge) -> steps: shared simulations are asked the same questions many times
    _edges: dict[tuple[str, bool], list[int]] = field(default_factory=dict, repr=False, compare=False)
    _robust: list[bool] | None = field(default=None, repr=False, compare=False)

    def robust_steps(self) -> list[bool]:
        """Whether every tier's state is robust at step k, for each step (asked for every SLO sharing it)."""
        if self._robust is None:
            self._robust = [all(states[k].robust for states in self.states.values()) for k in range(len(self.bad))]
        return self._robust

    def fire_steps(self, tier: str) -> list[int]:
        return list(self._steps(tier, True))

    def resolve_steps(self, tier: str) -> list[int]:
        return list(self._steps(tier, False))

    def _steps(self, tier: str, fire: bool) -> list[int]:
        found = self._edges.get((tier, fire))
        if found is None:
            s = self.states[tier]
            found = self._edges[(tier, fire)] = [k for k in range(1, len(s))
                                                  if s[k].firing == fire and s[k - 1].firing != fire]
        return found


_MEMO: dict[tuple, Simulation] = {}
_MEMO_LIMIT = 4096


def simulate(ctx: SLOContext, tiers: list[Tier], bad: list[float], step: int, gauge: bool,
             traffic: list[float] | None = None, units: float = 1.0) -> Simulation:
    """Evaluate every enabled tier (and each guarded page tier's ticket twin) at each step 0..len(bad)-1.

    Request SLIs: step k adds `traffic[k]` units of traffic (1 when not given), `bad[k]` of it bad
    (step 0 is the counters' first sample, so bad[0] is ignored); a unit is `units` events, which
    only the low-traffic guard's counts read. Gauge SLIs: bad[k] is 1 while saturated.

    Remembered by everything it reads (windows, tiers, budget, guard, scenario): SLOs of one shape
    (objective, alert windows, options) share their simulations, which made most of a large build's
    time. Callers treat the result as read-only.
    """
    need = page_min_bad_events(ctx) if not gauge else 0
    key = (ctx.base_window, ctx.derive_above, ctx.opts.sloth_compat, bool(held_windows(ctx)), ctx.error_budget, need,
           tuple(tiers), tuple(bad),
           step, gauge, None if traffic is None else tuple(traffic), units)
    found = _MEMO.get(key)
    if found is None:
        found = _simulate(ctx, tiers, bad, step, gauge, traffic, units, need)
        if len(_MEMO) >= _MEMO_LIMIT:  # also 0: remember nothing
            _MEMO.clear()
        _MEMO[key] = found
    return found


class _Recorded:
    """The recorded series the alerts read, at each step of one scenario: window ratios, the guard's bad events,
    the hold's request rate and last measured step."""

    def __init__(self, ctx: SLOContext, bad: list[float], step: int, gauge: bool, traffic: list[float] | None,
                 units: float) -> None:
        self.n, self.step, self.units = len(bad), step, units
        self.base = ctx.base_window
        self.derive_above = ctx.derive_above  # a property: read once, not per step and window
        self.sloth_compat = ctx.opts.sloth_compat
        self.window = _window_counts(bad, gauge, traffic)
        # Base-window rates at every step, and their prefix sums for derived windows.
        m = self.base // step
        base_e, base_t = zip(*(self.window(k, m) for k in range(self.n)), strict=True) if self.n else ((), ())
        self.PE, self.PT = _cumsum(list(base_e)), _cumsum(list(base_t))
        self._measured: dict[int, list[int]] = {}

    def _raw(self, w: int) -> bool:
        return w == self.base or w <= self.derive_above

    def ratio(self, k: int, w: int) -> float | None:
        steps = w // self.step
        if self._raw(w) or self.sloth_compat:
            e, t = self.window(k, steps)
        else:
            lo = max(0, k - steps)
            e = self.PE[k] - (self.PE[lo - 1] if lo > 0 else 0.0)
            t = self.PT[k] - (self.PT[lo - 1] if lo > 0 else 0.0)
        return e / t if t > 0 else None

    def _derived(self, prefix: list[float], k: int, w: int) -> float | None:
        """avg_over_time of a base-window rate's samples in [t - w, t] (from step 1 on), as a count over base."""
        first = max(1, k - w // self.step)
        return None if k < first else (prefix[k] - prefix[first - 1]) / (k - first + 1)

    def events_rate(self, k: int, w: int) -> float | None:
        """What the hold reads: the recorded request rate over w (per second)."""
        if self._raw(w):
            return self.window(k, w // self.step)[1] * self.units / (w / 1000) if k >= 1 else None
        count = self._derived(self.PT, k, w)
        return None if count is None else count * self.units / (self.base / 1000)

    def bad_events(self, k: int, w: int) -> float | None:
        """What the guard reads: the recorded bad-event rate over w, times w in seconds."""
        if self._raw(w):
            return self.window(k, w // self.step)[0] * self.units if k >= 1 else None
        count = self._derived(self.PE, k, w)
        return None if count is None else count * (w / self.base) * self.units

    def last_measured(self, w: int) -> list[int]:
        """For each step, the last step at or before it whose w-window ratio had traffic (-1: none)."""
        found = self._measured.get(w)
        if found is None:
            found, last = [], -1
            for k in range(self.n):
                if self.ratio(k, w) is not None:
                    last = k
                found.append(last)
            self._measured[w] = found
        return found

    def held(self, k: int, t: Tier, thr: float) -> tuple[float | None, float]:
        """alerts._burn's held short ratio and its margin: the last measured one within the long window, while
        the silence since expected fewer than HOLD_EXPECTED_EVENTS requests at the long window's rate."""
        j = self.last_measured(t.window.short_window)[k]
        if j < max(1, k - t.window.long_window // self.step):
            return None, 1.0
        expected = (k - j) * self.step / 1000 * (self.events_rate(k, t.window.long_window) or 0.0)
        off = abs(expected - HOLD_EXPECTED_EVENTS) / HOLD_EXPECTED_EVENTS
        if expected >= HOLD_EXPECTED_EVENTS:
            return None, off
        r = self.ratio(j, t.window.short_window)
        return r, min(_margin(r, thr), off)


def _margin(r: float | None, thr: float) -> float:
    return abs(r - thr) / thr if (r is not None and thr > 0) else (1.0 if r is None else abs(r))


def _simulate(ctx: SLOContext, tiers: list[Tier], bad: list[float], step: int, gauge: bool,
              traffic: list[float] | None, units: float, need: int) -> Simulation:
    rec = _Recorded(ctx, bad, step, gauge, traffic, units)
    thresholds = {t.name: t.factor * float(ctx.error_budget) for t in tiers}
    hold = bool(held_windows(ctx)) and not gauge
    states: dict[str, list[TierState]] = {t.name: [] for t in tiers}
    states.update({low_traffic_tier(t.name): [] for t in tiers if need and t.severity == "page"})
    for k in range(rec.n):
        for t in tiers:
            thr = thresholds[t.name]
            rs = [rec.ratio(k, t.window.short_window), rec.ratio(k, t.window.long_window)]
            margins = [_margin(r, thr) for r in rs]
            if hold and t.severity == "page":  # alerts._burn: the short window's last ratio with traffic, held
                rs[0], margins[0] = rec.held(k, t, thr)
            firing = all(r is not None and r > thr for r in rs)
            if firing:
                robust = all(mg >= ROBUST_MARGIN for mg in margins)
            else:
                robust = any(r is None or (r < thr and mg >= ROBUST_MARGIN) for r, mg in zip(rs, margins, strict=True))
            if not (need and t.severity == "page"):
                states[t.name].append(TierState(firing, robust))
                continue
            page, ticket = _guarded(firing, robust, rec.bad_events(k, t.window.long_window), need)
            states[t.name].append(page)
            states[low_traffic_tier(t.name)].append(ticket)
    return Simulation(step, bad, states)


def _window_counts(bad: list[float], gauge: bool,
                   traffic: list[float] | None) -> Callable[[int, int], tuple[float, float]]:
    """(bad events, events) in the `steps`-step window ending at step k, from cumulative counts: E[k] bad
    events and T[k] events up to step k. A gauge's window holds its samples j in [k - steps, k]; a counter's
    holds the increase from k - steps to k (none within its first step)."""
    n = len(bad)
    if gauge:
        E = _cumsum([bad[k] for k in range(n)])
        T = _cumsum([1.0] * n)

        def gauge_window(k: int, steps: int) -> tuple[float, float]:
            lo = max(0, k - steps)
            return E[k] - (E[lo - 1] if lo > 0 else 0.0), T[k] - (T[lo - 1] if lo > 0 else 0.0)
        return gauge_window
    if traffic is None:
        E = _cumsum([0.0] + [bad[k] for k in range(1, n)])
        T = _cumsum([0.0] + [1.0] * (n - 1))
    else:
        E = _cumsum([0.0] + [bad[k] * traffic[k] for k in range(1, n)])
        T = _cumsum([0.0] + [traffic[k] for k in range(1, n)])

    def counter_window(k: int, steps: int) -> tuple[float, float]:
        lo = max(0, k - steps)
        if k - lo < 1:
            return 0.0, 0.0
        return E[k] - E[lo], T[k] - T[lo]
    return counter_window


def _guarded(firing: bool, robust: bool, count: float | None, need: int) -> tuple[TierState, TierState]:
    """A guarded page tier's state and its ticket twin's: the page needs `count` bad events over N - 0.5, the
    ticket fires on the same burn without them."""
    enough = count is not None and count > need - 0.5
    sure = count is None or abs(count - (need - 0.5)) >= ROBUST_EVENTS
    page = TierState(firing and enough, (robust and sure) if firing and enough else
                     ((not firing and robust) or (not enough and sure)))
    ticket = TierState(firing and not enough, (robust and sure) if firing and not enough else
                       ((not firing and robust) or (enough and sure)))
    return page, ticket


def _cumsum(xs: list[float]) -> list[float]:
    out, acc = [], 0.0
    for x in xs:
        acc += x
        out.append(acc)
    return out


__all__ = ["Simulation", "TierState", "simulate", "sli_windows"]
