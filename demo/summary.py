"""Turn two successive exporter pages into the few numbers a person watches: load, KV, latency."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmslo import conventions as c
from exporter.model import MetricFamily


@dataclass(frozen=True)
class ModelRow:
    model: str
    engine: str
    running: float
    waiting: float
    kv_usage: float
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over (upper edge, cumulative count) pairs; NaN when empty."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower_edge, lower_count = 0.0, 0.0
    for edge, count in buckets:
        if count >= rank:
            if math.isinf(edge):
                return lower_edge
            if count == lower_count:
                return edge
            return lower_edge + (edge - lower_edge) * (rank - lower_count) / (count - lower_count)
        lower_edge, lower_count = edge, count
    return buckets[-1][0]


def _by_model(fam: MetricFamily | None, suffix: str = "") -> dict[tuple[str, str], list]:
    out: dict[tuple[str, str], list] = {}
    if fam is None:
        return out
    for s in fam.samples:
        if s.name == fam.name + suffix:
            out.setdefault((s.labels.get(c.LABEL_MODEL, ""), s.labels.get(c.LABEL_ENGINE, "")), []).append(s)
    return out


def _bucket_deltas(now: MetricFamily | None, before: MetricFamily | None) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Per model, each bucket's increase since the previous page (what rate() would see)."""
    prev = {(k, s.labels.get(c.LABEL_LE)): s.value for k, ss in _by_model(before, "_bucket").items() for s in ss}
    out: dict[tuple[str, str], dict[float, float]] = {}
    for key, samples in _by_model(now, "_bucket").items():
        for s in samples:
            le = s.labels.get(c.LABEL_LE, "+Inf")
            edge = float(le)
            out.setdefault(key, {})
            out[key][edge] = out[key].get(edge, 0.0) + s.value - prev.get((key, le), 0.0)
    return {k: sorted(v.items()) for k, v in out.items()}


def model_rows(now: dict[str, MetricFamily], before: dict[str, MetricFamily]) -> list[ModelRow]:
    def gauge(metric: c.MetricDef) -> dict[tuple[str, str], float]:
        return {k: sum(s.value for s in v) for k, v in _by_model(now.get(metric.name)).items()}

    running, waiting, kv = gauge(c.REQUESTS_RUNNING), gauge(c.REQUESTS_WAITING), gauge(c.KV_CACHE_USAGE)
    ttft = _bucket_deltas(now.get(c.TTFT.name), before.get(c.TTFT.name))
    itl = _bucket_deltas(now.get(c.ITL.name), before.get(c.ITL.name))
    rows = []
    for key in sorted(set(running) | set(kv)):
        rows.append(ModelRow(
            model=key[0] or "(unnamed)", engine=key[1], running=running.get(key, math.nan),
            waiting=waiting.get(key, math.nan), kv_usage=kv.get(key, math.nan),
            ttft_p50=histogram_quantile(0.5, ttft.get(key, [])), ttft_p99=histogram_quantile(0.99, ttft.get(key, [])),
            itl_p50=histogram_quantile(0.5, itl.get(key, [])), itl_p99=histogram_quantile(0.99, itl.get(key, [])),
        ))
    return rows


def gpu_line(now: dict[str, MetricFamily]) -> str:
    up = now.get(c.GPU_UP.name)
    used = now.get(c.GPU_MEMORY_USED.name)
    total = now.get(c.GPU_MEMORY_TOTAL.name)
    n_up = sum(1 for s in (up.samples if up else []) if s.value == 1)
    gib = 1024**3
    used_b = sum(s.value for s in used.samples) if used else 0.0
    total_b = sum(s.value for s in total.samples) if total else 0.0
    return f"GPUs up {n_up}  HBM used {used_b / gib:.1f} / {total_b / gib:.1f} GiB"


def targets_line(now: dict[str, MetricFamily]) -> str:
    fam = now.get(c.EXPORTER_TARGET_UP.name)
    samples = fam.samples if fam else []
    down = [s.labels.get(c.LABEL_TARGET, "") for s in samples if s.value != 1]
    text = f"targets up {len(samples) - len(down)}/{len(samples)}"
    return text + (f" (down: {', '.join(down)})" if down else "")


def render_table(rows: list[ModelRow]) -> list[str]:
    def ms(v: float) -> str:
        return "   -" if math.isnan(v) else f"{v * 1000:4.0f}"

    lines = [f"  {'model':<28} {'engine':<8} {'run':>4} {'wait':>4} {'KV':>5}  TTFT p50/p99 ms  ITL p50/p99 ms"]
    for r in rows:
        kv = "  -" if math.isnan(r.kv_usage) else f"{r.kv_usage * 100:4.0f}%"
        lines.append(
            f"  {r.model[:28]:<28} {r.engine:<8} {r.running:>4.0f} {r.waiting:>4.0f} {kv:>5}  "
            f"{ms(r.ttft_p50)} / {ms(r.ttft_p99)}      {ms(r.itl_p50)} / {ms(r.itl_p99)}"
        )
    return lines
