"""Multi-window multi-burn-rate alerts, one rule per tier, plus a no-data alert.

Default mode: every tier is its own rule (same alert name), told apart by `slo_tier`,
`long_window`, `short_window`, `sloth_severity` and a kube-prometheus `severity`
(critical for page, warning for ticket, unless the spec sets `severity` itself), with
`summary`, `description` and `runbook_url` annotations. Aggregations use
`max without (sloth_window)`, so labels like `cluster` pass through to the alert.
`--sloth-compat` emits Sloth's two rules (page, ticket), each an `or` of its two tiers.
"""

from __future__ import annotations

from llmslo.conventions import SLO as C
from slogen.durations import format_duration
from slogen.generators.options import SLOContext, dec
from slogen.gofmt import go_g, label_filter
from slogen.model import AlertMeta, EventsSLI, RawSLI, Rule, RuleGroup, Tier

GROUP_PREFIX = "sloth-slo-alerts-"
RUNBOOK_DIR = "docs/runbooks"
SEVERITY = {"page": "critical", "ticket": "warning"}
TIER_NO_DATA = "no-data"
NO_DATA_SUFFIX = "NoData"
HOUR_MS = 3_600_000


def runbook_path(alert: str | Rule) -> str:
    """Where an alert's runbook lives, relative to the repository root: docs/runbooks/<alertname>.md."""
    name = alert.alert if isinstance(alert, Rule) else alert
    return f"{RUNBOOK_DIR}/{name}.md"


def runbook_url(alert: str | Rule, base_url: str) -> str:
    return f"{base_url.rstrip('/')}/{runbook_path(alert)}"


def no_data_alert_name(alert_name: str) -> str:
    return alert_name + NO_DATA_SUFFIX


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
    for tier in ctx.tiers:
        meta = a.page if tier.severity == "page" else a.ticket
        if not meta.disable:
            group.rules.append(_tier_alert(ctx, meta, tier))
    if group.rules:
        group.rules.append(_no_data_alert(ctx))
    return group


# ---------------------------------------------------------------------------------- Sloth


def _sloth_alert(ctx: SLOContext, meta: AlertMeta, quick: Tier, slow: Tier) -> Rule:
    flt = label_filter(ctx.slo.id_labels)
    eb = go_g((100 - ctx.slo.objective) / 100)
    w = C.LABEL_WINDOW

    def cond(window: int, factor: float) -> str:
        return f"max({C.sli_error_ratio(format_duration(window))}{flt} > ({go_g(factor)} * {eb})) without ({w})"

    expr = (f"(\n    {cond(quick.window.short_window, quick.factor)}\n    and\n    {cond(quick.window.long_window, quick.factor)}\n)\n"
            f"or\n(\n    {cond(slow.window.short_window, slow.factor)}\n    and\n    {cond(slow.window.long_window, slow.factor)}\n)\n")
    sev = quick.severity
    ann = {
        "title": f"({sev}) {{{{$labels.{C.LABEL_SERVICE}}}}} {{{{$labels.{C.LABEL_SLO}}}}} SLO error budget burn rate is too fast.",
        "summary": f"{{{{$labels.{C.LABEL_SERVICE}}}}} {{{{$labels.{C.LABEL_SLO}}}}} SLO error budget burn rate is over expected.",
        **meta.annotations,
    }
    return Rule(expr=expr, alert=meta.name, labels={C.LABEL_SEVERITY: sev, **meta.labels}, annotations=ann)


# ---------------------------------------------------------------------- per-tier alerts


def threshold(ctx: SLOContext, tier: Tier) -> str:
    return f"({go_g(tier.factor)} * {dec(ctx.error_budget)})"


def _tier_alert(ctx: SLOContext, meta: AlertMeta, tier: Tier) -> Rule:
    slo = ctx.slo
    flt = label_filter(slo.id_labels)
    thr = threshold(ctx, tier)

    def cond(window: int) -> str:
        return f"max without ({C.LABEL_WINDOW}) ({C.sli_error_ratio(format_duration(window))}{flt} > {thr})"

    expr = f"{cond(tier.window.short_window)}\nand\n{cond(tier.window.long_window)}\n"
    labels = {C.LABEL_ALERT_SEVERITY: SEVERITY[tier.severity], **meta.labels,
              C.LABEL_SEVERITY: tier.severity, C.LABEL_TIER: tier.name,
              C.LABEL_LONG_WINDOW: tier.long, C.LABEL_SHORT_WINDOW: tier.short}
    period = format_duration(ctx.period)
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
            + (f" {slo.description}" if slo.description else "")
        ),
        "runbook_url": runbook_url(meta.name, ctx.opts.runbook_base_url),
        **meta.annotations,
    }
    return Rule(expr=expr, alert=meta.name, labels=labels, annotations=ann)


def no_data_selectors(ctx: SLOContext) -> list[str]:
    sli = ctx.slo.sli
    if isinstance(sli, EventsSLI) and sli.sources:
        return list(sli.sources)
    flt = label_filter(ctx.slo.id_labels)
    base = format_duration(ctx.base_window)
    if isinstance(sli, RawSLI):
        return [f"{C.sli_error_ratio(base)}{flt}"]
    return [f"{C.sli_total_rate(base)}{flt}"]


def no_data_scope(ctx: SLOContext) -> tuple[str, ...]:
    """The labels an SLI is evaluated per (its `by`, e.g. cluster): each gets its own no-data arm."""
    sli = ctx.slo.sli
    return tuple(sli.by) if isinstance(sli, EventsSLI) and sli.by and not ctx.opts.disable_recordings else ()


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
        recorded = f"{C.sli_total_rate(format_duration(ctx.base_window))}{label_filter(slo.id_labels)}"
        lookback = format_duration(no_data_lookback(ctx))
        expr += (f"or\n(\n  group by ({by}) (present_over_time({recorded}[{lookback}]))\n  unless\n"
                 f"  group by ({by}) ({recorded})\n  unless on ()\n  ({' or '.join(absents)})\n)\n")
        per_scope = (f" Per {by}: the SLI's recorded rate {recorded} stopped where it was reported within the last "
                     f"{lookback} (the alert's labels name where), while the sources still report elsewhere.")
    ann = {
        "summary": f"{slo.service} {slo.name}: the SLI has no data, so its burn-rate alerts cannot fire.",
        "description": (f"No samples for {format_duration(wait)} from: {', '.join(selectors)}.{per_scope} Check that "
                        f"the exporter or tap is scraped and that the selectors match (for a latency SLI, that the "
                        f"threshold is a bucket bound)."),
        "runbook_url": runbook_url(name, ctx.opts.runbook_base_url),
    }
    return Rule(expr=expr, alert=name, for_=format_duration(wait), labels=labels, annotations=ann)
