"""One typed SLO model that every loader produces and every generator reads.

Sloth's model, made explicit: an SLO has an SLI (event counts, a raw error ratio, or a
built-in plugin already resolved into event queries), an objective, a period, labels and
page/ticket alerting metadata. Alert windows come from a catalog keyed by period; the
multi-window multi-burn-rate tiers and their burn factors are derived from a catalog.
Generated Prometheus rules are plain dataclasses too, so writers stay dumb.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmslo.durations import format_prometheus_duration
from llmslo.sli_plugins import PluginParams
from slogen.durations import hours

# --------------------------------------------------------------------------------------
# SLIs
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordingRule:
    """An auxiliary recording rule an SLI needs evaluated before its queries (e.g. a gauge turned into events)."""

    record: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SeriesFixture:
    """How to synthesize one source series for generated promtool tests.

    `role` says what the series counts: "total" (all completed events), "good" (good events, a
    subset of total), "bad" (bad events, a subset of total), "gauge" (a level sampled per step:
    `good_value` when healthy, `bad_value` during an incident) or "late" (requests that never
    completed because they were too late, e.g. the tap's `upstream_timeout`: a series that
    exists and grows only during a hang). A hang differs from an outage in its source series:
    nothing completes, so "total" and "good" stop while "late" grows; the tests stage both.
    `incident` names how a "late" series' requests end (its outcome), one hang scenario each.
    """

    name: str
    labels: dict[str, str]
    role: str
    good_value: float = 0.0
    bad_value: float = 0.0
    incident: str = ""


@dataclass(frozen=True)
class EventsSLI:
    """Error and total event queries; `{{.window}}` is replaced by each window."""

    error_query: str
    total_query: str
    # Extensions filled by built-in plugins (empty for user-written SLIs):
    aux_rules: tuple[RecordingRule, ...] = ()
    sources: tuple[str, ...] = ()  # selectors whose absence means "no data" (for the no-data alert)
    fixtures: tuple[SeriesFixture, ...] = ()  # source series for generated tests
    plugin: str = ""  # built-in plugin id this SLI came from, if any
    plugin_options: dict[str, str] = field(default_factory=dict)  # the plugin's options, as written
    # The llmslo plugin's resolved parameters (llmslo.sli_plugins): what later stages read, never the strings.
    params: PluginParams | None = None
    by: tuple[str, ...] = ()  # labels the queries keep through aggregation (e.g. cluster)
    # Events are rule-evaluation samples (a time-based SLI such as llmslo/kv-headroom), not requests:
    # the error query counts samples per window, and traffic never runs low, so no low-traffic guard.
    time_based: bool = False


@dataclass(frozen=True)
class RawSLI:
    """A query returning the error ratio directly (cannot be traffic-weighted: there is no total)."""

    error_ratio_query: str


@dataclass(frozen=True)
class RatioSLI:
    """Good and total event queries (OpenSLO ratioMetric good/total); errors are total - good.

    Kept apart from EventsSLI because `--sloth-compat` renders it as Sloth renders OpenSLO
    (a raw `1 - good/total` ratio), while the default mode treats it as events.
    """

    good_query: str
    total_query: str


SLI = EventsSLI | RawSLI | RatioSLI

# --------------------------------------------------------------------------------------
# Alerting metadata
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlertMeta:
    """One severity's alert (page or ticket): its name, labels and annotations, or disabled."""

    name: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    disable: bool = True
    for_: str = ""  # the alert's `for:` (page_alert.for / ticket_alert.for), a Prometheus duration; "" = none


@dataclass(frozen=True)
class Alerting:
    name: str = ""
    page: AlertMeta = field(default_factory=AlertMeta)
    ticket: AlertMeta = field(default_factory=AlertMeta)


@dataclass(frozen=True)
class SLOPluginRef:
    """A Sloth SLO plugin in a spec's `plugins.chain` (applied to generated rule groups)."""

    id: str
    config: Any = None
    priority: int = 0


@dataclass(frozen=True)
class Origin:
    """Where an SLO came from, for error messages and for Sloth's info labels."""

    file: str
    doc: int = 0  # index of the YAML document in the file
    path: str = ""  # field path of this SLO inside the document, e.g. "slos[1]"
    line: int | None = None
    spec: str = "prometheus/v1"  # sloth_spec label value
    mode: str = "cli-gen-prom"  # sloth_mode label value
    k8s_name: str = ""
    k8s_namespace: str = ""
    k8s_labels: dict[str, str] = field(default_factory=dict)
    k8s_annotations: dict[str, str] = field(default_factory=dict)
    # The tool whose format the file is ("Pyrra", "Sloth", "OpenSLO"), which slogen loads as that tool does (a
    # tier that can never fire is a warning); "" for slogen's own specs (an llmslo/* SLI only slogen reads).
    tool: str = ""
    objective_field: str = ""  # the objective's field path in the file, e.g. "spec.target"
    objective_line: int | None = None


@dataclass(frozen=True)
class SLO:
    id: str
    service: str
    name: str
    objective: float  # percent, e.g. 99.9
    sli: SLI
    description: str = ""
    period: int | None = None  # milliseconds; None = the build's default period
    labels: dict[str, str] = field(default_factory=dict)
    alerting: Alerting = field(default_factory=Alerting)
    plugins: tuple[SLOPluginRef, ...] = ()
    override_plugins: bool = False
    # Low-traffic guard: a page tier pages only with at least this many bad events in its long
    # window (below it, it tickets); None = the build's default (--page-min-bad-events), 0 = off.
    page_min_bad_events: int | None = None
    # The SLO's own alert windows (a Pyrra SLO brings Pyrra's table for its window); None = the period's catalog.
    windows: "AlertWindows | None" = None
    origin: Origin = field(default_factory=lambda: Origin(file="<memory>"))

    @property
    def id_labels(self) -> dict[str, str]:
        from llmslo.conventions import SLO as C

        return {C.LABEL_ID: self.id, C.LABEL_SERVICE: self.service, C.LABEL_SLO: self.name}


# --------------------------------------------------------------------------------------
# Alert windows and tiers
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlertWindow:
    """Consume `error_budget_percent` of the period's budget within `long_window` -> a burn factor."""

    error_budget_percent: float
    short_window: int  # ms
    long_window: int  # ms
    # A catalog may pin what Sloth's formula would derive (Pyrra's tables: factors 14, 7, 2, 1, and a `for:`
    # per tier); None = derived from error_budget_percent / the alert's own `for:`.
    factor: float | None = None
    for_: int | None = None  # ms: how long the tier's burn must last before its alert fires


@dataclass(frozen=True)
class AlertWindows:
    """A catalog entry (Sloth `AlertWindows`): the four tiers' windows for one SLO period."""

    period: int  # ms
    page_quick: AlertWindow
    page_slow: AlertWindow
    ticket_quick: AlertWindow
    ticket_slow: AlertWindow
    source: str = "<built-in>"

    def burn_factor(self, w: AlertWindow) -> float:
        """Sloth's formula, in its float order: hours needed to burn the percent, over the long window
        (or the catalog's pinned factor)."""
        if w.factor is not None:
            return w.factor
        hours_required = w.error_budget_percent * hours(self.period) / 100
        return hours_required / hours(w.long_window)

    def tiers(self) -> list["Tier"]:
        return [
            Tier("page-quick", "page", self.page_quick, self.burn_factor(self.page_quick)),
            Tier("page-slow", "page", self.page_slow, self.burn_factor(self.page_slow)),
            Tier("ticket-quick", "ticket", self.ticket_quick, self.burn_factor(self.ticket_quick)),
            Tier("ticket-slow", "ticket", self.ticket_slow, self.burn_factor(self.ticket_slow)),
        ]

    def windows(self) -> list[int]:
        """Distinct alert windows, shortest first (Sloth's TimeDurationWindows)."""
        ws = {w for t in (self.page_quick, self.page_slow, self.ticket_quick, self.ticket_slow)
              for w in (t.short_window, t.long_window)}
        return sorted(ws)


@dataclass(frozen=True)
class Tier:
    """One multi-window burn-rate tier: fires when both windows' error ratios exceed factor x budget."""

    name: str  # page-quick | page-slow | ticket-quick | ticket-slow
    severity: str  # page | ticket
    window: AlertWindow
    factor: float
    rescaled_from: float | None = None  # original factor when rescaled for reachability

    @property
    def short(self) -> str:
        return format_prometheus_duration(self.window.short_window)

    @property
    def long(self) -> str:
        return format_prometheus_duration(self.window.long_window)


# --------------------------------------------------------------------------------------
# Generated Prometheus rules
# --------------------------------------------------------------------------------------


@dataclass
class Rule:
    expr: str
    record: str = ""
    alert: str = ""
    for_: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass
class RuleGroup:
    name: str
    rules: list[Rule] = field(default_factory=list)
    interval: str = ""


@dataclass
class SLORules:
    """The rule groups one SLO produces (Sloth's PromSLORules)."""

    sli: RuleGroup
    meta: RuleGroup
    alerts: RuleGroup
    extra: list[RuleGroup] = field(default_factory=list)

    def groups(self) -> list[RuleGroup]:
        return [g for g in (self.sli, self.meta, self.alerts, *self.extra) if g.rules]
