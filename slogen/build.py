"""`slogen build`: the catalog in, every generated file out, as an ordered chain of generators.

Three stages: `slogen.catalog.compile_catalog` reads every input once; each artifact generator,
`(catalog, options) -> {relative path: text}`, reads only the catalog and the options and opens
no file (tests/slogen/test_layout.py holds them to it); `slogen.outputs` writes the result (or
compares it, for `--check`). To add an artifact, append its generator to `ARTIFACT_GENERATORS`.
"""

from __future__ import annotations

from typing import Callable

from slogen.artifacts.alertmanager import alertmanager_files
from slogen.artifacts.dashboards import remembering
from slogen.artifacts.files import artifact_files
from slogen.catalog import BuildOptions, Catalog, compile_catalog
from slogen.errors import SpecError, SpecErrors
from slogen.promtests.dashboards import dashboard_test_files
from slogen.promtests.files import rule_tests
from slogen.rules.files import capacity_rules, health_rules, prometheus_rules, rule_files

ArtifactGenerator = Callable[[Catalog, BuildOptions], dict[str, str]]

# The build, in order. Append artifact generators here.
ARTIFACT_GENERATORS: list[ArtifactGenerator] = [
    rule_files,  # alerts/<service>.rules.yaml
    rule_tests,  # alerts/<service>.test.yaml
    prometheus_rules,  # deploy/generated/prometheusrule-<service>.yaml
    health_rules,  # alerts/llmslo-health.*, its PrometheusRule
    capacity_rules,  # alerts/llmslo-capacity.*, its PrometheusRule
    artifact_files,  # dashboards/, docs/runbooks/, KEDA and HPA, deploy/ (artifacts/files.py)
    dashboard_test_files,  # dashboards/dashboards.test.yaml: every panel's number on a synthetic fleet
    alertmanager_files,  # alerts/alertmanager.yaml: routing and inhibition (artifacts/alertmanager.py)
]


def build(options: BuildOptions, generators: list[ArtifactGenerator] | None = None) -> tuple[Catalog, dict[str, str]]:
    """The catalog and every generated file (relative path -> text, sorted); nothing is written."""
    catalog = compile_catalog(options)
    artifacts: dict[str, str] = {}
    with remembering():  # the dashboards are rendered once for the files and their tests
        for gen in ARTIFACT_GENERATORS if generators is None else generators:
            for path, text in gen(catalog, options).items():
                if path in artifacts:
                    raise SpecErrors([SpecError(path, f"two artifact generators both produce {path}",
                                                fix="give each generator its own output paths")])
                artifacts[path] = text
    return catalog, dict(sorted(artifacts.items()))
