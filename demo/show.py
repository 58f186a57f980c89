"""What the demo prints: a status block per tick, read from Prometheus the way a dashboard would, and the
notifications as on-call receives them (from the Alertmanager webhook), with their runbook and dashboard links.

All queries are built from `llmslo.conventions`, so they read exactly the series the exporter writes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from demo.alertmanager import PAGE_ROUTE, TICKET_ROUTE
from demo.prometheus import PromClient
from demo.webhook import Notification
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


def short_name(alert: dict) -> str:
    """`ChatTTFTBudgetBurn page-slow`: the alert and its tier, if it has one."""
    labels = alert.get("labels", {})
    return f"{labels.get(C.LABEL_ALERTNAME, '?')} {labels.get(C.SLO.LABEL_TIER, '')}".strip()


GROUP_LABEL_ORDER = (C.LABEL_ALERTNAME, C.SLO.LABEL_SERVICE, C.SLO.LABEL_SLO, C.LABEL_CLUSTER)


def group_name(note: Notification) -> str:
    """The group's labels' values (`chat/local-demo`): what one incident is in the generated routing."""
    labels = note.group_labels
    order = [k for k in GROUP_LABEL_ORDER if k in labels] + sorted(k for k in labels if k not in GROUP_LABEL_ORDER)
    return "/".join(labels[k] for k in order) or "-"


def render_notification(t0: float, note: Notification) -> list[str]:
    """One webhook notification as on-call got it: when, which route, firing or resolved, its group, and per
    firing alert its severity, summary, runbook and dashboard."""
    lines = [f"[{note.received_at - t0:6.1f}s] >>> {note.route.upper()} {note.status.upper()} (group {group_name(note)}, "
             f"{len(note.alerts)} alert{'s' if len(note.alerts) != 1 else ''})"]
    for alert in note.alerts:
        ann, labels = alert.get("annotations", {}), alert.get("labels", {})
        lines.append(f"             {alert.get('status', '?')}: {alert_name(alert)} "
                     f"(severity={labels.get(C.SLO.LABEL_ALERT_SEVERITY, '-')}, cluster={labels.get(C.LABEL_CLUSTER, '-')})")
        if alert.get("status") != "firing":
            continue
        for key in ("summary", "runbook_url", "dashboard"):
            if ann.get(key):
                lines.append(f"               {key.removesuffix('_url')}: {ann[key]}")
    return lines


def notification_table(t0: float, notes: list[Notification]) -> list[str]:
    """One line per notification: when, route, status, group and the alerts it reported."""
    lines = [f"  {'time':>7}  {'route':<7} {'status':<9} {'group':<18} alerts"]
    for n in notes:
        alerts = n.firing() if n.status == "firing" else n.alerts
        lines.append(f"  {n.received_at - t0:6.1f}s  {n.route:<7} {n.status:<9} {group_name(n):<18} "
                     f"{', '.join(sorted({short_name(a) for a in alerts}))}")
    return lines


def summary_line(notes: list[Notification]) -> str:
    """`on-call notifications: N page, M ticket`: notifications (not alerts) that reported firing alerts."""
    firing = [n for n in notes if n.status == "firing"]
    pages = sum(1 for n in firing if n.route == PAGE_ROUTE)
    tickets = sum(1 for n in firing if n.route == TICKET_ROUTE)
    return f"on-call notifications: {pages} page, {tickets} ticket"


def timeline(t0: float, events: list[tuple[str, float]]) -> list[str]:
    return [f"  {t - t0:7.1f}s  {what}" for what, t in sorted(events, key=lambda e: e[1])]


def now() -> float:
    return time.time()
