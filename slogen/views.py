"""What the dashboard, KEDA and runbook generators see of an SLO and its alerts.

Why a separate, small input: those generators only need names, objectives, windows and alert
tiers, not the whole SLO model. Feeding them these frozen views means they can be tested with
a handful of literals; the only functions that know the compiled model's shape are the thin
adapters at the bottom (`from_context`, `alert_views`, `health_alert_views`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from llmslo import sli_plugins as sp
from llmslo.durations import parse_prometheus_duration

# SLI kinds slogen knows (the llmslo/* plugins), plus Sloth's own two shapes.
SLI_LATENCY = "latency"
SLI_GOODPUT = "goodput"
SLI_AVAILABILITY = "availability"
SLI_KV_HEADROOM = "kv_headroom"  # share of engine-time with KV-cache usage over a threshold
SLI_EVENTS = "events"  # Sloth `events` (error_query / total_query) or a foreign plugin
SLI_RAW = "raw"  # Sloth `raw` (error_ratio_query)

LATENCY_METRICS = tuple(sp.LATENCY_METRICS)  # the contract's (llmslo/sli_plugins.py)
SOURCES = sp.SOURCES


@dataclass(frozen=True)
class BurnTier:
    """One multi-window burn-rate alert tier (e.g. page, 14.4x over 1h and 5m)."""

    name: str  # the `slo_tier` label value
    severity: str  # page | ticket (the `sloth_severity` label value)
    long_window: str
    short_window: str
    factor: float


@dataclass(frozen=True)
class SLOView:
    service: str
    name: str
    slo_id: str  # the `sloth_id` label value
    objective: float  # percent, e.g. 99.9
    period: str  # e.g. "30d"
    description: str = ""
    sli_kind: str = SLI_EVENTS
    latency_metric: str = ""  # ttft | tpot | e2e | itl, for latency SLIs
    threshold: float | None = None  # latency threshold (seconds) or KV-usage threshold (ratio)
    source: str = ""  # tap | engine
    slo_class: str = ""  # the tap's slo_class, for goodput and tap latency SLIs
    windows: tuple[str, ...] = ()  # windows with a recorded slo:sli_error:ratio_rate<W>
    base_window: str = "5m"  # the shortest recorded window (the current burn rate's)
    traffic_weighted: bool = True  # slo:sli_errors:rate<W> and slo:sli_total:rate<W> are recorded
    tiers: tuple[BurnTier, ...] = ()
    alert_name: str = ""  # "" when alerting is disabled
    by: tuple[str, ...] = ()  # labels the recorded ratios keep (the SLI's `by`, e.g. cluster)
    # The low-traffic guard: page tiers need this many bad events in their long window, else
    # their `<tier>-low-traffic` ticket twin fires (0: not guarded).
    page_min_bad_events: int = 0

    @property
    def error_budget(self) -> float:
        """Allowed error ratio, 1 - objective."""
        return round(1.0 - self.objective / 100.0, 12)

    @property
    def period_days(self) -> int:
        """Whole days in the period, at least 1 (a dashboard's time range)."""
        return max(1, window_seconds(self.period) // 86_400)


@dataclass(frozen=True)
class AlertView:
    """One generated alert name (its tiers may be several rules sharing the name)."""

    name: str
    kind: str  # ALERT_BURN | ALERT_NO_DATA | another generator's kind
    slo: SLOView | None = None
    tiers: tuple[BurnTier, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)  # common static labels (e.g. severity)
    summary: str = ""
    condition: str = ""  # the alert's expression on one line, for alerts without an SLO (health alerts)
    for_: str = ""  # how long the condition must hold before the alert fires ("" = at once)
    details: dict = field(default_factory=dict)  # what a kind's runbook template shows (bucket edge: queries, edges)


ALERT_BURN = "burn"
ALERT_NO_DATA = "no_data"
ALERT_BUCKET_EDGE = "bucket_edge"  # series lack a latency threshold's bucket (rules/bucket_alerts.py)


@functools.lru_cache(maxsize=256)
def window_seconds(window: str) -> int:
    """Seconds in a Prometheus duration (5m, 1h30m, 30d), parsed as the SLO loaders parse it (a build asks
    about its few windows hundreds of thousands of times: the generated tests sort them per SLO)."""
    return parse_prometheus_duration(window) // 1000


# --------------------------------------------------------------------------------------
# Adapter from the core model (slogen.model / slogen.rules.options)
# --------------------------------------------------------------------------------------
_PLUGIN_KINDS = {
    sp.LatencyParams: SLI_LATENCY,
    sp.GoodputParams: SLI_GOODPUT,
    sp.AvailabilityParams: SLI_AVAILABILITY,
    sp.KvHeadroomParams: SLI_KV_HEADROOM,
}


def _source(params: sp.PluginParams | None) -> str:
    """Which side measures the SLI: the plugin's source; goodput is the tap's, KV headroom the engine's."""
    if isinstance(params, (sp.LatencyParams, sp.AvailabilityParams)):
        return params.source
    if isinstance(params, sp.GoodputParams):
        return sp.SOURCE_TAP
    return sp.SOURCE_ENGINE if isinstance(params, sp.KvHeadroomParams) else ""


def from_context(ctx) -> SLOView:
    """The view of one resolved SLO (`slogen.rules.options.SLOContext`)."""
    from llmslo.durations import format_prometheus_duration
    from slogen.model import EventsSLI, RawSLI
    from slogen.rules.sli import windows as recorded_windows
    from slogen.rules.tiers import guard_windows, page_min_bad_events

    slo = ctx.slo
    sli = slo.sli
    params = sli.params if isinstance(sli, EventsSLI) else None  # the plugin's resolved parameters, if any
    kind = _PLUGIN_KINDS.get(type(params), SLI_RAW if isinstance(sli, RawSLI) else SLI_EVENTS)
    tiers = tuple(
        BurnTier(t.name, t.severity, t.long, t.short, float(t.factor))
        for t in ctx.tiers
        if not (slo.alerting.page if t.severity == "page" else slo.alerting.ticket).disable
    ) if ctx.alerts_enabled else ()
    return SLOView(
        service=slo.service,
        name=slo.name,
        slo_id=slo.id,
        objective=float(slo.objective),
        period=format_prometheus_duration(ctx.period),
        description=slo.description,
        sli_kind=kind,
        latency_metric=params.metric if isinstance(params, sp.LatencyParams) else "",
        threshold=params.threshold if isinstance(params, (sp.LatencyParams, sp.KvHeadroomParams)) else None,
        source=_source(params),
        slo_class=getattr(params, "slo_class", ""),
        windows=tuple(format_prometheus_duration(w) for w in recorded_windows(ctx)),
        base_window=format_prometheus_duration(ctx.base_window),
        traffic_weighted=not ctx.opts.sloth_compat and not isinstance(sli, RawSLI),
        tiers=tiers,
        alert_name=slo.alerting.name if ctx.alerts_enabled else "",
        by=tuple(sli.by) if isinstance(sli, EventsSLI) else (),
        page_min_bad_events=page_min_bad_events(ctx) if guard_windows(ctx) else 0,
    )


def alert_views(results) -> list[AlertView]:
    """One view per generated alert name, from the rule groups the alerts generator produced.

    Reading the generated rules (not the spec) guarantees that every alert that exists gets a
    runbook, whatever names, tiers or modes produced it. `results` are `SLOResult`s.
    """
    from llmslo.conventions import SLO as C
    from slogen.rules import bucket_alerts

    by_name: dict[str, AlertView] = {}
    for result in results:
        slo = from_context(result.ctx)
        for group in result.rules.groups():
            for rule in group.rules:
                if not rule.alert:
                    continue
                if rule.labels.get(C.LABEL_TIER) == bucket_alerts.TIER:
                    by_name[rule.alert] = AlertView(
                        name=rule.alert, kind=ALERT_BUCKET_EDGE, slo=slo,
                        labels={k: v for k, v in rule.labels.items() if "{{" not in v},
                        summary=rule.annotations.get("summary", ""), condition=" ".join(rule.expr.split()),
                        for_=rule.for_, details=bucket_alerts.runbook_details_for(result.ctx))
                    continue
                no_data = rule.labels.get(C.LABEL_TIER) == "no-data"
                tiers = tuple(t for t in slo.tiers if t.name == rule.labels.get(C.LABEL_TIER)) or (
                    () if no_data else slo.tiers)
                previous = by_name.get(rule.alert)
                if previous is not None:
                    tiers = previous.tiers + tuple(t for t in tiers if t not in previous.tiers)
                by_name[rule.alert] = AlertView(
                    name=rule.alert, kind=ALERT_NO_DATA if no_data else ALERT_BURN, slo=slo, tiers=tiers,
                    labels={k: v for k, v in rule.labels.items() if "{{" not in v},
                    summary=rule.annotations.get("summary", ""),
                )
    return [by_name[name] for name in sorted(by_name)]


def health_alert_views(alerts) -> list[AlertView]:
    """What the runbook generator needs of each health or capacity alert (`kind` is its runbook topic);
    `alerts` are `slogen.rules.health.HealthAlert`s."""
    return [AlertView(a.rule.alert, a.topic, labels=dict(a.rule.labels), summary=a.runbook_summary,
                      condition=a.condition, for_=a.rule.for_) for a in alerts]
