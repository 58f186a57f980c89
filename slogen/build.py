"""`slogen build`: the SLO catalog in, every generated artifact out, as an ordered chain.

Each artifact generator is a pure function `(catalog, options) -> {relative path: text}`;
`ARTIFACT_GENERATORS` runs them in order. To add an artifact (dashboards, KEDA objects,
runbooks), append its generator to that list. Writing is separate: `write_outputs` replaces
the output directories whole (built beside, then swapped: `slogen.outtree`) and drops files this
build generated before but no longer produces;
`stale_outputs` is the `--check` comparison for CI.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from slogen.errors import SpecError, SpecErrors
from slogen.rules import SLOResult, generate
from slogen.artifacts.alertmanager import alertmanager_files
from slogen.artifacts.files import artifact_generator
from slogen.rules import health
from slogen.rules.health import HealthOptions
from slogen.promtests.health_tests import health_tests
from slogen.rules import capacity
from slogen.rules.capacity import CapacityOptions
from slogen.promtests.capacity_tests import capacity_tests
from slogen.rules.options import GenOptions
from slogen.promtests.slo_tests import service_tests
from slogen.rules.tiers import override_error
from slogen.loaders import load_paths
from slogen.loaders.k8s import API_VERSION as K8S_SPEC
from slogen.loaders.windows import merge
from slogen.model import SLO, AlertWindows
from llmslo.conventions import CAPACITY, HEALTH
from slogen.outtree import recover, replace_tree, roots_of
from slogen.writers import GENERATED_MARKER, K8S_LABELS, header, prometheus_rule, rule_file
from slogen.yamlio import dump

ALERTS_DIR = "alerts"
PROMETHEUS_RULE_DIR = "deploy/generated"


@dataclass(frozen=True)
class BuildOptions:
    inputs: tuple[str, ...] = ("slos",)
    windows_paths: tuple[str, ...] = ()  # extra AlertWindows catalogs (AlertWindows found among inputs load too)
    gen: GenOptions = field(default_factory=GenOptions)
    health: HealthOptions = field(default_factory=HealthOptions)
    capacity: CapacityOptions = field(default_factory=CapacityOptions)
    autoscaling: bool = True  # generate KEDA objects from autoscaling/ next to the inputs


@dataclass
class Catalog:
    """Everything artifact generators read: the SLOs, their generated rules, grouped by service."""

    slos: list[SLO]
    results: list[SLOResult]
    windows: dict[int, AlertWindows]
    warnings: list[SpecError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. SLOs left without generated tests, and why

    @property
    def services(self) -> dict[str, list[SLOResult]]:
        ordered = sorted(self.results, key=lambda r: r.slo.service)
        return {svc: list(items) for svc, items in itertools.groupby(ordered, key=lambda r: r.slo.service)}


ArtifactGenerator = Callable[[Catalog, BuildOptions], dict[str, str]]


def rules_path(service: str) -> str:
    return f"{ALERTS_DIR}/{service}.rules.yaml"


def tests_path(service: str) -> str:
    return f"{ALERTS_DIR}/{service}.test.yaml"


def prometheus_rule_path(service: str) -> str:
    return f"{PROMETHEUS_RULE_DIR}/prometheusrule-{service}.yaml"


def _source(items: list[SLOResult]) -> str:
    return ", ".join(sorted({Path(r.slo.origin.file).as_posix() for r in items}))


def rule_files(catalog: Catalog, options: BuildOptions) -> dict[str, str]:
    """alerts/<service>.rules.yaml: plain Prometheus / Thanos Ruler / Mimir rule files."""
    return {rules_path(svc): rule_file([g for r in items for g in r.rules.groups()], header(_source(items), options.gen.version))
            for svc, items in catalog.services.items()}


def rule_tests(catalog: Catalog, options: BuildOptions) -> dict[str, str]:
    """alerts/<service>.test.yaml: promtool unit tests staging an outage, a slow burn and no data."""
    out = {}
    for svc, items in catalog.services.items():
        doc, skipped = service_tests(items, Path(rules_path(svc)).name)
        catalog.notes += [f"{s.slo_id}: no generated tests ({s.reason})" for s in skipped]
        if doc is not None:
            out[tests_path(svc)] = header(_source(items), options.gen.version) + "\n" + dump(doc)
    return out


def prometheus_rules(catalog: Catalog, options: BuildOptions) -> dict[str, str]:
    """deploy/generated/prometheusrule-<service>.yaml: the same groups as a prometheus-operator object."""
    out = {}
    for svc, items in catalog.services.items():
        origin = next((r.slo.origin for r in items if r.slo.origin.spec == K8S_SPEC), None)
        out[prometheus_rule_path(svc)] = prometheus_rule(
            origin.k8s_name if origin and origin.k8s_name else f"slo-{svc}",
            [g for r in items for g in r.rules.groups()],
            namespace=origin.k8s_namespace if origin else "",
            labels=origin.k8s_labels if origin else None,
            head=header(_source(items), options.gen.version))
    return out


def health_alerts(options: BuildOptions) -> list[health.HealthAlert]:
    """The capacity and health alerts this build generates (none with `--no-health-alerts`)."""
    h = options.health
    if not h.enabled:
        return []
    problems = h.problems()
    if problems:
        raise SpecErrors([SpecError("slogen build", f"health alert option {name} {why}", fix=f"pass a valid --{name.replace('_', '-')}")
                          for name, why in problems])
    return health.health_alerts(h, options.gen.runbook_base_url, dict(options.gen.extra_labels), options.gen.grafana_url)


HEALTH_HEADER = (f"# {GENERATED_MARKER} ({{version}}): capacity and health alerts.\n"
                 "# DO NOT EDIT: change the slogen build options (see docs/slogen.md) and run `slogen build`.\n")


def health_rules(catalog: Catalog, options: BuildOptions) -> dict[str, str]:
    """alerts/llmslo-health.{rules,test}.yaml and its PrometheusRule: GPU, engine-target and KV alerts."""
    alerts = health_alerts(options)
    if not alerts:
        return {}
    group = health.health_group(alerts)
    head = HEALTH_HEADER.format(version=options.gen.version)
    test_doc = health_tests(alerts, options.health, Path(rules_path(HEALTH.GROUP)).name)
    return {
        rules_path(HEALTH.GROUP): rule_file([group], head),
        tests_path(HEALTH.GROUP): head + "\n" + dump(test_doc),
        prometheus_rule_path(HEALTH.GROUP): prometheus_rule(
            HEALTH.GROUP, [group], head=head,
            managed_labels={**K8S_LABELS, "app.kubernetes.io/component": "health"}),
    }


def capacity_alerts(options: BuildOptions) -> list[health.HealthAlert]:
    """The KV-seat alerts this build generates (none with `--no-capacity-rules`)."""
    k = getattr(options, "capacity", None)
    if k is None or not k.enabled:
        return []
    problems = k.problems()
    if problems:
        raise SpecErrors([SpecError("slogen build", f"capacity option {name} {why}", fix=f"pass a valid --{name.replace('_', '-')}")
                          for name, why in problems])
    return capacity.capacity_alerts(k, options.gen.runbook_base_url, dict(options.gen.extra_labels), options.gen.grafana_url)


def capacity_rules(catalog: Catalog, options: BuildOptions) -> dict[str, str]:
    """alerts/llmslo-capacity.{rules,test}.yaml and its PrometheusRule: KV seats, their forecast and alerts."""
    alerts = capacity_alerts(options)
    if not alerts:
        return {}
    group = capacity.capacity_group(options.capacity, alerts)
    head = CAPACITY_HEADER.format(version=options.gen.version)
    test_doc = capacity_tests(alerts, options.capacity, Path(rules_path(CAPACITY.GROUP)).name)
    return {
        rules_path(CAPACITY.GROUP): rule_file([group], head),
        tests_path(CAPACITY.GROUP): head + "\n" + dump(test_doc),
        prometheus_rule_path(CAPACITY.GROUP): prometheus_rule(
            CAPACITY.GROUP, [group], head=head,
            managed_labels={**K8S_LABELS, "app.kubernetes.io/component": "capacity"}),
    }


CAPACITY_HEADER = (f"# {GENERATED_MARKER} ({{version}}): KV seats, their forecast and the capacity alerts.\n"
                   "# DO NOT EDIT: change the slogen build options (see docs/slogen.md) and run `slogen build`.\n")


# The build, in order. Append artifact generators here.
ARTIFACT_GENERATORS: list[ArtifactGenerator] = [rule_files, rule_tests, prometheus_rules, health_rules,
                                                     capacity_rules]
ARTIFACT_GENERATORS.append(artifact_generator)  # dashboards/, docs/runbooks/, KEDA, deploy/ (artifacts/files.py)
ARTIFACT_GENERATORS.append(alertmanager_files)  # alerts/alertmanager.yaml: routing and inhibition (artifacts/alertmanager.py)


def compile_catalog(options: BuildOptions) -> Catalog:
    """Load, validate and generate rules for every SLO; SpecErrors lists every problem."""
    loaded = load_paths(list(options.inputs))
    extra = load_paths(list(options.windows_paths), windows_only=True).windows if options.windows_paths else []
    windows = merge(loaded.windows + extra, dict(options.gen.windows))
    gen = GenOptions(**{**options.gen.__dict__, "windows": windows})
    refused = override_error(gen)
    if refused is not None:
        raise SpecErrors([refused])
    results = generate(loaded.slos, gen)
    return Catalog(loaded.slos, results, windows, loaded.warnings)


def build(options: BuildOptions, generators: list[ArtifactGenerator] | None = None) -> tuple[Catalog, dict[str, str]]:
    catalog = compile_catalog(options)
    artifacts: dict[str, str] = {}
    for gen in ARTIFACT_GENERATORS if generators is None else generators:
        for path, text in gen(catalog, options).items():
            if path in artifacts:
                raise SpecErrors([SpecError(path, f"two artifact generators both produce {path}",
                                            fix="give each generator its own output paths")])
            artifacts[path] = text
    return catalog, dict(sorted(artifacts.items()))


def _managed_dirs(artifacts: dict[str, str]) -> set[str]:
    return {str(Path(p).parent) for p in artifacts} | {ALERTS_DIR, PROMETHEUS_RULE_DIR}


def _orphans(artifacts: dict[str, str], out: Path) -> list[str]:
    """Files slogen generated earlier (they carry its marker) that this build no longer produces."""
    found = []
    for d in sorted(_managed_dirs(artifacts)):
        base = out / d
        if not base.is_dir():
            continue
        for p in sorted(base.iterdir()):
            rel = p.relative_to(out).as_posix()
            if p.is_file() and rel not in artifacts and p.suffix in (".yaml", ".yml"):
                try:
                    head = p.read_text(encoding="utf-8", errors="replace")[:300]
                except OSError:
                    continue
                if GENERATED_MARKER in head:
                    found.append(rel)
    return found


def write_outputs(artifacts: dict[str, str], out: str | Path) -> tuple[list[str], list[str]]:
    """Replace the output tree under `out` as a whole (`slogen.outtree`: every changed output directory
    is built beside the old one, then swapped in); returns (changed paths, removed orphan paths).
    On any error the outputs are as they were before."""
    root = Path(out)
    dirs = _managed_dirs(artifacts)
    recover(root, roots_of(dirs))  # a build that died mid-swap
    removed = _orphans(artifacts, root)
    changed = replace_tree(artifacts, root, dirs, removed)
    return changed, removed


def stale_outputs(artifacts: dict[str, str], out: str | Path) -> list[str]:
    """Why the files under `out` differ from a fresh build (missing, different, orphaned); empty if current."""
    root = Path(out)
    problems = []
    for rel, text in artifacts.items():
        p = root / rel
        if not p.exists():
            problems.append(f"{rel}: missing")
        elif p.read_text(encoding="utf-8") != text:
            problems.append(f"{rel}: out of date")
    problems += [f"{rel}: no longer generated" for rel in _orphans(artifacts, root)]
    return problems

