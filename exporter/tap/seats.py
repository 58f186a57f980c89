"""KV seats that hold: how many more p99-sized requests the engine's KV cache takes before it must preempt.

Pure arithmetic, no I/O (the admission gate calls `estimate` once per reading; the simulator's ground-truth
tests call it on a copied engine state). Three corrections over "free tokens / footprint":

- **Committed growth.** A running request still grows into free blocks until it ends (vLLM allocates a decode
  block when the last one fills; it reserves nothing for the output at admission), and a queued one has not
  taken its prompt yet; those that end meanwhile free what they hold. `estimate` follows both over the life of
  a new request, with each in-flight request's chance of having ended taken from the learned output lengths
  (given what it has produced and its max_tokens), and counts the room where it is least.
- **Exact sizes.** A tap sees every request's token counts (usage) exactly; `Sizes.from_samples` uses them.
  Without enough of them (`MIN_SAMPLES`), the engine's histograms are read (`Sizes.from_histograms`): each
  bucket counts at its upper edge, so the p99 errs high by up to one bucket's width (vLLM's 1-2-5 ladder:
  up to +150% of the value, see docs/capacity.md).
- **No start-up bias.** With neither (a fresh engine), the footprint is the operator's fallback and every
  in-flight request commits its whole max_tokens (or the fallback when it has none): seats err low until the
  first requests finish, never high.

Prefix caching: the free tokens come from the engine's own free count, which in vLLM V1 (and the simulator)
includes cached blocks no running request references (they stay in the free queue, evictable, until handed
out), so reclaimable cache is already counted as free; blocks shared by running requests are in use. What the
free count cannot say is that a new request whose prompt starts with a cached prefix takes blocks only for the
rest: `cached_share` (the engine's prefix-cache hit ratio, bounded by the caller) takes that share off every
prompt, the new requests' and the in-flight ones'.

Several taps (`--workers N`) each see only their own in-flight requests: `taps` counts every one N times (the
others are taken to hold as many alike), so N workers' seats are the engine's, not N times them.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llmslo.histograms import Buckets, histogram_quantile

QUANTILE = 0.99  # a seat is room for one request of this quantile's size
MIN_SAMPLES = 20  # exact sizes needed before they are trusted over the engine's histograms
WINDOW = 2048  # finished requests whose exact sizes are kept (a bounded ring)


@dataclass(frozen=True, slots=True)
class InFlight:
    """A request admitted and not finished, as the tap sees it."""

    produced: int  # output tokens streamed so far
    max_tokens: int | None  # its cap on output tokens (x choices), when the client set one


@dataclass(frozen=True)
class Distribution:
    """Weighted values in ascending order with their suffix sums: the residual of a length distribution."""

    values: tuple[float, ...]
    weights: tuple[float, ...]
    _count_above: tuple[float, ...]  # weight of values[i:], one longer than values (0 at the end)
    _sum_above: tuple[float, ...]  # weighted sum of values[i:]

    @classmethod
    def of(cls, pairs: Iterable[tuple[float, float]]) -> Distribution:
        merged: dict[float, float] = {}
        for v, w in pairs:
            if w > 0 and math.isfinite(v) and math.isfinite(w):
                merged[v] = merged.get(v, 0.0) + w
        values = tuple(sorted(merged))
        weights = tuple(merged[v] for v in values)
        count, total = [0.0], [0.0]
        for v, w in zip(reversed(values), reversed(weights), strict=True):
            count.append(count[-1] + w)
            total.append(total[-1] + v * w)
        return cls(values, weights, tuple(reversed(count)), tuple(reversed(total)))

    @property
    def total(self) -> float:
        return self._count_above[0] if self.values else 0.0

    def mean(self) -> float:
        return self._sum_above[0] / self.total if self.total else 0.0

    def residual(self, produced: float, cap: float | None) -> float:
        """E[min(L, cap) - produced | L > produced]: the tokens a request of this distribution that has
        produced `produced` will still take; 0 when no value is longer (it is about to end)."""
        i = bisect_right(self.values, produced)
        n = self._count_above[i]
        if n <= 0:
            return 0.0
        if cap is None or cap >= self.values[-1]:
            return self._sum_above[i] / n - produced
        j = max(i, bisect_right(self.values, cap))
        capped_sum = (self._sum_above[i] - self._sum_above[j]) + cap * self._count_above[j]
        return max(0.0, capped_sum / n - produced)

    def ended_by(self, produced: float, cap: float | None, upto: float) -> float:
        """P(min(L, cap) <= upto | L > produced): the chance a request of this age has ended by `upto` tokens."""
        if cap is not None and cap <= upto:
            return 1.0
        n = self._count_above[bisect_right(self.values, produced)]
        return 1.0 - self._count_above[bisect_right(self.values, upto)] / n if n > 0 else 1.0


@dataclass(frozen=True)
class Sizes:
    """What is known of request sizes: the footprint a seat is sized for and the output distribution."""

    footprint: float  # tokens of one QUANTILE-sized request (prompt + output)
    prompt_mean: float
    outputs: Distribution | None  # None: nothing learned yet (start-up): in-flight requests commit their cap
    source: str  # "tap", "engine" or "fallback"

    @classmethod
    def from_samples(cls, samples: Sequence[tuple[int, int]]) -> Sizes:
        """Exact (prompt tokens, output tokens) of recent finished requests: the QUANTILE of their sums."""
        totals = sorted(p + o for p, o in samples)
        rank = min(len(totals) - 1, max(0, math.ceil(QUANTILE * len(totals)) - 1))
        return cls(float(totals[rank]), sum(p for p, _ in samples) / len(samples),
                   Distribution.of((float(o), 1.0) for _, o in samples), "tap")

    @classmethod
    def from_histograms(cls, prompt: Buckets, output: Buckets) -> Sizes | None:
        """The engine's request-size histograms (cumulative buckets, summed over its series): the sum of the
        two QUANTILEs (at least the QUANTILE of the sum for positively related sizes), each bucket at its upper
        edge (the +Inf bucket at the last finite edge); None when no request is in them."""
        p, o = histogram_quantile(QUANTILE, prompt), histogram_quantile(QUANTILE, output)
        if p is None or o is None:
            return None
        prompt_d, output_d = _upper_edges(prompt), _upper_edges(output)
        if not prompt_d.total or not output_d.total:
            return None
        return cls(max(1.0, p + o), prompt_d.mean(), output_d, "engine")

    @classmethod
    def fallback(cls, footprint: float) -> Sizes:
        return cls(footprint, footprint, None, "fallback")


def _upper_edges(buckets: Buckets) -> Distribution:
    pairs, below, last_edge = [], 0.0, 0.0
    for le, n in buckets:
        edge = le if math.isfinite(le) else last_edge
        pairs.append((edge, n - below))
        below, last_edge = n, (le if math.isfinite(le) else last_edge)
    return Distribution.of(pairs)


class SizeWindow:
    """The exact sizes of the last `capacity` finished requests (the tap's usage counts), bounded."""

    def __init__(self, capacity: int = WINDOW) -> None:
        self._ring: deque[tuple[int, int]] = deque(maxlen=capacity)

    def add(self, prompt_tokens: int, output_tokens: int) -> None:
        if prompt_tokens >= 0 and output_tokens >= 0:
            self._ring.append((prompt_tokens, output_tokens))

    def __len__(self) -> int:
        return len(self._ring)

    def sizes(self) -> Sizes | None:
        return Sizes.from_samples(tuple(self._ring)) if len(self._ring) >= MIN_SAMPLES else None


GRID = 32  # points of a new request's life at which the room is checked
Z = 1.25  # the room is its mean less this many standard deviations of which in-flight requests end when (below)


def decode_growth(in_flight: Iterable[InFlight], steps: float) -> float:
    """The KV tokens the started in-flight requests take over the next `steps` decode steps: a token a step
    each, up to what its max_tokens leaves (a request with no cap grows every step). A request that has produced
    nothing may still be queued and takes its prompt, not a decode token. Finishes within the steps are not
    credited: they free blocks at times unknown, while the growth is taken at every step."""
    if not (steps > 0 and math.isfinite(steps)):
        return 0.0
    total = 0.0
    for r in in_flight:
        if r.produced >= 1:
            left = steps if r.max_tokens is None else max(0.0, r.max_tokens - r.produced)
            total += min(steps, left)
    return total


def committed_tokens(in_flight: Iterable[InFlight], sizes: Sizes, cached_share: float = 0.0) -> float:
    """The KV tokens the in-flight requests will still take (expected remaining output, plus the uncached prompt
    of each that has produced nothing: it may still be queued or prefilling); shown beside the seats."""
    d, total, uncached = sizes.outputs, 0.0, 1.0 - cached_share
    for r in in_flight:
        if d is None:  # start-up: nothing learned, so it runs to its cap and its prompt is as large as a seat
            total += max(0.0, (r.max_tokens if r.max_tokens is not None else sizes.footprint) - r.produced)
            total += sizes.footprint if r.produced == 0 else 0.0
        else:
            total += d.residual(r.produced, r.max_tokens) + (sizes.prompt_mean * uncached if r.produced == 0 else 0.0)
    return total


@dataclass(frozen=True)
class SeatEstimate:
    seats: float
    free_tokens: float  # what the engine said
    committed: float  # what its in-flight requests will still take (committed_tokens)
    footprint: float  # one seat, in tokens, rounded up to whole blocks
    source: str


def estimate(free_tokens: float, block_size: float, in_flight: Iterable[InFlight], sizes: Sizes, *,
             cached_share: float = 0.0, taps: int = 1) -> SeatEstimate:
    """The most QUANTILE-sized requests that fit now and at every step of their lives, erring low.

    `cached_share` (0 to below 1): the share of every prompt expected from the prefix cache, taking no new block;
    `taps`: the tap processes sharing the engine, each seeing its own in-flight requests (module docstring).

    New requests take their prompt at once and grow by a token a step for their output. Meanwhile each in-flight
    request either has ended by t steps from now (probability p, from the learned output distribution given its
    age and cap), freeing what it holds, or has grown t more; one that has produced nothing may still be queued,
    so it takes a mean prompt first. The room left for the new ones at t is free tokens plus the mean of that
    change less Z standard deviations (which requests end when is random, and room is lost at the worst step,
    not on average: the mean alone read up to 1.5x the truth near capacity, crediting no end 0.65-0.8x); seats is
    the least of room(t) / (a new request's size at t) over GRID + 1 points of its life. At start-up (nothing
    learned) no request is credited with ending and each commits its whole cap: seats err low until requests
    finish."""
    block = block_size if math.isfinite(block_size) and block_size >= 1 else 1.0
    whole = lambda tokens: math.ceil(max(1.0, tokens) / block) * block  # noqa: E731  (a request holds whole blocks)
    cached_share = min(max(cached_share, 0.0), 1.0) if math.isfinite(cached_share) else 0.0
    taps = max(1, taps)
    flights = list(in_flight)  # each counted `taps` times below, not copied: this runs on the tap's event loop
    committed = committed_tokens(flights, sizes, cached_share) * taps
    d = sizes.outputs
    if d is None:
        return SeatEstimate(max(0.0, free_tokens - committed) / whole(sizes.footprint), free_tokens, committed,
                            whole(sizes.footprint), sizes.source)
    mean_out = d.mean()
    new_output = sizes.footprint * mean_out / (mean_out + sizes.prompt_mean) if mean_out + sizes.prompt_mean else 0.0
    new_prompt = (sizes.footprint - new_output) * (1.0 - cached_share)
    prompt_mean = sizes.prompt_mean * (1.0 - cached_share)  # what a request's prompt takes of the free KV
    # requests alike to a block (output so far down, but never to 0; cap up: a cap ends a request no earlier) are
    # taken together, so the cost is GRID x the kinds of request in flight, not x their number (nor x taps)
    groups = Counter((r.produced if r.produced < block else int(r.produced // block * block),
                      None if r.max_tokens is None else math.ceil(r.max_tokens / block) * block) for r in flights)
    for key in groups:
        groups[key] *= taps
    seats = math.inf
    for step in range(GRID + 1):
        t = new_output * step / GRID
        mean = var = 0.0
        for (produced, cap), n in groups.items():
            # ended by t (probability p): it freed what it holds now; else it has grown t more
            p = d.ended_by(produced, cap, produced + t)
            if produced:
                held = prompt_mean + produced
                mean += n * (p * held - (1.0 - p) * t)
                var += n * p * (1.0 - p) * (held + t) ** 2
            else:  # it may be queued: it takes a mean prompt first
                mean -= n * (1.0 - p) * (prompt_mean + t)
                var += n * p * (1.0 - p) * (prompt_mean + t) ** 2
        room = free_tokens + mean - Z * math.sqrt(var)
        seats = min(seats, max(0.0, room) / whole(new_prompt + t))
    return SeatEstimate(seats, free_tokens, committed, whole(new_prompt + new_output), sizes.source)
