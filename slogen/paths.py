"""Where `slogen build` puts each output, relative to the output root (the repository root by default).

One place for the paths, because one artifact lists another's files (the generated kustomization
names every PrometheusRule) and the writing stage must know which folders the build owns.
"""

from __future__ import annotations

ALERTS_DIR = "alerts"
PROMETHEUS_RULE_DIR = "deploy/generated"


def rules_path(service: str) -> str:
    return f"{ALERTS_DIR}/{service}.rules.yaml"


def tests_path(service: str) -> str:
    return f"{ALERTS_DIR}/{service}.test.yaml"


def prometheus_rule_path(service: str) -> str:
    return f"{PROMETHEUS_RULE_DIR}/prometheusrule-{service}.yaml"
