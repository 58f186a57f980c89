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
from slogen.generators.dashboards import dashboard_files
from slogen.generators.deploy import deploy_files
from slogen.generators.keda import keda_files
from slogen.generators.runbooks import runbook_files
from slogen.generators.views import alert_views, from_context


def dashboards(results: Sequence) -> dict[str, str]:
    return dashboard_files([from_context(r.ctx) for r in results])


def runbooks(results: Sequence) -> dict[str, str]:
    return runbook_files(alert_views(results))


def keda(results: Sequence, root: Path) -> dict[str, str]:
    spec = load_autoscaling([root / AUTOSCALING_DIR])
    return keda_files(spec.pools, [from_context(r.ctx) for r in results])


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


def all_artifacts(results: Sequence, root: Path) -> dict[str, str]:
    """Everything this module generates, for one build whose inputs sit under `root`."""
    out = {**dashboards(results), **runbooks(results)}
    scaling = keda(results, root)
    out.update(scaling)
    out.update(deploy_files([*_prometheus_rule_paths(results), *scaling], _spec_files(results, root)))
    return out


def artifact_generator(catalog, options) -> dict[str, str]:
    """Chain entry for `slogen build` (`slogen.build.ARTIFACT_GENERATORS`): `(Catalog, BuildOptions)`."""
    inputs = [Path(p) for p in getattr(options, "inputs", ())]
    root = (inputs[0] if inputs[0].is_dir() else inputs[0].parent).parent if inputs else Path(".")
    return all_artifacts(list(catalog.results), root)
