"""Thin adapters from the compiled catalog to the artifact generators (dashboards, runbooks, KEDA, deploy).

The generators themselves are pure functions over small views (`views.py`); this module is
the only place that knows the core's `SLOResult` shape and where the build's other inputs
(`autoscaling/`, the SLO files for the tap's ConfigMap) live: next to the first input
directory, i.e. the repository root for the default `slogen build` of `slos/`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from slogen.autoscaling import DEFAULT_DIR as AUTOSCALING_DIR
from slogen.autoscaling import load_paths as load_autoscaling
from slogen.artifacts.dashboards import dashboard_files
from slogen.artifacts.deploy import deploy_files
from slogen.artifacts.hpa import hpa_files
from slogen.artifacts.keda import keda_files
from slogen.artifacts.runbooks import runbook_files
from slogen.artifacts.views import AlertView, alert_views, from_context


def dashboards(results: Sequence) -> dict[str, str]:
    return dashboard_files([from_context(r.ctx) for r in results])


def runbooks(results: Sequence, extra_alerts: Sequence[AlertView] = ()) -> dict[str, str]:
    return runbook_files([*alert_views(results), *extra_alerts])


def autoscalers(results: Sequence, root: Path) -> tuple[dict[str, str], dict[str, str]]:
    """KEDA ScaledObjects (listed in the generated kustomization) and their HPA v2 alternative (not listed)."""
    spec = load_autoscaling([root / AUTOSCALING_DIR])
    slos = [from_context(r.ctx) for r in results]
    return keda_files(spec.pools, slos), hpa_files(spec.pools, slos)


def _spec_files(results: Sequence, root: Path) -> dict[str, str]:
    """The SLO files the results came from, keyed by their path under `root`."""
    out: dict[str, str] = {}
    for r in results:
        path = Path(r.slo.origin.file)
        try:
            rel = path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            rel = path.name
        if rel not in out and path.is_file():
            out[rel] = path.read_text(encoding="utf-8")
    return out


def _prometheus_rule_paths(results: Sequence) -> list[str]:
    from slogen.build import prometheus_rule_path  # the core writes one PrometheusRule per service

    return sorted({prometheus_rule_path(r.slo.service) for r in results})


def all_artifacts(results: Sequence, root: Path, extra_alerts: Sequence[AlertView] = (),
                  extra_rule_paths: Sequence[str] = (), autoscaling: bool = True) -> dict[str, str]:
    """Everything this module generates, for one build whose inputs sit under `root`.

    `extra_alerts` and `extra_rule_paths`: alerts generated outside the SLOs (the health alerts)
    that need runbooks, and the PrometheusRules holding them that the kustomization must list.
    `autoscaling=False` skips `autoscaling/` (a build on another alert-window catalog, like the demo's,
    does not record the windows the pools scale on).
    """
    out = {**dashboards(results), **runbooks(results, extra_alerts)}
    scaling, alternative = autoscalers(results, root) if autoscaling else ({}, {})
    out.update(scaling)
    out.update(alternative)
    out.update(deploy_files([*_prometheus_rule_paths(results), *extra_rule_paths, *scaling], _spec_files(results, root)))
    return out


def artifact_generator(catalog, options) -> dict[str, str]:
    """Chain entry for `slogen build` (`slogen.build.ARTIFACT_GENERATORS`): `(Catalog, BuildOptions)`."""
    inputs = [Path(p) for p in getattr(options, "inputs", ())]
    root = (inputs[0] if inputs[0].is_dir() else inputs[0].parent).parent if inputs else Path(".")
    from slogen.build import capacity_alerts, health_alerts, prometheus_rule_path  # the core owns those rule files
    from slogen.artifacts.views import health_alert_views as health_views
    from llmslo.conventions import CAPACITY, HEALTH

    health = health_alerts(options) if hasattr(options, "health") else []
    seats = capacity_alerts(options) if hasattr(options, "capacity") else []
    return all_artifacts(list(catalog.results), root, health_views([*health, *seats]),
                         [prometheus_rule_path(HEALTH.GROUP)] * bool(health) + [prometheus_rule_path(CAPACITY.GROUP)] * bool(seats),
                         autoscaling=getattr(options, "autoscaling", True))
