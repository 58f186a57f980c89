"""Where `slogen build` puts each output, relative to the output root (the repository root by default).

One place for the paths, because one artifact lists another's files (the generated kustomization
names every PrometheusRule) and the writing stage must know which folders the build owns.
"""

from __future__ import annotations

import re

ALERTS_DIR = "alerts"
PROMETHEUS_RULE_DIR = "deploy/generated"
INSTALL_DIR = "deploy/install"  # the install over the shipped bases, from the settings (llmslo.yaml)


def rules_path(service: str) -> str:
    return f"{ALERTS_DIR}/{service}.rules.yaml"


PROMTOOL_TEST_SUFFIX = ".test.yaml"


def tests_path(service: str) -> str:
    return f"{ALERTS_DIR}/{service}{PROMTOOL_TEST_SUFFIX}"


def is_promtool_test(path: str) -> bool:
    """A generated promtool test file: the SLO alerts', the health and capacity alerts' (alerts/*.test.yaml) or
    the dashboards' (DASHBOARD_TESTS_FILE)."""
    return path == DASHBOARD_TESTS_FILE or (path.startswith(f"{ALERTS_DIR}/") and path.endswith(PROMTOOL_TEST_SUFFIX))


def prometheus_rule_path(service: str) -> str:
    return f"{PROMETHEUS_RULE_DIR}/prometheusrule-{service}.yaml"


DASHBOARD_DIR = "dashboards"
FLEET_DASHBOARD_FILE = f"{DASHBOARD_DIR}/llm-serving-fleet.json"
OVERVIEW_DASHBOARD_FILE = f"{DASHBOARD_DIR}/llm-slo-overview.json"  # every SLO of the build, one row each
DASHBOARD_TESTS_FILE = f"{DASHBOARD_DIR}/dashboards{PROMTOOL_TEST_SUFFIX}"


def slo_dashboard_path(slo_id: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", slo_id.lower()).strip("-")
    return f"{DASHBOARD_DIR}/slo-{slug}.json"
GRAFANA_PROVIDER_FILE = f"{DASHBOARD_DIR}/grafana-provider.yaml"  # Grafana file provisioning, without the sidecar
# for the Grafana sidecar: kustomize makes a ConfigMap per dashboard from the JSON files beside this kustomization
# (its files must lie under it); deploy/generated's kustomization includes the folder
DASHBOARD_KUSTOMIZATION = f"{DASHBOARD_DIR}/kustomization.yaml"
# folders earlier builds wrote and this one no longer does: their generated files go (a ConfigMap file per dashboard)
RETIRED_DIRS = (f"{PROMETHEUS_RULE_DIR}/grafana",)
ALERTMANAGER_CONFIG_FILE = f"{PROMETHEUS_RULE_DIR}/alertmanagerconfig.yaml"  # prometheus-operator's CRD
