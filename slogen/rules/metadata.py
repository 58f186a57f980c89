"""SLO metadata recording rules (objective, budget, period, burn rates, budget left, info), as
Sloth names them so Sloth's Grafana dashboards keep working.

Default mode divides by the error budget as a literal instead of Sloth's
`/ on(sloth_id, sloth_slo, sloth_service) group_left slo:error_budget:ratio{...}` join: the
result is the same, and a literal cannot hit a many-to-many match when the budget series is
also federated in from another cluster.
"""

from __future__ import annotations

from llmslo.conventions import SLO as C
from llmslo.durations import format_prometheus_duration
from llmslo.gofloat import go_f, go_g
from slogen.durations import hours
from slogen.gofmt import label_filter
from slogen.model import Rule, RuleGroup
from slogen.rules.options import SLOContext, dec

GROUP_PREFIX = "sloth-slo-meta-recordings-"


def meta_rules(ctx: SLOContext) -> RuleGroup:
    slo = ctx.slo
    labels = {**slo.id_labels, **ctx.labels}
    flt = label_filter(slo.id_labels)
    base = C.sli_error_ratio(format_prometheus_duration(ctx.base_window))
    period = C.sli_error_ratio(format_prometheus_duration(ctx.period))
    days = go_g(hours(ctx.period) / 24)
    if ctx.opts.sloth_compat:
        ratio = go_g(slo.objective / 100)
        objective, budget = f"vector({ratio})", f"vector(1-{ratio})"
        join = f"\n/ on({C.LABEL_ID}, {C.LABEL_SLO}, {C.LABEL_SERVICE}) group_left\n{C.ERROR_BUDGET}{flt}\n"
        current, period_burn = f"{base}{flt}{join}", f"{period}{flt}{join}"
    else:
        objective, budget = f"vector({dec(ctx.objective_ratio)})", f"vector({dec(ctx.error_budget)})"
        eb = dec(ctx.error_budget)
        current, period_burn = f"{base}{flt}\n/\n{eb}\n", f"{period}{flt}\n/\n{eb}\n"
    info = {**labels, C.LABEL_VERSION: ctx.opts.version, C.LABEL_MODE: slo.origin.mode,
            C.LABEL_SPEC: slo.origin.spec, C.LABEL_OBJECTIVE: go_f(slo.objective)}
    return RuleGroup(GROUP_PREFIX + slo.id, [
        Rule(expr=objective, record=C.OBJECTIVE, labels=dict(labels)),
        Rule(expr=budget, record=C.ERROR_BUDGET, labels=dict(labels)),
        Rule(expr=f"vector({days})", record=C.TIME_PERIOD_DAYS, labels=dict(labels)),
        Rule(expr=current, record=C.CURRENT_BURN_RATE, labels=dict(labels)),
        Rule(expr=period_burn, record=C.PERIOD_BURN_RATE, labels=dict(labels)),
        Rule(expr=f"1 - {C.PERIOD_BURN_RATE}{flt}", record=C.PERIOD_ERROR_BUDGET_REMAINING, labels=dict(labels)),
        Rule(expr="vector(1)", record=C.INFO, labels=info),
    ])
