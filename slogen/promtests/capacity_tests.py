"""promtool unit tests for the capacity rules: a pool filling up, and a full but stable pool.

Every request in the staged histograms is at most 1024 prompt tokens and 1024 output tokens (99 of
every 100 in the first bucket), so the p99 footprint is exactly 2048 tokens: 128 blocks of 16 tokens
per seat. Besides the alerts, the tests pin the recorded seats of each engine and pool.

- Filling up: a pool of two replicas sits under N seats (the ticket fires after its `for`), then one
  replica's free blocks fall steadily while the queue grows: the forecast drops under M minutes and the
  page fires after its `for`. Before the fall, no page.
- Full but healthy: a pool under N seats whose seats and queue do not move: the ticket fires, the page
  never does (no falling trend, no growing queue).
Thresholds and windows come from the options, so the tests follow `--capacity-seats-low` etc.
"""

from __future__ import annotations

from llmslo import conventions as c
from llmslo.conventions import CAPACITY as K
from llmslo.durations import MINUTE
from slogen.rules.capacity import CapacityOptions
from slogen.rules.health import HealthAlert
from slogen.promtests.health_tests import CLUSTER, STEP, alert_check as _check
from llmslo.gofloat import go_g
from slogen.gofmt import label_filter

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
    ]}
