"""promtool unit tests for the capacity rules: a pool filling up, and a full but stable pool.

Every request in the staged histograms is at most 1024 prompt tokens and 1024 output tokens (99 of
every 100 in the first bucket), so the p99 footprint is exactly 2048 tokens: 128 blocks of 16 tokens
per seat. Besides the alerts, the tests pin the recorded seats of each engine and pool.

- Filling up: a pool of two replicas sits under N seats (the ticket fires after its `for`), then one
  replica's free blocks fall steadily while the queue grows: the forecast drops under M minutes and the
  page fires after its `for`. Before the fall, no page.
- Full but healthy: a pool under N seats whose seats and queue do not move: the ticket fires, the page
  never does (no falling trend, no growing queue).
- vLLM's order: free tokens fall steadily while nothing queues (vLLM queues only once the KV cache is
  full) and requests run whose committed growth is 2 minutes of the fall, then free tokens sit at ~0 while
  the queue grows, then the load drops. The forecast reads net free tokens (2 minutes earlier than raw
  ones), so the page fires at least 5 minutes before they reach 0 (7 before raw free tokens do), with the
  queue still empty; stays firing through the exhaustion, where each waiting request commits a p50 request
  so the net keeps falling; and clears once the pool recovers.
- Healthy and fluctuating: free tokens swing by a third in a triangle, and a small queue grows on every
  fall (a batch-size limit, not KV): the forecast never drops under the horizon and the page never fires.
Thresholds and windows come from the options, so the tests follow `--capacity-seats-low` etc.
"""

from __future__ import annotations

import math

from llmslo import conventions as c
from llmslo.conventions import CAPACITY as K
from llmslo.durations import MINUTE
from llmslo.gofloat import go_g
from slogen.gofmt import label_filter
from slogen.promtests.health_tests import CLUSTER, STEP
from slogen.promtests.health_tests import alert_check as _check
from slogen.rules.capacity import EXHAUSTION_LEAD, CapacityOptions
from slogen.rules.health import HealthAlert

BLOCK = 16
SEAT_BLOCKS = 128  # 2048 tokens of p99 footprint / 16 tokens per block


def _m(ms: int) -> int:
    return ms // MINUTE


def _engine(ns: str, model: str, pod: str) -> dict[str, str]:
    return {c.LABEL_ENGINE: "vllm", c.LABEL_MODEL: model, c.LABEL_POD: pod, c.LABEL_NAMESPACE: ns,
            c.LABEL_NODE: "gpu-node-a", c.LABEL_CLUSTER: CLUSTER}


def _pool(labels: dict[str, str]) -> dict[str, str]:
    return {k: labels[k] for k in K.POOL_LABELS}


def _sizes(labels: dict[str, str], end: int) -> list[tuple[str, dict[str, str], str]]:
    """Request-size histograms: 100 requests a minute, 99 of them in the first bucket."""
    out = []
    for metric, edges in ((c.REQUEST_PROMPT_TOKENS, ("1024", "2048", "+Inf")),
                          (c.REQUEST_GENERATION_TOKENS, ("1024", "+Inf"))):
        for le in edges:
            per_min = 99 if le == "1024" else 100
            out.append((f"{metric.name}_bucket", {**labels, c.LABEL_LE: le}, f"0+{per_min}x{end}"))
    return out


def _engine_series(labels: dict[str, str], free: str, waiting: str, end: int) -> list[tuple[str, dict[str, str], str]]:
    return [(c.KV_BLOCKS_FREE.name, labels, free), (c.KV_BLOCK_SIZE.name, labels, f"{BLOCK}x{end}"),
            (c.REQUESTS_WAITING.name, labels, waiting), *_sizes(labels, end)]


def _num(x: float) -> str:
    return go_g(round(x, 6))


def _sample(name: str, labels: dict[str, str], minute: int, value: float) -> dict:
    return {"expr": name + label_filter(labels), "eval_time": f"{minute}m",
            "exp_samples": [{"labels": label_filter({"__name__": name, **labels}), "value": value}]}


def _near(name: str, labels: dict[str, str], minute: int, value: float) -> dict:
    """`name` is `value` at `minute`, to 1e-6 (a value recorded through a histogram quantile is not exact)."""
    return {"expr": f"count(abs({name}{label_filter(labels)} - {value!r}) < 1e-6)", "eval_time": f"{minute}m",
            "exp_samples": [{"labels": "{}", "value": 1}]}


def capacity_tests(alerts: list[HealthAlert], opts: CapacityOptions, rule_file: str) -> dict:
    low, page = (next(a for a in alerts if a.rule.alert == name) for name in (K.SEATS_LOW, K.SEATS_EXHAUSTION))
    low_for, trend, page_for = _m(opts.seats_low_for), _m(opts.trend_window), _m(opts.exhaustion_for)
    horizon = opts.exhaustion_minutes
    # Filling pool: S0 = N/2 seats, 90% on vllm-0 (which drains from minute D at r seats a minute), 10% on vllm-1.
    # The page must fire at D + trend + for + 1 while vllm-0 still has seats, and the forecast must be under the
    # horizon from D + trend on: trend + for + 2 < 0.9 S0/r and S0/r - trend < horizon.
    s0 = opts.seats_low / 2
    ratio = ((trend + page_for + 2) / 0.9 + horizon + trend) / 2  # S0 / r, in minutes
    r = s0 / ratio
    d = low_for + 5
    fire = d + trend + page_for + 1
    end = fire + 10
    a_blocks, b_blocks, step = 0.9 * s0 * SEAT_BLOCKS, 0.1 * s0 * SEAT_BLOCKS, r * SEAT_BLOCKS
    drain = int(0.9 * s0 / r)  # whole minutes of falling before vllm-0 is empty
    a, b = _engine("llm", "llama-3-8b", "vllm-0"), _engine("llm", "llama-3-8b", "vllm-1")
    filling = [
        *_engine_series(a, f"{_num(a_blocks)}x{d} {_num(a_blocks - step)}-{_num(step)}x{drain - 1} 0x{end}",
                        f"0x{d} 1+1x{end - d}", end + 1),
        *_engine_series(b, f"{_num(b_blocks)}x{end + 1}", f"2x{end + 1}", end + 1),
    ]
    # Full but healthy: 0.2 N seats that do not move, a queue that does not grow.
    e, f = _engine("batch", "mixtral-8x7b", "batch-0"), _engine("batch", "mixtral-8x7b", "batch-1")
    full_blocks = 0.1 * opts.seats_low * SEAT_BLOCKS
    quiet_end = max(end, 60)
    stable = [s for x in (e, f) for s in _engine_series(x, f"{_num(full_blocks)}x{quiet_end + 1}", f"5x{quiet_end + 1}", quiet_end + 1)]
    filling_checks = [_check(low, 1, None), _check(low, low_for + 2, _pool(a)), _check(low, fire, _pool(a)),
                      _check(page, d, None), _check(page, d + 1, None), _check(page, fire, _pool(a))]
    stable_checks = [_check(low, 1, None), _check(low, low_for + 2, _pool(e)), _check(low, quiet_end, _pool(e))]
    stable_checks += [_check(page, m, None) for m in sorted({low_for + 2, quiet_end // 2, quiet_end})]
    samples = [
        _sample(K.FREE_TOKENS, {k: a[k] for k in K.ENGINE_LABELS}, 5, a_blocks * BLOCK),
        _sample(K.FOOTPRINT_P99, {k: a[k] for k in K.ENGINE_LABELS}, 5, 2048),
        _sample(K.SEATS_P99, {k: a[k] for k in K.ENGINE_LABELS}, 5, 0.9 * s0),
        _sample(K.POOL_SEATS_P99, _pool(a), 5, s0),
        _sample(K.POOL_WAITING, _pool(a), 5, 2),
    ]

    def doc(title, series, checks, extra=()):
        return {"name": title, "interval": STEP,
                "input_series": [{"series": n + label_filter(lb), "values": v} for n, lb, v in series],
                "alert_rule_test": sorted(checks, key=lambda x: (int(x["eval_time"][:-1]), x["alertname"])),
                **({"promql_expr_test": list(extra)} if extra else {})}

    return {"rule_files": [rule_file], "evaluation_interval": STEP, "tests": [
        doc(f"filling pool: under {go_g(opts.seats_low)} seats tickets after {low_for}m; seats falling from {d}m "
            f"with the queue growing page after the forecast drops under {go_g(horizon)} minutes",
            filling, filling_checks, samples),
        doc("full but healthy pool: seats low and stable, queue steady: ticket, never a page", stable, stable_checks),
        doc(*_vllm_order(page, opts)),
        doc(*_fluctuating(page, opts)),
        doc(*_hourly_wave(page, opts)),
        doc(*_long_fill(page, opts)),
        doc(*_wave_on_trend(page, opts)),
    ]}


def _p50_output() -> float:
    """The p50 of the staged output histogram (99 of 100 requests in the first bucket, 0..1024)."""
    return 1024 * 50 / 99


def _vllm_order(page: HealthAlert, opts: CapacityOptions) -> tuple[str, list, list, list]:
    """Free tokens fall with requests running, then the queue grows at ~0 free, then recovery: page before,
    during, not after."""
    trend, page_for, horizon = _m(opts.trend_window), _m(opts.exhaustion_for), math.ceil(opts.exhaustion_minutes)
    # Two replicas, each losing one p99 seat (s blocks) a minute from minute D for X minutes: raw free tokens reach 0
    # at t_x = D + X. Each runs R requests whose committed growth (R x the p50 output) is K minutes of that fall, so
    # the net free tokens the forecast reads reach 0 at t_x - K. The forecast is remaining minutes = X - K - (t - D)
    # once the trend window lies on the fall (before, deriv is a weighted mean of 0 and the fall's slope, so the
    # forecast is longer). It first drops under the horizon M at t_p = D + X - K - ceil(M) + 1, which is on the fall
    # when X = ceil(M) + trend + K (t_p - trend = D + 1 >= D); the page fires `for` later, ceil(M) - 1 - for >= 5
    # minutes before the net tokens run out and K more before the raw ones do (the options require the 5).
    s, d, k = SEAT_BLOCKS, 5, 2
    x = horizon + trend + k
    t_x = d + x
    t_p = d + x - k - horizon + 1
    fire = t_p + page_for
    assert t_x - k - fire >= _m(EXHAUSTION_LEAD), (t_x, fire)
    running = k * s * BLOCK / _p50_output()
    # Exhausted for trend + 10 minutes: free flickers between 8 and 0 blocks per replica (1/16 of a seat: the pool
    # holds under one seat), the queue grows by one a minute per replica from t_x + 1, each waiting request
    # committing a p50 request: the net keeps falling, so the forecast holds the page, and so does the queue arm.
    t_r = t_x + trend + 10
    end = t_r + trend + 5
    flicker = " ".join("8" if i % 2 == 0 else "0" for i in range(t_r - t_x - 1))
    recovered = x * s // 2  # load dropped: half the starting free tokens back, the queue drained
    free = f"{x * s}x{d} {(x - 1) * s}-{s}x{x - 1} {flicker} {recovered}x{end - t_r}"
    waiting = f"0x{t_x} 1+1x{t_r - t_x - 2} 0x{end - t_r}"
    a, b = _engine("llm", "llama-3-70b", "vllm-0"), _engine("llm", "llama-3-70b", "vllm-1")
    series = [*_engine_series(a, free, waiting, end), *_engine_series(b, free, waiting, end)]
    series += [(c.REQUESTS_RUNNING.name, e, f"{_num(running)}x{end}") for e in (a, b)]
    pool = _pool(a)
    checks = [_check(page, m, None) for m in (d, t_p, fire - 1)]
    checks += [_check(page, m, pool) for m in (fire, t_x - k - _m(EXHAUSTION_LEAD), t_x - k, t_x, t_x + 1,
                                                t_x + trend + 2, t_r - 1)]
    checks += [_check(page, m, None) for m in (t_r + 1, t_r + trend + 2, end)]
    samples = [
        _sample(K.POOL_FREE_TOKENS, pool, d, 2 * x * s * BLOCK),
        _sample(K.POOL_FREE_TOKENS_NET, pool, d, 2 * (x - k) * s * BLOCK),  # less what the running requests commit
        # first under the horizon with ceil(M) - 1 minutes left (raw free tokens alone: K more), nothing queued yet
        _sample(K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION, pool, t_p, horizon - 1),
        _sample(K.POOL_WAITING, pool, fire, 0),
        _sample(K.POOL_WAITING, pool, t_r - 1, 2 * (t_r - t_x - 1)),
        _sample(K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION, pool, t_x + trend + 2, 0),  # out, and still falling
    ]
    title = (f"vLLM's order: net free tokens fall from {d}m and run out at {t_x - k}m (raw free at {t_x}m) with no "
             f"queue; the page fires at {fire}m, stays up while the queue grows until {t_r}m, clears on recovery")
    return title, series, checks, samples


def _fluctuating(page: HealthAlert, opts: CapacityOptions) -> tuple[str, list, list, list]:
    """A healthy pool whose free tokens and queue swing: no forecast under the horizon, no page."""
    horizon = math.ceil(opts.exhaustion_minutes)
    # Each replica's free blocks run a triangle: fall by s a minute for P minutes from `lo + P s`, rise back. deriv
    # is a weighted mean of the minute-to-minute changes, so it never falls faster than s a minute, and free
    # tokens never go under lo: the forecast is at least lo / s = ceil(M) + 1 minutes > M at any window. The
    # queue grows by one a minute on every fall (the batch is full, the cache is not): the pool holds at least
    # 2 lo / SEAT_BLOCKS seats, far over one, so the exhausted arm does not hold either.
    s, period = SEAT_BLOCKS, 8
    lo = (horizon + 1) * s
    cycles = max(4, math.ceil((_m(opts.trend_window) + _m(opts.exhaustion_for) + 10) / (2 * period)))
    end = 2 * period * cycles
    free = " ".join(f"{lo + period * s}-{s}x{period - 1} {lo}+{s}x{period - 1}" for _ in range(cycles)) + f" {lo + period * s}"
    waiting = " ".join(f"0+1x{period - 1} 0x{period - 1}" for _ in range(cycles)) + " 0"
    a, b = _engine("chat", "qwen2.5-7b", "vllm-0"), _engine("chat", "qwen2.5-7b", "vllm-1")
    series = [*_engine_series(a, free, waiting, end), *_engine_series(b, free, waiting, end)]
    pool = _pool(a)
    checks = [_check(page, m, None) for m in range(0, end + 1)]
    under = f"{K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION}{label_filter(pool)} < {go_g(opts.exhaustion_minutes)}"
    samples = [{"expr": under, "eval_time": f"{m}m", "exp_samples": []} for m in range(0, end + 1)]
    samples.append(_sample(K.POOL_FREE_TOKENS, pool, period, 2 * lo * BLOCK))  # the bottom of the first fall
    title = (f"healthy pool: free tokens swing between {lo} and {lo + period * s} blocks a replica, the queue grows on "
             "every fall: the forecast stays over the horizon, never a page")
    return title, series, checks, samples


def _wave_values(bottoms: list[float], fall: float, drift: float, period: int, length: int) -> str:
    """A replica's free blocks a minute under load that comes in waves: bottoms[i] seats at minute i x period,
    reached by a fall of `fall` seats a minute over the wave's last `length` minutes and left by a jump back up
    in one minute; in between, free seats drift down by `drift` a minute (0: no trend under the waves)."""
    seats = [bottoms[0]]
    for bottom in bottoms[1:]:
        for before in range(period - 1, -1, -1):  # minutes before this wave's bottom
            fell = min(before, length)
            seats.append(bottom + fall * fell + drift * (before - fell))
    return " ".join(_num(s * SEAT_BLOCKS) for s in seats)


def _wave_shape(opts: CapacityOptions) -> tuple[int, int, float]:
    """(wave period, fall minutes, fall in seats a minute a replica) of the staged waves: a fall long enough to
    put the trend window on it for `for` and two steps more, at a rate that brings a bottom of 8 seats a replica
    within the horizon (the forecast alone paged on it) while the window is on the fall, and that takes a bottom
    half a seat under the last one in under `for` (what `for` is there to absorb)."""
    period, page_for = _m(opts.wave_period), _m(opts.exhaustion_for)
    return period, _m(opts.trend_window) + page_for + 1, max(16 / (opts.exhaustion_minutes - page_for - 1), 1 / page_for)


def _hourly_wave(page: HealthAlert, opts: CapacityOptions) -> tuple[str, list, list, list]:
    """Waves that come back to about where the last one went (14-16 pool seats at each bottom): never a page."""
    period, length, fall = _wave_shape(opts)
    bottoms = [7.5, 7.0, 8.0, 7.5, 7.0]  # seats a replica at each wave's bottom: the pool's 15, 14, 16, 15, 14
    end = period * (len(bottoms) - 1) + 2
    values = _wave_values(bottoms, fall, 0.0, period, length) + f" {_num((bottoms[-1] + fall * length) * SEAT_BLOCKS)}x2"
    a, b = _engine("batch", "llama-3-70b", "vllm-0"), _engine("batch", "llama-3-70b", "vllm-1")
    series = [*_engine_series(a, values, f"0x{end}", end), *_engine_series(b, values, f"0x{end}", end)]
    pool = _pool(a)
    checks = [_check(page, m, None) for m in range(0, end + 1)]
    samples = [_near(K.POOL_SEATS_P99, pool, i * period, 2 * s) for i, s in enumerate(bottoms) if i]
    title = (f"load waves every {period}m (a batch job): each replica falls {go_g(round(fall, 2))} seats a minute for "
             f"{length}m to a bottom of 14-16 pool seats and jumps back; no wave goes under the last one's bottom for "
             "long, so no page (the forecast alone paged on every wave)")
    return title, series, checks, samples


def _wave_on_trend(page: HealthAlert, opts: CapacityOptions) -> tuple[str, list, list, list]:
    """The same waves on a downward trend: each bottom lower than the last by F + 1.5 minutes of the fall, so the
    third wave stays under the second's bottom for `for` and pages; the second (higher) does not."""
    period, length, fall = _wave_shape(opts)
    page_for, horizon = _m(opts.exhaustion_for), opts.exhaustion_minutes
    under = page_for + 1.5  # minutes each wave's fall spends under the last one's bottom
    step = under * fall  # seats a replica each bottom is lower than the last
    # The third wave pages iff its forecast is under M for all of its F + 2 evaluations under the second's bottom
    # (bottom < (M - F - 1) x fall); the second does not iff it has at most F (bottom >= (M - F) x fall).
    lo, hi = max(0.0, (horizon - page_for) * fall - step), (horizon - page_for - 1) * fall
    bottom = (lo + hi) / 2
    bottoms = [bottom + 2 * step, bottom + step, bottom]
    end = 2 * period + 2
    values = _wave_values(bottoms, fall, step / period, period, length) + f" {_num((bottom + fall * length) * SEAT_BLOCKS)}x2"
    a, b = _engine("batch", "mixtral-8x7b", "vllm-0"), _engine("batch", "mixtral-8x7b", "vllm-1")
    series = [*_engine_series(a, values, f"0x{end}", end), *_engine_series(b, values, f"0x{end}", end)]
    pool = _pool(a)
    checks = [_check(page, m, None) for m in range(0, 2 * period - 1)]
    checks += [_check(page, m, pool) for m in (2 * period - 1, 2 * period)]
    samples = [_near(K.POOL_SEATS_P99, pool, i * period, 2 * s) for i, s in enumerate(bottoms) if i]
    title = (f"load waves on a downward trend: each bottom {go_g(round(2 * step, 2))} pool seats under the last "
             f"({go_g(round(2 * bottoms[0], 1))}, {go_g(round(2 * bottoms[1], 1))}, {go_g(round(2 * bottom, 1))}); the "
             f"third wave stays under the second's bottom for {go_g(under)}m and pages at its bottom, the trend would "
             f"run the pool out {go_g(round(bottom / step * period))}m later")
    return title, series, checks, samples


def _long_fill(page: HealthAlert, opts: CapacityOptions) -> tuple[str, list, list, list]:
    """A steady fill longer than a wave period and the trend window: on time, as the forecast alone would page."""
    trend, page_for, horizon = _m(opts.trend_window), _m(opts.exhaustion_for), math.ceil(opts.exhaustion_minutes)
    d, rate = 5, SEAT_BLOCKS // 4  # a quarter of a p99 seat a minute a replica
    x = _m(opts.wave_period) + trend + horizon  # minutes of fall: the forecast is under M with a wave period of it behind
    t_x, t_p = d + x, d + x - horizon + 1  # empty; first forecast under M (ceil(M) - 1 minutes left)
    fire, end = t_p + page_for, d + x + 2
    assert t_x - fire >= _m(EXHAUSTION_LEAD), (t_x, fire)
    values = f"{x * rate}x{d} {(x - 1) * rate}-{rate}x{x - 1} 0x2"
    a, b = _engine("rag", "llama-3-8b", "vllm-0"), _engine("rag", "llama-3-8b", "vllm-1")
    series = [*_engine_series(a, values, f"0x{end}", end), *_engine_series(b, values, f"0x{end}", end)]
    pool = _pool(a)
    checks = [_check(page, m, None) for m in (d, t_p, fire - 1)]
    checks += [_check(page, m, pool) for m in (fire, t_x - _m(EXHAUSTION_LEAD), t_x - 1)]
    samples = [_sample(K.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION, pool, t_p, horizon - 1)]
    title = (f"steady fill for {x}m (longer than the wave period): a quarter seat a minute a replica from {d}m, "
             f"empty at {t_x}m; the forecast is under {go_g(opts.exhaustion_minutes)} at {t_p}m and the page fires at "
             f"{fire}m, {t_x - fire} minutes ahead")
    return title, series, checks, samples
