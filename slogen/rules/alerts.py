"""Multi-window multi-burn-rate alerts, one rule per tier, plus a no-data alert.

Default mode: every tier is its own rule (same alert name), told apart by `slo_tier`,
`long_window`, `short_window`, `sloth_severity` and a kube-prometheus `severity`
(critical for page, warning for ticket, unless the spec sets `severity` itself), with
`summary`, `description`, `runbook_url` and `dashboard` annotations. Aggregations use
`max without (sloth_window)`, so labels like `cluster` pass through to the alert.
`--sloth-compat` emits Sloth's two rules (page, ticket), each an `or` of its two tiers.

Low-traffic guard (tiers.page_min_bad_events): a page tier also needs at least N bad events in
its long window (`slo:sli_errors:rate<long> * <long seconds> > N - 0.5`: events are whole, so
the half keeps the comparison off the float ties of rate arithmetic); its ticket twin
`<tier>-low-traffic` fires on the same burn `unless` that count is met. Exactly one of the two
fires for a burn, per cluster: every arm keeps the same labels (`max without (sloth_window)`).
"""

from __future__ import annotations

import re
from urllib.parse import quote

from llmslo.conventions import LABEL_CLUSTER
from llmslo.conventions import SLO as C
from llmslo.durations import format_prometheus_duration
from llmslo.gofloat import go_g
from slogen import promql
from slogen.gofmt import label_filter
from slogen.links import dashboard_url, slo_dashboard_uid
from slogen.model import AlertMeta, EventsSLI, RatioSLI, RawSLI, Rule, RuleGroup, Tier
from slogen.rules.options import SLOContext, dec
from slogen.rules.tiers import held_windows, page_min_bad_events

GROUP_PREFIX = "sloth-slo-alerts-"
RUNBOOK_DIR = "docs/runbooks"
SEVERITY = {"page": "critical", "ticket": "warning"}
TIER_NO_DATA = "no-data"
NO_DATA_SUFFIX = "NoData"
LOW_TRAFFIC_SUFFIX = "-low-traffic"
HOUR_MS = 3_600_000


def runbook_path(alert: str | Rule) -> str:
    """Where an alert's runbook lives, relative to the repository root: docs/runbooks/<alertname>.md."""
    name = alert.alert if isinstance(alert, Rule) else alert
    return f"{RUNBOOK_DIR}/{name}.md"


# `--runbook-url` templates: {{alert}} and {{service}} are replaced (URL-quoted); any other `{{` is text.
RUNBOOK_PLACEHOLDERS = ("alert", "service")
RUNBOOK_PLACEHOLDER_RE = re.compile(r"{{\s*(" + "|".join(RUNBOOK_PLACEHOLDERS) + r")\s*}}")


def is_runbook_template(url: str) -> bool:
    """Whether a runbook URL option is a template (names {{alert}} or {{service}}) rather than a base URL."""
    return RUNBOOK_PLACEHOLDER_RE.search(url) is not None


def runbook_url(alert: str | Rule, base_url: str, service: str = "") -> str:
    """The `runbook_url` annotation, as `literal` writes it (any other `{{` in the option is text).
    `base_url` is a base (`<base>/docs/runbooks/<alertname>.md`, `--runbook-base-url`) or a template
    naming {{alert}} and {{service}} (`--runbook-url`, to fit an existing wiki)."""
    name = alert.alert if isinstance(alert, Rule) else alert
    if not is_runbook_template(base_url):
        return literal(f"{base_url.rstrip('/')}/{runbook_path(name)}")
    values = {"alert": name, "service": service}
    return literal(RUNBOOK_PLACEHOLDER_RE.sub(lambda m: quote(values[m.group(1)], safe="-._~"), base_url))


def literal(text: str) -> str:
    """`text` as an annotation writes it so that Prometheus' template engine renders it as is: `{{` starts a
    template action, so a `{{` in a URL or a description made every rules file fail `promtool check rules`."""
    return text.replace("{{", '{{ "{{" }}')


def rendered(annotation: str) -> str:
    """What Prometheus renders of an annotation `literal` wrote (for generated tests' expectations)."""
    return annotation.replace('{{ "{{" }}', "{{")


def slo_dashboard_link(ctx: SLOContext) -> str:
    """The `dashboard` annotation: the SLO's generated Grafana dashboard (`--grafana-url`/d/<uid>)."""
    return literal(dashboard_url(ctx.opts.grafana_url, slo_dashboard_uid(ctx.slo.id)))


def no_data_alert_name(alert_name: str) -> str:
    return alert_name + NO_DATA_SUFFIX


def low_traffic_tier(tier: str) -> str:
    """The `slo_tier` of a page tier's ticket twin: the same burn with too few bad events to page."""
    return tier + LOW_TRAFFIC_SUFFIX


def alert_rules(ctx: SLOContext) -> RuleGroup:
    group = RuleGroup(GROUP_PREFIX + ctx.slo.id)
    if ctx.opts.disable_alerts:
        return group
    a = ctx.slo.alerting
    if ctx.opts.sloth_compat:
        tiers = {t.name: t for t in ctx.tiers}
        for meta, quick, slow in ((a.page, "page-quick", "page-slow"), (a.ticket, "ticket-quick", "ticket-slow")):
            if not meta.disable:
                group.rules.append(_sloth_alert(ctx, meta, tiers[quick], tiers[slow]))
        return group
    need = page_min_bad_events(ctx)
    for tier in ctx.tiers:
        meta = a.page if tier.severity == "page" else a.ticket
        if meta.disable:
            continue
        guarded = need if tier.severity == "page" else 0
        group.rules.append(_tier_alert(ctx, meta, tier, guarded))
        if guarded and not a.ticket.disable:
            group.rules.append(_low_traffic_ticket(ctx, a.ticket, tier, need))
    if group.rules:
        group.rules.append(_no_data_alert(ctx))
    return group


# ---------------------------------------------------------------------------------- Sloth


def _sloth_alert(ctx: SLOContext, meta: AlertMeta, quick: Tier, slow: Tier) -> Rule:
    flt = label_filter(ctx.slo.id_labels)
    eb = go_g((100 - ctx.slo.objective) / 100)
    w = C.LABEL_WINDOW

    def cond(window: int, factor: float) -> str:
        ratio = C.sli_error_ratio(format_prometheus_duration(window))
        return promql.agg_without("max", f"{ratio}{flt} > {promql.scaled(go_g(factor), eb)}", (w,), trailing=True)

    expr = (f"(\n    {cond(quick.window.short_window, quick.factor)}\n    and\n    {cond(quick.window.long_window, quick.factor)}\n)\n"
            f"or\n(\n    {cond(slow.window.short_window, slow.factor)}\n    and\n    {cond(slow.window.long_window, slow.factor)}\n)\n")
    sev = quick.severity
    ann = {
        "title": f"({sev}) {{{{$labels.{C.LABEL_SERVICE}}}}} {{{{$labels.{C.LABEL_SLO}}}}} SLO error budget burn rate is too fast.",
        "summary": f"{{{{$labels.{C.LABEL_SERVICE}}}}} {{{{$labels.{C.LABEL_SLO}}}}} SLO error budget burn rate is over expected.",
        **meta.annotations,
    }
    return Rule(expr=expr, alert=meta.name, labels={C.LABEL_SEVERITY: sev, **meta.labels}, annotations=ann,
                for_=meta.for_)


# ---------------------------------------------------------------------- per-tier alerts


def threshold(ctx: SLOContext, tier: Tier) -> str:
    return promql.scaled(go_g(tier.factor), dec(ctx.error_budget))


def _burn(ctx: SLOContext, tier: Tier) -> str:
    """Both windows' error ratios above the tier's threshold, per series (e.g. cluster). A page tier's short
    window holds its last measured verdict through a silence that its traffic makes ordinary.

    The short window is there to end an alert soon after recovery; a window without requests (0/0, NaN)
    says nothing either way. At 6 requests an hour the 5m window of page-quick is empty every other
    evaluation: read as "not burning", page-quick and its ticket twin fired and resolved every 5 minutes
    through an outage (14 times in 3 hours), and a receiver that does not deduplicate (webhook, chat) was
    notified again and again. So a page tier's short condition reads the recorded verdict
    `slo:sli_error_held:ratio_rate<short>` (sli._held): the last ratio its window measured, within the long
    window, held through the silence since.

    But no request is no evidence in either direction: a cluster whose traffic was drained away while it
    failed must not page on until its traffic returns. So the hold lasts only while the silence is one in
    which the long window's traffic expected fewer than HOLD_EXPECTED_EVENTS requests (the time since the
    short window was last measured x the long window's request rate): at 6 requests an hour, half an hour; at
    a drained cluster's rate, not one evaluation, and the page clears as its short window empties. A window
    with traffic reads as before, so nothing changes at high traffic. Ticket tiers (short windows of hours)
    read their ratio as is."""
    flt = label_filter(ctx.slo.id_labels)
    thr = threshold(ctx, tier)

    def cond(window: int) -> str:
        return promql.agg_without("max", f"{C.sli_error_ratio(format_prometheus_duration(window))}{flt} > {thr}",
                                  (C.LABEL_WINDOW,))

    short, long = tier.window.short_window, tier.window.long_window
    if tier.severity == "page" and short in held_windows(ctx):  # recorded by sli._held
        held = f"{C.sli_error_held(format_prometheus_duration(short))}{flt}"
        first = promql.agg_without("max", f"{held} > {thr}", (C.LABEL_WINDOW,))
    else:
        first = cond(short)
    return f"{first}\nand\n{cond(long)}\n"


def guard(ctx: SLOContext, tier: Tier, need: int) -> str:
    """At least `need` bad events in the tier's long window: rate x seconds, with half an event's slack."""
    seconds = tier.window.long_window / 1000
    rate = C.sli_errors_rate(format_prometheus_duration(tier.window.long_window))
    return promql.agg_without("max", f"{rate}{label_filter(ctx.slo.id_labels)} * {go_g(seconds)} > {go_g(need - 0.5)}",
                              (C.LABEL_WINDOW,)) + "\n"


def _tier_alert(ctx: SLOContext, meta: AlertMeta, tier: Tier, need: int = 0) -> Rule:
    slo = ctx.slo
    expr = _burn(ctx, tier) + (f"and\n{guard(ctx, tier, need)}" if need else "")
    labels = {C.LABEL_ALERT_SEVERITY: SEVERITY[tier.severity], **meta.labels,
              C.LABEL_SEVERITY: tier.severity, C.LABEL_TIER: tier.name,
              C.LABEL_LONG_WINDOW: tier.long, C.LABEL_SHORT_WINDOW: tier.short}
    period = format_prometheus_duration(ctx.period)
    spend = f"{go_g(tier.window.error_budget_percent)}% of the {period} error budget"
    rescaled = ""
    if tier.rescaled_from is not None:
        rescaled = (f" (tier rescaled from {go_g(tier.rescaled_from)}x, which a {dec(slo.objective)}% objective "
                    f"cannot reach: it fires when {dec(round(tier.factor * float(ctx.error_budget) * 100, 6))}% of events fail)")
    ann = {
        "summary": f"{slo.service} {slo.name}: error budget burning {go_g(round(tier.factor, 4))}x too fast ({tier.name}).",
        "description": (
            f"The error ratio of SLO {slo.id} ({dec(slo.objective)}% over {period}) is above "
            f"{go_g(round(tier.factor, 4))}x its budget of {dec(ctx.error_budget)} over both the last {tier.long} and {tier.short}"
            f"{rescaled}. At this rate {spend} is gone within {tier.long}."
            + (f" {literal(slo.description)}" if slo.description else "")
        ),
        "runbook_url": runbook_url(meta.name, ctx.opts.runbook_base_url, slo.service),
        "dashboard": slo_dashboard_link(ctx),
        **meta.annotations,
    }
    return Rule(expr=expr, alert=meta.name, labels=labels, annotations=ann, for_=tier_for(meta, tier))


def tier_for(meta: AlertMeta, tier: Tier) -> str:
    """The alert's own `for:` (page_alert.for), else its catalog tier's (Pyrra's per-tier `for`), else none."""
    if meta.for_ or tier.window.for_ is None:
        return meta.for_
    return format_prometheus_duration(tier.window.for_)


def _low_traffic_ticket(ctx: SLOContext, meta: AlertMeta, tier: Tier, need: int) -> Rule:
    """The page tier's burn with fewer than `need` bad events in its long window: a ticket, not a page.
    Its annotations are the tier's (with the ticket alert's own), summary and description aside."""
    slo = ctx.slo
    labels = {C.LABEL_ALERT_SEVERITY: SEVERITY["ticket"], **meta.labels,
              C.LABEL_SEVERITY: "ticket", C.LABEL_TIER: low_traffic_tier(tier.name),
              C.LABEL_LONG_WINDOW: tier.long, C.LABEL_SHORT_WINDOW: tier.short}
    factor = go_g(round(tier.factor, 4))
    ann = {
        **_tier_alert(ctx, meta, tier).annotations,
        "summary": (f"{slo.service} {slo.name}: error budget burning {factor}x too fast ({tier.name}), "
                    f"but with under {need} bad events in {tier.long}: a ticket, not a page (low traffic)."),
        "description": (
            f"The error ratio of SLO {slo.id} ({dec(slo.objective)}% over {format_prometheus_duration(ctx.period)}) is above "
            f"{factor}x its budget of {dec(ctx.error_budget)} over both the last {tier.long} and {tier.short}, "
            f"but fewer than {need} bad events happened in the last {tier.long}: at low traffic a single failed "
            f"request crosses the threshold, so the {tier.name} tier tickets until there are {need} "
            f"(page_min_bad_events), then pages." + (f" {literal(slo.description)}" if slo.description else "")
        ),
        **meta.annotations,
    }
    expr = _burn(ctx, tier) + f"unless\n{guard(ctx, tier, need)}"
    return Rule(expr=expr, alert=meta.name, labels=labels, annotations=ann, for_=tier_for(meta, tier))


def no_data_selectors(ctx: SLOContext) -> list[str]:
    sli = ctx.slo.sli
    if isinstance(sli, EventsSLI) and sli.sources:
        return list(sli.sources)
    flt = label_filter(ctx.slo.id_labels)
    base = format_prometheus_duration(ctx.base_window)
    if isinstance(sli, RawSLI):
        return [f"{C.sli_error_ratio(base)}{flt}"]
    return [f"{C.sli_total_rate(base)}{flt}"]


def sli_by(sli) -> tuple[str, ...]:
    """The labels an SLI's queries keep through aggregation: a plugin's `by`, or, for a query written
    by hand, the labels of its `by (...)` clauses when every aggregation in it names the same ones."""
    if isinstance(sli, EventsSLI):
        return tuple(sli.by) or kept_labels(sli.total_query)
    if isinstance(sli, RatioSLI):
        return kept_labels(sli.total_query)
    return kept_labels(sli.error_ratio_query)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_AGGREGATION_CLAUSE = re.compile(r"\b(by|without)\s*\(([^()]*)\)")
_WINDOW_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^{}]*\})?\s*\[\{\{\s*\.window\s*\}\}\]")


def kept_labels(query: str) -> tuple[str, ...]:
    """`sum by (cluster) (rate(...))`, `sum(rate(...)) by (cluster)` -> ("cluster",); () when the query
    aggregates everything away (`sum(...)`), uses `without`, or mixes different `by` lists."""
    clauses = _AGGREGATION_CLAUSE.findall(_STRING.sub('""', query))
    if not clauses or any(kind != "by" for kind, _ in clauses):
        return ()
    lists = {tuple(x.strip() for x in labels.split(",") if x.strip()) for _, labels in clauses}
    return lists.pop() if len(lists) == 1 else ()


def source_selectors(ctx: SLOContext) -> list[str]:
    """The SLI's source series: a plugin's own selectors, or those a hand-written query reads over `{{.window}}`."""
    sli = ctx.slo.sli
    if isinstance(sli, EventsSLI) and sli.sources:
        return list(sli.sources)
    query = sli.error_ratio_query if isinstance(sli, RawSLI) else sli.total_query
    return list(dict.fromkeys(name + (matchers or "") for name, matchers in _WINDOW_SELECTOR.findall(query)))


def _recorded(ctx: SLOContext) -> str:
    """The base-window series the SLI records per scope: its total event rate, or a raw SLI's ratio."""
    base = format_prometheus_duration(ctx.base_window)
    series = C.sli_error_ratio(base) if isinstance(ctx.slo.sli, RawSLI) else C.sli_total_rate(base)
    return f"{series}{label_filter(ctx.slo.id_labels)}"


def no_data_scope(ctx: SLOContext) -> tuple[str, ...]:
    """The labels the no-data alert has one arm per: the SLI's `by` (e.g. cluster), watched on its
    recorded rate; or, when the SLI aggregates them away (`sum(rate(...))`), `cluster`, watched on its
    source series (no_data_watched). () when neither is possible."""
    if ctx.opts.disable_recordings:
        return ()
    by = sli_by(ctx.slo.sli)
    if by:
        return by
    return (LABEL_CLUSTER,) if source_selectors(ctx) else ()


def no_data_watched(ctx: SLOContext) -> list[str]:
    """The series whose lapse in one scope fires that scope's arm: the recorded rate when it keeps the
    scope's labels, else the SLI's source selectors (which carry `cluster` in a fleet-wide ruler)."""
    if not no_data_scope(ctx):
        return []
    return [_recorded(ctx)] if sli_by(ctx.slo.sli) else source_selectors(ctx)


def no_data_lookback(ctx: SLOContext) -> int:
    """How far back a scope (a cluster) must have reported to count as gone dark now (ms)."""
    return max(HOUR_MS, 8 * ctx.base_window)


def _no_data_alert(ctx: SLOContext) -> Rule:
    """`absent()` of the sources, which fires only once they are gone everywhere; and, for an SLI
    evaluated per cluster (its `by` labels), one arm per cluster that reported within the last
    hour but stopped: in a fleet-wide ruler one dark cluster would otherwise go unnoticed."""
    slo = ctx.slo
    a = slo.alerting
    meta = a.ticket if not a.ticket.disable else a.page
    selectors = no_data_selectors(ctx)
    name = no_data_alert_name(meta.name)
    labels = {C.LABEL_ALERT_SEVERITY: SEVERITY["ticket"], **meta.labels, **slo.id_labels,
              C.LABEL_SEVERITY: "ticket", C.LABEL_TIER: TIER_NO_DATA}
    wait = 2 * ctx.base_window
    absents = [f"absent({s})" for s in selectors]
    expr = "\nor\n".join(absents) + "\n"
    scope = no_data_scope(ctx)
    per_scope = ""
    if scope:
        by = ", ".join(scope)
        watched = no_data_watched(ctx)
        lookback = format_prometheus_duration(no_data_lookback(ctx))
        present = " or ".join(promql.over_time("present", w, lookback) for w in watched)
        expr += (f"or\n(\n  group by ({by}) ({present})\n  unless\n"
                 f"  group by ({by}) ({' or '.join(watched)})\n  unless on ()\n  ({' or '.join(absents)})\n)\n")
        if sli_by(slo.sli):
            per_scope = (f" Per {by}: the SLI's recorded rate {watched[0]} stopped where it was reported within the "
                         f"last {lookback} (the alert's labels name where), while the sources still report elsewhere.")
        else:
            per_scope = (f" Per {by}: the SLI's sources ({', '.join(watched)}) stopped in a {by} where they reported "
                         f"within the last {lookback} (the alert's labels name where), while the SLI, summed over every "
                         f"{by}, goes on without it.")
    ann = {
        "summary": f"{slo.service} {slo.name}: the SLI has no data, so its burn-rate alerts cannot fire.",
        "description": (f"No samples for {format_prometheus_duration(wait)} from: {', '.join(selectors)}.{per_scope} Check that "
                        f"the exporter or tap is scraped and that the selectors match (for a latency SLI, that the "
                        f"threshold is a bucket bound)."),
        "runbook_url": runbook_url(name, ctx.opts.runbook_base_url, slo.service),
        "dashboard": slo_dashboard_link(ctx),
    }
    return Rule(expr=expr, alert=name, for_=format_prometheus_duration(wait), labels=labels, annotations=ann)
