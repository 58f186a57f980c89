"""The artifacts beside the rules, as one chain entry `(catalog, options) -> {relative path: text}`:
dashboards, runbooks, KEDA ScaledObjects and their HPA alternative, and the generated half of deploy/.

This is the only module that knows the compiled catalog's shape (`SLOResult`s, pools, spec files);
the generators it calls read frozen views (`views.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

from llmslo.conventions import CAPACITY, HEALTH
from slogen.artifacts.dashboards import dashboard_files
from slogen.artifacts.deploy import deploy_files
from slogen.artifacts.hpa import hpa_files
from slogen.artifacts.keda import keda_files
from slogen.artifacts.runbooks import runbook_files
from slogen.artifacts.views import AlertView, alert_views, from_context, health_alert_views
from slogen.paths import prometheus_rule_path
from slogen.rules.files import capacity_alerts, health_alerts


def artifact_files(catalog, options) -> dict[str, str]:
    """Everything this package generates for one build.

    The health and capacity alerts (generated outside the SLOs) get runbooks too, and the
    kustomization lists the PrometheusRules holding them. KEDA objects are listed in the
    kustomization; their HPA v2 alternative is not.
    """
    results = list(catalog.results)
    slos = [from_context(r.ctx) for r in results]
    health, seats = health_alerts(options), capacity_alerts(options)
    extra: Sequence[AlertView] = health_alert_views([*health, *seats])
    extra_rules = [prometheus_rule_path(HEALTH.GROUP)] * bool(health) + [prometheus_rule_path(CAPACITY.GROUP)] * bool(seats)
    out = {**dashboard_files(slos), **runbook_files([*alert_views(results), *extra])}
    scaling = keda_files(catalog.pools, slos)
    out.update(scaling)
    out.update(hpa_files(catalog.pools, slos))
    rule_paths = sorted({prometheus_rule_path(r.slo.service) for r in results})
    out.update(deploy_files([*rule_paths, *extra_rules, *scaling], catalog.spec_files))
    return out
