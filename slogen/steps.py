"""The build's steps: one explicit list, `STEPS`, each a typed step from the catalog to what it produces.

A step reads the catalog only (`slogen.catalog.Catalog`: the options, the SLOs and their rules, their
views, the health and capacity alerts, the pools, the SLO files' text; all computed once, frozen) and
returns a `Produced`: its files (relative path -> text) and its notes (what the CLI prints, e.g. SLOs
left without generated tests). No step opens a file or leaves anything for another step; `slogen.build`
runs them in order and joins what they produce. The folders hold the generators the steps call:
`rules/` the compiled rules and their files' text, `promtests/` the promtool tests, `artifacts/`
dashboards, runbooks, Kubernetes objects and the Alertmanager configuration.

To add an artifact: write its generator in its folder (a pure function of values), a step here that
calls it with what it needs from the catalog, and append the step to `STEPS`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmslo.conventions import CAPACITY, HEALTH
from slogen.artifacts.alertmanager import (
    ALERTMANAGER_FILE,
    alertmanager_config_file,
    alertmanager_config_object,
    alertmanager_file,
)
from slogen.artifacts.dashboards import iter_dashboard_models
from slogen.artifacts.deploy import deploy_files
from slogen.artifacts.grafana import text as dashboard_text
from slogen.artifacts.grafana_provisioning import DashboardConfigMaps, provider_file
from slogen.artifacts.hpa import hpa_files
from slogen.artifacts.keda import keda_files
from slogen.artifacts.runbooks import EngineDiscovery, iter_runbook_files
from slogen.catalog import Catalog
from slogen.errors import SpecError, SpecErrors
from slogen.k8smeta import KubeOptions
from slogen.loaders.k8s import API_VERSION as K8S_SPEC
from slogen.paths import (
    ALERTMANAGER_CONFIG_FILE,
    DASHBOARD_DIR,
    INSTALL_DIR,
    PROMETHEUS_RULE_DIR,
    prometheus_rule_path,
    rules_path,
    tests_path,
)
from slogen.promtests.capacity_tests import capacity_tests
from slogen.promtests.dashboards import TEST_FILE as DASHBOARD_TEST_FILE
from slogen.promtests.dashboards import DashboardTests
from slogen.promtests.isolation_tests import health_and_isolation_tests
from slogen.promtests.slo_tests import service_tests
from slogen.rules import SLOResult, capacity, health
from slogen.views import alert_views, health_alert_views
from slogen.writers import GENERATED_MARKER, K8S_LABELS, header, prometheus_rule, rule_file
from slogen.yamlio import dump

HEALTH_HEADER = (f"# {GENERATED_MARKER} ({{version}}): capacity and health alerts.\n"
                 "# DO NOT EDIT: change the slogen build options (see docs/slogen.md) and run `slogen build`.\n")
CAPACITY_HEADER = (f"# {GENERATED_MARKER} ({{version}}): KV seats, their forecast and the capacity alerts.\n"
                   "# DO NOT EDIT: change the slogen build options (see docs/slogen.md) and run `slogen build`.\n")


# A step's files: a mapping (relative path -> text), or (path, text) pairs made as they are taken, so that a
# large build writes each file out before it makes the next (10,000 SLOs make 1.8 GB of text).
Files = Mapping[str, str] | Iterable[tuple[str, str]]


def pairs(files: Files) -> Iterable[tuple[str, str]]:
    """(path, text) of a step's files, whichever way it gave them."""
    return files.items() if isinstance(files, Mapping) else files


@dataclass(frozen=True)
class Produced:
    """What one step makes: files and notes for the person running the build. A step whose files are made
    as they are taken may add notes as it goes: they are complete once its files have all been taken."""

    files: Files
    notes: Sequence[str] = ()


@dataclass(frozen=True)
class Step:
    """One step of the build. `forkable`: independent and heavy, so a large build may run it in a forked
    child while this process runs the others (`slogen.build`); its output is the same either way.
    `tests_only`: it makes promtool test files alone, so a build without them (the settings' promtoolTests)
    skips it. `fork_max_slos`: forked only up to this many SLOs (0: any number), for a step whose own memory,
    beside the build's and the other child's, would take a large build over its budget."""

    name: str
    run: Callable[[Catalog], Produced]
    forkable: bool = False
    tests_only: bool = False
    fork_max_slos: int = 0


def sources(items: list[SLOResult]) -> str:
    """The SLO files a service's rules came from, for the generated file's header."""
    return ", ".join(sorted({Path(r.slo.origin.file).as_posix() for r in items}))


def slo_rules(catalog: Catalog) -> Produced:
    """alerts/<service>.rules.yaml: plain Prometheus / Thanos Ruler / Mimir rule files."""
    version = catalog.options.gen.version
    return Produced((rules_path(svc), rule_file([g for r in items for g in r.rules.groups()], header(sources(items), version)))
                    for svc, items in catalog.services.items())


def slo_tests(catalog: Catalog) -> Produced:
    """alerts/<service>.test.yaml: promtool unit tests staging an outage, a slow burn and no data; a note for
    every SLO left without tests, and why."""
    notes: list[str] = []

    def files() -> Iterator[tuple[str, str]]:
        for svc, items in catalog.services.items():
            doc, skipped = service_tests(items, Path(rules_path(svc)).name)
            notes.extend(f"{s.slo_id}: no generated tests ({s.reason})" for s in skipped)
            if doc is not None:
                yield tests_path(svc), header(sources(items), catalog.options.gen.version) + "\n" + dump(doc)

    return Produced(files(), notes)


def slo_prometheus_rules(catalog: Catalog) -> Produced:
    """deploy/generated/prometheusrule-<service>.yaml: the same groups as a prometheus-operator object."""

    def files() -> Iterator[tuple[str, str]]:
        for svc, items in catalog.services.items():
            origin = next((r.slo.origin for r in items if r.slo.origin.spec == K8S_SPEC), None)
            yield prometheus_rule_path(svc), prometheus_rule(
                origin.k8s_name if origin and origin.k8s_name else f"slo-{svc}",
                [g for r in items for g in r.rules.groups()],
                namespace=(origin.k8s_namespace if origin else "") or catalog.options.kube.namespace,
                labels=origin.k8s_labels if origin else None,
                head=header(sources(items), catalog.options.gen.version), meta=catalog.options.kube.meta)

    return Produced(files())


def _group_files(name: str, group, head: str, test_doc: dict, component: str, kube: KubeOptions) -> dict[str, str]:
    """A build-wide group's rule file, promtool tests and PrometheusRule (`component` labels the latter)."""
    return {
        rules_path(name): rule_file([group], head),
        tests_path(name): head + "\n" + dump(test_doc),
        prometheus_rule_path(name): prometheus_rule(
            name, [group], namespace=kube.namespace, head=head, meta=kube.meta,
            managed_labels={**K8S_LABELS, "app.kubernetes.io/component": component}),
    }


def _build_wide(catalog: Catalog, alerts, opts, name: str, head: str, tests, group, component: str) -> Produced:
    """A build-wide group's files (none without alerts): its rules, `tests(alerts, opts, rule file name)`."""
    if not alerts:
        return Produced({})
    head = head.format(version=catalog.options.gen.version)
    test_doc = tests(list(alerts), opts, Path(rules_path(name)).name)
    return Produced(_group_files(name, group(list(alerts)), head, test_doc, component, catalog.options.kube))


def health_rules(catalog: Catalog) -> Produced:
    """alerts/llmslo-health.{rules,test}.yaml and its PrometheusRule: GPU, engine-target and KV alerts."""
    return _build_wide(catalog, catalog.health_alerts, catalog.health_options, HEALTH.GROUP, HEALTH_HEADER,
                       health_and_isolation_tests, health.health_group, "health")


def capacity_rules(catalog: Catalog) -> Produced:
    """alerts/llmslo-capacity.{rules,test}.yaml and its PrometheusRule: KV seats, their forecast and alerts."""
    opts = catalog.options.capacity
    return _build_wide(catalog, catalog.capacity_alerts, opts, CAPACITY.GROUP, CAPACITY_HEADER, capacity_tests,
                       lambda alerts: capacity.capacity_group(opts, alerts), "capacity")


def dashboards(catalog: Catalog) -> Produced:
    """dashboards/: the fleet dashboard, one per SLO, and dashboards.test.yaml, every panel's number proven on
    a synthetic fleet (rendered once, read by the tests as written); what Grafana loads them from: the
    kustomization making a ConfigMap of each for its sidecar, and a file provider (both in dashboards/)."""
    version, kube = catalog.options.gen.version, catalog.options.kube

    def files() -> Iterator[tuple[str, str]]:
        tests = DashboardTests(catalog.views) if catalog.options.promtool_tests else None  # not made: not written
        configmaps = DashboardConfigMaps(kube, version)
        for path, model in iter_dashboard_models(catalog.views):
            text = dashboard_text(model)
            if tests is not None:
                tests.add(path, model)
            configmaps.add(path, text)
            yield path, text
        if tests is not None:
            yield DASHBOARD_TEST_FILE, header("the dashboards in dashboards/", version) + "\n" + dump(tests.document())
        yield from configmaps.files().items()
        yield from provider_file(kube, version).items()

    return Produced(files())


def runbooks(catalog: Catalog) -> Produced:
    """docs/runbooks/: one per alert name, the SLOs' and the health and capacity alerts'."""
    extra = health_alert_views([*catalog.health_alerts, *catalog.capacity_alerts])
    namespace = catalog.options.kube.namespace  # where the install put the exporter (llmslo.yaml)
    discovery = EngineDiscovery(exporter_namespace=namespace) if namespace else EngineDiscovery()
    return Produced(iter_runbook_files([*alert_views(catalog.results), *extra], discovery))


def kubernetes(catalog: Catalog) -> Produced:
    """KEDA ScaledObjects, their HPA v2 alternative, and deploy/generated/: the kustomization listing every
    generated object (the PrometheusRules and the ScaledObjects, not the HPAs) and the tap's ConfigMap."""
    meta = catalog.options.kube.meta
    scaling = keda_files(catalog.pools, catalog.views, meta)
    extra_rules = ([prometheus_rule_path(HEALTH.GROUP)] * bool(catalog.health_alerts)
                   + [prometheus_rule_path(CAPACITY.GROUP)] * bool(catalog.capacity_alerts))
    rule_paths = sorted({prometheus_rule_path(r.slo.service) for r in catalog.results})
    # the dashboards step always writes their kustomization (the fleet dashboard at least), listed by its path
    # from deploy/generated; routing, when any alerts
    routing = [ALERTMANAGER_CONFIG_FILE] * (_routing(catalog) is not None)
    listed = [*rule_paths, *extra_rules, *scaling, posixpath.relpath(DASHBOARD_DIR, PROMETHEUS_RULE_DIR), *routing]
    return Produced({**scaling, **hpa_files(catalog.pools, catalog.views, meta),
                     **deploy_files(listed, catalog.spec_files, meta)})


def _routing(catalog: Catalog) -> dict | None:
    """The Alertmanager routing of the build's alerts (none when it has no alerts), computed in the catalog."""
    return catalog.routing


def alertmanager(catalog: Catalog) -> Produced:
    """alerts/alertmanager.yaml: routing and inhibition (artifacts/alertmanager.py), and the same as
    prometheus-operator's AlertmanagerConfig in deploy/generated/."""
    config = _routing(catalog)
    if config is None:
        return Produced({})
    version, kube = catalog.options.gen.version, catalog.options.kube
    obj = alertmanager_config_object(config, kube.alertmanager_config_name, kube.meta)
    if kube.namespace:  # where the Alertmanager's alertmanagerConfigNamespaceSelector looks
        obj["metadata"] = {"name": obj["metadata"].pop("name"), "namespace": kube.namespace, **obj["metadata"]}
    return Produced({ALERTMANAGER_FILE: alertmanager_file(config, version),
                     ALERTMANAGER_CONFIG_FILE: alertmanager_config_file(obj, version, kube.namespace)})


def install(catalog: Catalog) -> Produced:
    """deploy/install/: the whole install as kustomize over a copy of the shipped bases, from the install's
    settings (llmslo.yaml; slogen/overlay.py), when they name the inference namespaces."""
    settings = catalog.options.install
    if settings is None or not settings.inference_namespaces:
        return Produced({})
    from slogen import overlay

    scaling = keda_files(catalog.pools, catalog.views, catalog.options.kube.meta)
    try:
        overlay.check_generated(overlay.generated_objects(pairs(scaling)), settings)
    except overlay.OverlayError as e:
        raise SpecErrors([SpecError(str(settings.path or "slogen build"), str(e), e.flag,
                                    fix="make the settings and autoscaling/ agree")]) from None
    files = overlay.render(settings, "../generated", "bases", command="build")
    return Produced({**{f"{INSTALL_DIR}/{rel}": text for rel, text in files.items()},
                     **{f"{INSTALL_DIR}/bases/{rel}": text for rel, text in overlay.bases_files().items()}})


# The build, in order (the order of the notes; the files are sorted). Append a step to add an artifact.
STEPS: tuple[Step, ...] = (
    Step("rules", slo_rules),  # alerts/<service>.rules.yaml
    Step("tests", slo_tests, forkable=True, tests_only=True),  # alerts/<service>.test.yaml (about 45% of a large build)
    Step("prometheusrules", slo_prometheus_rules),  # deploy/generated/prometheusrule-<service>.yaml
    Step("health", health_rules),  # alerts/llmslo-health.*, its PrometheusRule
    Step("capacity", capacity_rules),  # alerts/llmslo-capacity.*, its PrometheusRule
    # dashboards/*.json, dashboards.test.yaml (about 30%); in this process above 5,000 SLOs: a third process of
    # 1.4 GB at 10,000 took the build to 2.4-2.7 GB (bench slogen-memory's target: 2 GB)
    Step("dashboards", dashboards, forkable=True, fork_max_slos=5_000),
    Step("runbooks", runbooks),  # docs/runbooks/
    Step("kubernetes", kubernetes),  # KEDA, HPA, deploy/generated/kustomization.yaml, the tap's ConfigMap
    Step("alertmanager", alertmanager),  # alerts/alertmanager.yaml, deploy/generated/alertmanagerconfig.yaml
    Step("install", install),  # deploy/install/: the install over the shipped bases (llmslo.yaml)
)
