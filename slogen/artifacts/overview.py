"""The SLO overview: one table, one row per SLO (and per cluster or other `by` label its SLI keeps), as Pyrra's
list shows them: objective, SLI over the period, error budget left, and per alert tier the burn rate over the
tier's long window and what fires (ALERTS: page, ticket or none). Each row opens that SLO's own dashboard.

Why a table of instant queries over the recorded series: the SLO rules already record every number (per-window
error ratios, error budget, budget left, period burn rate), so each column is one small query that scales with
the series, not with the specs. Each query keeps the same row labels (`ROW`), so Grafana's merge transformation
joins the columns into one row per SLO; the generated promtool tests (slogen/promtests/dashboards.py) hold every
column to its value on the synthetic fleet.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from grafanalib import core as g

from llmslo import conventions as c
from llmslo.conventions import SLO as S
from slogen import panels as p
from slogen import promql as q
from slogen.artifacts import grafana as gf
from slogen.k8smeta import MAX_CONFIGMAP_BYTES
from slogen.links import slo_dashboard_uid
from slogen.rules.alerts import LOW_TRAFFIC_SUFFIX
from slogen.views import SLOView

CLUSTER_VAR = "cluster"
# Per-SLO dashboard links are value mappings (sloth_id -> uid), about 130 bytes each in the JSON; past this many
# bytes of them (some 4,000 SLOs) rows link to Grafana's search for the SLO's dashboard instead, so the overview
# stays within the 1 MiB a ConfigMap holds.
LINK_BUDGET = MAX_CONFIGMAP_BYTES // 2
_REGEX_META = re.compile(r"([\\.+*?()|\[\]{}^$])")


def row_labels(slos: Sequence[SLOView]) -> tuple[str, ...]:
    """The labels a row is keyed by: the SLO's identity, `cluster`, and every label an SLI of the build keeps."""
    kept = sorted({label for s in slos for label in s.by} - {c.LABEL_CLUSTER})
    return (S.LABEL_SERVICE, S.LABEL_SLO, S.LABEL_ID, c.LABEL_CLUSTER, *kept)


def _services(slos: Sequence[SLOView]) -> q.Matcher:
    """The build's services (fewer than its SLOs): other builds' SLOs in the same Prometheus stay out."""
    names = sorted({s.service for s in slos})
    return q.regex(S.LABEL_SERVICE, q.any_of(_REGEX_META.sub(r"\\\1", n) for n in names))


class _Queries:
    """The overview's expressions, every one grouped `by` the row labels."""

    def __init__(self, slos: Sequence[SLOView]) -> None:
        self.row = row_labels(slos)
        self.scope = _services(slos)
        self.m = [self.scope, q.regex(c.LABEL_CLUSTER, "$" + CLUSTER_VAR)]

    def per_slo(self, metric: str) -> str:
        """A per-SLO constant (objective, budget) once per sloth_id: a central ruler records it without
        `cluster`, per-cluster rulers once per cluster."""
        return q.agg("max", q.selector(metric, [self.scope]), (S.LABEL_ID,))

    def rows(self) -> str:
        """One series per row: every SLO and cluster with a recorded budget, and every SLO of the build
        without one (no data in the selected clusters) as a row of its own."""
        measured = q.agg("group", q.selector(S.PERIOD_ERROR_BUDGET_REMAINING, self.m), self.row)
        listed = q.agg("group", q.selector(S.OBJECTIVE, [self.scope]), (S.LABEL_SERVICE, S.LABEL_SLO, S.LABEL_ID))
        return f"({measured} or {q.on((S.LABEL_ID,))} {listed})"

    def objective(self) -> str:
        joined = f"{self.rows()} * {q.on((S.LABEL_ID,))} group_left {self.per_slo(S.OBJECTIVE)}"
        return f"100 * {q.agg('max', joined, self.row)}"

    def sli(self) -> str:
        """The SLI over the SLO's period: 1 - the period burn rate x the budget (the period's ratio is named
        after the period, which differs between SLOs; the burn rate is not)."""
        burned = (f"{q.selector(S.PERIOD_BURN_RATE, self.m)} * {q.on((S.LABEL_ID,))} group_left "
                  f"{self.per_slo(S.ERROR_BUDGET)}")
        return f"100 * {q.agg('max', f'1 - {burned}', self.row)}"

    def budget_left(self) -> str:
        return f"100 * {q.agg('max', q.selector(S.PERIOD_ERROR_BUDGET_REMAINING, self.m), self.row)}"

    def burn(self, window: str) -> str:
        ratio = q.selector(S.sli_error_ratio(window), self.m)
        return q.agg("max", f"{ratio} / {q.on((S.LABEL_ID,))} group_left {self.per_slo(S.ERROR_BUDGET)}", self.row)

    def firing(self, tier: str) -> str:
        """The tier's state per row as the label `firing_label(tier)`: page where a page alert of the tier (or
        its low-traffic twin) fires, else ticket where one fires, else none."""
        label = p.firing_label(tier)
        alerts = [q.eq(c.LABEL_ALERTSTATE, c.ALERTSTATE_FIRING),
                  q.regex(S.LABEL_TIER, q.any_of((tier, tier + LOW_TRAFFIC_SUFFIX))), *self.m]
        page = q.agg("max", q.selector(c.PROM_ALERTS, [*alerts, q.eq(S.LABEL_SEVERITY, "page")]), self.row)
        any_ = q.agg("max", q.selector(c.PROM_ALERTS, alerts), self.row)
        parts = [f'label_replace({page}, "{label}", "{p.FIRING_PAGE}", "", "")',
                 f'label_replace({any_}, "{label}", "{p.FIRING_TICKET}", "", "")',
                 f'label_replace(0 * {self.rows()}, "{label}", "{p.FIRING_NONE}", "", "")']
        return f"\nor {q.on(self.row)} ".join(parts)


def _columns(slos: Sequence[SLOView]) -> list[tuple[str, str]]:
    """(header, expression) per query, in refId order (panels.overview_ref)."""
    qs = _Queries(slos)
    out = [("Objective %", qs.objective()), ("SLI % (period)", qs.sli()), ("Budget left %", qs.budget_left())]
    out += [(f"{tier} burn ({window})", qs.burn(window)) for tier, window in p.overview_burn_columns(slos)]
    out += [(f"{tier} fires", qs.firing(tier)) for tier in p.overview_tiers(slos)]
    return out


def _links(slos: Sequence[SLOView]) -> tuple[list[dict], list[dict], str]:
    """(value mappings, data links, the sloth_id column's header): sloth_id mapped to its dashboard's uid and
    every cell linking to /d/<uid>, or, past LINK_BUDGET, a link to Grafana's search for the dashboard's title."""
    uids = {s.slo_id: slo_dashboard_uid(s.slo_id) for s in slos}
    if sum(len(k) + len(v) + 90 for k, v in uids.items()) <= LINK_BUDGET:
        mapping = {"type": "value", "options": {k: {"text": v} for k, v in sorted(uids.items())}}
        return [mapping], [gf.data_link("SLO dashboard", "/d/${__data.fields.%s}" % S.LABEL_ID)], "Dashboard"
    search = ("/dashboards?tag=slo&query=${__data.fields.%s:percentencode}%%20%%2F%%20${__data.fields.%s:percentencode}"
              % (S.LABEL_SERVICE, S.LABEL_SLO))
    return [], [gf.data_link("Find the SLO dashboard", search)], "SLO id"


def _state_colours() -> dict:
    return {"type": "value", "options": {p.FIRING_PAGE: {"color": "red", "text": p.FIRING_PAGE},
                                         p.FIRING_TICKET: {"color": "orange", "text": p.FIRING_TICKET}}}


def _organize(slos: Sequence[SLOView], columns: list[tuple[str, str]], id_header: str) -> dict:
    """Column names and order; the firing queries' values (0 or 1) and the time are left out: their state is
    the label they write."""
    refs = [p.overview_ref(i) for i in range(len(columns))]
    tiers = p.overview_tiers(slos)
    values = {f"Value #{r}": header for r, (header, _) in zip(refs, columns, strict=True) if not header.endswith(" fires")}
    labels = {S.LABEL_SERVICE: "Service", S.LABEL_SLO: "SLO", c.LABEL_CLUSTER: "Cluster",
              **{p.firing_label(t): f"{t} fires" for t in tiers}, S.LABEL_ID: id_header}
    hidden = {"Time": True, **{f"Value #{r}": True for r, (h, _) in zip(refs, columns, strict=True) if h.endswith(" fires")}}
    order = [S.LABEL_SERVICE, S.LABEL_SLO, *row_labels(slos)[3:], *values, *(p.firing_label(t) for t in tiers), S.LABEL_ID]
    return {"id": "organize", "options": {"excludeByName": hidden, "renameByName": {**values, **labels},
                                          "indexByName": {name: i for i, name in enumerate(order)}}}


def overview_table(slos: Sequence[SLOView]) -> gf.Table:
    columns = _columns(slos)
    mappings, links, id_header = _links(slos)
    targets = [gf.prom_target(expr, "", p.overview_ref(i), instant=True) for i, (_, expr) in enumerate(columns)]
    return gf.Table(
        title=p.OVERVIEW_TITLE, dataSource=gf.PROMETHEUS, targets=targets, decimals=2, noValue="No data",
        mappings=[*mappings, _state_colours()], dataLinks=links, thresholds=gf.thresholds((None, "red"), (0, "text")),
        transformations=[{"id": "merge", "options": {}}, _organize(slos, columns, id_header)],
        description="One row per SLO and cluster. Objective, SLI over the SLO's period and error budget left in "
                    "percent (red: overspent); per alert tier, the burn rate over its long window (1 = the budget "
                    "lasts exactly the period) and what fires: page, ticket (the tier's ticket, or a page tier's "
                    "low-traffic twin) or none. A row opens the SLO's own dashboard.",
    )


def cluster_variable(slos: Sequence[SLOView]) -> g.Template:
    """Clusters from the recorded budgets, which keep `cluster` wherever one exists (as the SLO dashboards')."""
    source = q.selector(S.PERIOD_ERROR_BUDGET_REMAINING, [_services(slos)])
    return gf.query_variable(CLUSTER_VAR, "Cluster", f"label_values({source}, {c.LABEL_CLUSTER})")
