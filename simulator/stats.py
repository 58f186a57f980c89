"""Per-request records and the summary both virtual mode and the load generator print.

TPOT follows vLLM's benchmark: (E2E - TTFT) / (output tokens - 1), for requests with more than one token.
A request is good (counts toward goodput) by the tap's rule (llmslo.goodput): it succeeded, its TTFT is
within the TTFT threshold and, if it has a TPOT, that is within the TPOT threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmslo.goodput import streamed_good


@dataclass(slots=True)
class RequestRecord:
    start: float  # seconds from the run's start when the request was sent (or arrived)
    ok: bool
    ttft: float | None = None  # to the first content token
    e2e: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    error: str = ""  # why it failed: "http 500", "aborted", an exception

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def good(self, ttft_slo: float, tpot_slo: float) -> bool:
        return self.ok and streamed_good(self.ttft, self.tpot, ttft_slo, tpot_slo)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), q in 0..100."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _dist(values: list[float]) -> dict[str, float | None]:
    return {f"p{q}": percentile(values, q) for q in (50, 90, 99)} | {
        "mean": sum(values) / len(values) if values else None
    }


def summarize(records: list[RequestRecord], elapsed: float, ttft_slo: float, tpot_slo: float) -> dict:
    """The figures as a JSON-ready dict; rates are over `elapsed` seconds (first send to last finish)."""
    ok = [r for r in records if r.ok]
    good = [r for r in ok if r.good(ttft_slo, tpot_slo)]
    elapsed = max(elapsed, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "elapsed_s": elapsed,
        "ttft_s": _dist([r.ttft for r in ok if r.ttft is not None]),
        "tpot_s": _dist([t for r in ok if (t := r.tpot) is not None]),
        "e2e_s": _dist([r.e2e for r in ok if r.e2e is not None]),
        "throughput_rps": len(ok) / elapsed,
        "output_tokens_per_s": out_tokens / elapsed,
        "thresholds": {"ttft_s": ttft_slo, "tpot_s": tpot_slo},
        "good_requests": len(good),
        "goodput_rps": len(good) / elapsed,
        "goodput_tokens_per_s": sum(r.output_tokens for r in good) / elapsed,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def render_text(summary: dict) -> str:
    """A compact human-readable report of a summary (plus any extra scalar keys it carries)."""
    lines = [
        f"requests      {summary['requests']} ({summary['completed']} completed, {summary['failed']} failed) "
        f"over {summary['elapsed_s']:.1f} s",
        f"throughput    {summary['throughput_rps']:.2f} req/s, {summary['output_tokens_per_s']:.0f} output tok/s",
        f"goodput       {summary['goodput_rps']:.2f} req/s, {summary['goodput_tokens_per_s']:.0f} tok/s "
        f"({summary['good_requests']} good at TTFT <= {summary['thresholds']['ttft_s']} s, "
        f"TPOT <= {summary['thresholds']['tpot_s']} s)",
        "latency (ms)     p50      p90      p99",
    ]
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        d = summary[key]
        lines.append(f"  {label:<8} {_ms(d['p50']):>9} {_ms(d['p90']):>8} {_ms(d['p99']):>8}")
    for key, value in summary.items():
        if key not in _BASE_KEYS:
            lines.append(f"{key:<30} {value:.4g}" if isinstance(value, float) else f"{key:<30} {value}")
    return "\n".join(lines)


_BASE_KEYS = set(summarize([], 1.0, 1.0, 1.0))
