"""The rule files of a build, as chain entries `(catalog, options) -> {relative path: text}`:
per-service rule files and PrometheusRules, and the health and capacity groups (with their tests).
"""

from __future__ import annotations

from pathlib import Path

from llmslo.conventions import CAPACITY, HEALTH
from slogen.errors import SpecError, SpecErrors
from slogen.loaders.k8s import API_VERSION as K8S_SPEC
from slogen.paths import prometheus_rule_path, rules_path, tests_path
from slogen.promtests.capacity_tests import capacity_tests
from slogen.promtests.health_tests import health_tests
from slogen.rules import SLOResult, capacity, health
from slogen.writers import GENERATED_MARKER, K8S_LABELS, header, prometheus_rule, rule_file
from slogen.yamlio import dump

HEALTH_HEADER = (f"# {GENERATED_MARKER} ({{version}}): capacity and health alerts.\n"
                 "# DO NOT EDIT: change the slogen build options (see docs/slogen.md) and run `slogen build`.\n")
CAPACITY_HEADER = (f"# {GENERATED_MARKER} ({{version}}): KV seats, their forecast and the capacity alerts.\n"
                   "# DO NOT EDIT: change the slogen build options (see docs/slogen.md) and run `slogen build`.\n")


def sources(items: list[SLOResult]) -> str:
    """The SLO files a service's rules came from, for the generated file's header."""
    return ", ".join(sorted({Path(r.slo.origin.file).as_posix() for r in items}))


def rule_files(catalog, options) -> dict[str, str]:
    """alerts/<service>.rules.yaml: plain Prometheus / Thanos Ruler / Mimir rule files."""
    return {rules_path(svc): rule_file([g for r in items for g in r.rules.groups()], header(sources(items), options.gen.version))
            for svc, items in catalog.services.items()}


def prometheus_rules(catalog, options) -> dict[str, str]:
    """deploy/generated/prometheusrule-<service>.yaml: the same groups as a prometheus-operator object."""
    out = {}
    for svc, items in catalog.services.items():
        origin = next((r.slo.origin for r in items if r.slo.origin.spec == K8S_SPEC), None)
        out[prometheus_rule_path(svc)] = prometheus_rule(
            origin.k8s_name if origin and origin.k8s_name else f"slo-{svc}",
            [g for r in items for g in r.rules.groups()],
            namespace=origin.k8s_namespace if origin else "",
            labels=origin.k8s_labels if origin else None,
            head=header(sources(items), options.gen.version))
    return out


def _refuse(problems: list[tuple[str, str]], what: str) -> None:
    """SpecErrors naming every bad build option (and the flag that sets it), if any."""
    if problems:
        raise SpecErrors([SpecError("slogen build", f"{what} option {name} {why}", fix=f"pass a valid --{name.replace('_', '-')}")
                          for name, why in problems])


def _group_files(name: str, group, head: str, test_doc: dict, component: str) -> dict[str, str]:
    """A build-wide group's rule file, promtool tests and PrometheusRule (`component` labels the latter)."""
    return {
        rules_path(name): rule_file([group], head),
        tests_path(name): head + "\n" + dump(test_doc),
        prometheus_rule_path(name): prometheus_rule(
            name, [group], head=head, managed_labels={**K8S_LABELS, "app.kubernetes.io/component": component}),
    }


def health_alerts(options) -> list[health.HealthAlert]:
    """The capacity and health alerts this build generates (none with `--no-health-alerts`)."""
    h = options.health
    if not h.enabled:
        return []
    _refuse(h.problems(), "health alert")
    return health.health_alerts(h, options.gen.runbook_base_url, dict(options.gen.extra_labels), options.gen.grafana_url)


def health_rules(catalog, options) -> dict[str, str]:
    """alerts/llmslo-health.{rules,test}.yaml and its PrometheusRule: GPU, engine-target and KV alerts."""
    alerts = health_alerts(options)
    if not alerts:
        return {}
    group = health.health_group(alerts)
    head = HEALTH_HEADER.format(version=options.gen.version)
    test_doc = health_tests(alerts, options.health, Path(rules_path(HEALTH.GROUP)).name)
    return _group_files(HEALTH.GROUP, group, head, test_doc, "health")


def capacity_alerts(options) -> list[health.HealthAlert]:
    """The KV-seat alerts this build generates (none with `--no-capacity-rules`)."""
    k = options.capacity
    if not k.enabled:
        return []
    _refuse(k.problems(), "capacity")
    return capacity.capacity_alerts(k, options.gen.runbook_base_url, dict(options.gen.extra_labels), options.gen.grafana_url)


def capacity_rules(catalog, options) -> dict[str, str]:
    """alerts/llmslo-capacity.{rules,test}.yaml and its PrometheusRule: KV seats, their forecast and alerts."""
    alerts = capacity_alerts(options)
    if not alerts:
        return {}
    group = capacity.capacity_group(options.capacity, alerts)
    head = CAPACITY_HEADER.format(version=options.gen.version)
    test_doc = capacity_tests(alerts, options.capacity, Path(rules_path(CAPACITY.GROUP)).name)
    return _group_files(CAPACITY.GROUP, group, head, test_doc, "capacity")
