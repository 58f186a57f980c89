"""What the demo prints: a status block per tick, read from Prometheus the way a dashboard would, and the
alerts as on-call receives them (from the Alertmanager webhook), with their runbook links.

All queries are built from `llmslo.conventions`, so they read exactly the series the exporter writes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from demo.prometheus import PromClient
from llmslo import conventions as C


def queries(window: str) -> dict[str, str]:
    """PromQL for the status block; `window` is the rate window (a few scrape intervals)."""
    pod, cls = C.LABEL_POD, C.LABEL_SLO_CLASS
    neutral = "|".join((C.OUTCOME_CLIENT_DISCONNECTED, C.OUTCOME_CLIENT_ERROR))

    def quantile(q: float, metric: C.MetricDef) -> str:
        return f"histogram_quantile({q}, sum by ({cls}, le) (rate({metric.bucket()}[{window}])))"

    return {
        "kv": f"max by ({pod}) ({C.KV_CACHE_USAGE.name})",
        "waiting": f"sum by ({pod}) ({C.REQUESTS_WAITING.name})",
        "running": f"sum by ({pod}) ({C.REQUESTS_RUNNING.name})",
        "ttft_p50": quantile(0.5, C.TAP_TTFT),
        "ttft_p99": quantile(0.99, C.TAP_TTFT),
        "tpot_p50": quantile(0.5, C.TAP_TPOT),
        "tpot_p99": quantile(0.99, C.TAP_TPOT),
        # Goodput over the requests the service answered: client disconnects and 4xx are nobody's fault and
        # are left out, as the SLO plugins do.
        "goodput": f"sum by ({cls}) (rate({C.GOODPUT_REQUESTS.name}[{window}])) "
                   f"/ sum by ({cls}) (rate({C.TAP_REQUESTS.name}{{{C.LABEL_OUTCOME}!~\"{neutral}\"}}[{window}]))",
        "rps": f"sum by ({cls}) (rate({C.TAP_REQUESTS.name}[{window}]))",
        "gpus": f"count({C.GPU_UP.name} == 1)",
    }


@dataclass
class Status:
    """One tick's figures, keyed by pod (engine state) or SLO class (client-observed latency, goodput)."""

    per_pod: dict[str, dict[str, float]] = field(default_factory=dict)
    per_class: dict[str, dict[str, float]] = field(default_factory=dict)
    gpus: float | None = None
    firing: list[dict] = field(default_factory=list)


async def read_status(prom: PromClient, window: str) -> Status:
    status = Status()
    for key, expr in queries(window).items():
        if key == "gpus":
            status.gpus = await prom.scalar(expr)
            continue
        for sample in await prom.query(expr):
            labels, value = sample["metric"], float(sample["value"][1])
            if C.LABEL_POD in labels:
                status.per_pod.setdefault(labels[C.LABEL_POD], {})[key] = value
            elif C.LABEL_SLO_CLASS in labels:
                status.per_class.setdefault(labels[C.LABEL_SLO_CLASS], {})[key] = value
    status.firing = [a for a in await prom.alerts() if a.get("state") == C.ALERTSTATE_FIRING]
    return status


def _ms(v: float | None) -> str:
    if v is None or v != v:  # None or NaN (no requests in the window)
        return "    -"
    return f"{v * 1000:5.0f}"


def _pct(v: float | None) -> str:
    return "   -" if v is None or v != v else f"{v * 100:3.0f}%"


def render_status(elapsed_s: float, phase: str, s: Status) -> list[str]:
    lines = [f"[{elapsed_s:6.1f}s] phase: {phase}   fake GPUs up: {'-' if s.gpus is None else int(s.gpus)}   "
             f"alerts firing in Prometheus: {len(s.firing)}"]
    for pod, v in sorted(s.per_pod.items()):
        lines.append(f"    {pod:<16} KV {_pct(v.get('kv'))}  running {v.get('running', 0):3.0f}  "
                     f"queue {v.get('waiting', 0):3.0f}")
    for cls, v in sorted(s.per_class.items()):
        lines.append(f"    {cls:<16} TTFT p50/p99 {_ms(v.get('ttft_p50'))}/{_ms(v.get('ttft_p99'))} ms  "
                     f"TPOT p50/p99 {_ms(v.get('tpot_p50'))}/{_ms(v.get('tpot_p99'))} ms  "
                     f"goodput {_pct(v.get('goodput'))} of {v.get('rps', 0):.1f} req/s")
    return lines


def alert_name(alert: dict) -> str:
    labels = alert.get("labels", {})
    parts = [labels.get(C.LABEL_ALERTNAME, "?")]
    for key in (C.SLO.LABEL_TIER, C.SLO.LABEL_SEVERITY, C.SLO.LABEL_LONG_WINDOW, C.SLO.LABEL_SHORT_WINDOW):
        if labels.get(key):
            parts.append(f"{key}={labels[key]}")
    return " ".join(parts)


def render_notification(t0: float, received_at: float, route: str, alert: dict) -> list[str]:
    """One alert as on-call got it: when, which route, firing or resolved, severity, runbook."""
    ann, labels = alert.get("annotations", {}), alert.get("labels", {})
    head = (f"[{received_at - t0:6.1f}s] >>> {route.upper()} {alert.get('status', '?').upper()}: {alert_name(alert)}"
            f" (severity={labels.get(C.SLO.LABEL_ALERT_SEVERITY, '-')}, cluster={labels.get(C.LABEL_CLUSTER, '-')})")
    lines = [head]
    if ann.get("summary"):
        lines.append(f"             summary: {ann['summary']}")
    if ann.get("runbook_url"):
        lines.append(f"             runbook: {ann['runbook_url']}")
    return lines


def alert_table(t0: float, events: list[tuple[float, str, dict]]) -> list[str]:
    """One line per alert (label set): route, when it fired and when it resolved, relative to t0, and its runbook."""
    rows: dict[tuple, dict] = {}
    for received_at, route, alert in events:
        key = tuple(sorted(alert.get("labels", {}).items()))
        row = rows.setdefault(key, {"alert": alert, "route": route, "fired": None, "resolved": None})
        status = alert.get("status")
        if status == "firing" and row["fired"] is None:
            row["fired"] = received_at
        elif status == "resolved":
            row["resolved"] = received_at

    def at(t: float | None, missing: str = "-") -> str:
        return f"{missing:>7}" if t is None else f"{t - t0:6.1f}s"

    lines = [f"  {'route':<7} {'fired':>7} {'resolved':>8}  alert"]
    for row in sorted(rows.values(), key=lambda r: (r["fired"] or 0, r["route"])):
        lines.append(f"  {row['route']:<7} {at(row['fired'])} {at(row['resolved'], 'firing'):>8}  {alert_name(row['alert'])}")
        url = row["alert"].get("annotations", {}).get("runbook_url")
        if url:
            lines.append(f"  {'':<7} {'':>7} {'':>8}  runbook: {url}")
    return lines


def timeline(t0: float, events: list[tuple[str, float]]) -> list[str]:
    return [f"  {t - t0:7.1f}s  {what}" for what, t in sorted(events, key=lambda e: e[1])]


def now() -> float:
    return time.time()
