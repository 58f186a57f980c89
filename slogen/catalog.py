"""The build's one input: every file `slogen build` reads, loaded once, plus what is computed from it once.

The build's steps (`slogen.steps`) read only this catalog, so nothing after `compile_catalog` touches the
disk until `slogen.outputs` writes the result. That is what makes a build reproducible from its catalog,
and a test able to feed the steps literals. The catalog is frozen: a step cannot leave anything in it
for a later step; what several steps read (the SLOs' rules and views, the health and capacity alerts)
is computed here, once.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from pathlib import Path

from llmslo.confighash import config_hash
from llmslo.conventions import SLO as C
from slogen import pools as autoscaling
from slogen.artifacts.alertmanager import TEAM_LABEL, alertmanager_config, receiver_warnings
from slogen.autoscaling import AutoscalingError, Pool
from slogen.errors import SpecError, SpecErrors
from slogen.k8smeta import KubeOptions
from slogen.links import placeholder_host
from slogen.loaders import load_paths
from slogen.loaders.windows import merge
from slogen.model import SLO, AlertWindows
from slogen.rules import SLOResult, capacity, generate, health, injector, isolation
from slogen.rules.capacity import CapacityOptions
from slogen.rules.health import HealthAlert, HealthOptions
from slogen.rules.options import GenOptions
from slogen.rules.scope import scoped
from slogen.rules.tiers import override_error, unreachable_warnings
from slogen.settings import InstallSettings
from slogen.views import SLOView, from_context


@dataclass(frozen=True)
class BuildOptions:
    inputs: tuple[str, ...] = ("slos",)
    windows_paths: tuple[str, ...] = ()  # extra AlertWindows catalogs (AlertWindows found among inputs load too)
    gen: GenOptions = field(default_factory=GenOptions)
    health: HealthOptions = field(default_factory=HealthOptions)
    capacity: CapacityOptions = field(default_factory=CapacityOptions)
    autoscaling: bool = True  # generate KEDA objects from the autoscaling specs
    autoscaling_dir: str | None = None  # None: autoscaling/ beside the first input directory (slogen.pools)
    kube: KubeOptions = field(default_factory=KubeOptions)  # object labels, Grafana and AlertmanagerConfig settings
    install: InstallSettings | None = None  # llmslo.yaml and its flags: deploy/install/ when it names namespaces

    @property
    def promtool_tests(self) -> bool:
        """Whether the build writes the promtool test files: yes, unless the settings say promtoolTests: false."""
        return self.install is None or self.install.promtool_tests


@dataclass(frozen=True)
class Catalog:
    """Everything the build's steps read: the options, the SLOs and their rules, the views the artifacts
    read of them, the alert windows, the health and capacity alerts, the autoscaling pools and the SLO
    files' text (for the tap's ConfigMap)."""

    options: BuildOptions
    slos: list[SLO]
    results: list[SLOResult]
    windows: dict[int, AlertWindows]
    warnings: list[SpecError] = field(default_factory=list)
    pools: tuple[Pool, ...] = ()  # autoscaling/ next to the inputs (none with `--no-autoscaling`)
    spec_files: dict[str, str] = field(default_factory=dict)  # SLO file path under the root -> its text
    views: tuple[SLOView, ...] = ()  # one per result, in the results' order
    health_alerts: tuple[HealthAlert, ...] = ()  # none with `--no-health-alerts`
    capacity_alerts: tuple[HealthAlert, ...] = ()  # none with `--no-capacity-rules`
    tap_config_hash: str = ""  # llmslo.confighash of spec_files: what the taps must report (HEALTH.TAP_CONFIG_DRIFT)
    routing: dict | None = None  # alerts/alertmanager.yaml as a dict (artifacts/alertmanager.py); None: no alerts

    @property
    def health_options(self) -> HealthOptions:
        """The health alert options in force: the build's, with the taps' expected config hash and the install's
        inference pool."""
        return health_options(self.options, self.tap_config_hash)

    @property
    def services(self) -> dict[str, list[SLOResult]]:
        ordered = sorted(self.results, key=lambda r: r.slo.service)
        return {svc: list(items) for svc, items in itertools.groupby(ordered, key=lambda r: r.slo.service)}


def input_root(options: BuildOptions) -> Path:
    """Where the build's other inputs sit: next to the first input directory, i.e. the repository root for
    the default `slogen build` of `slos/` (slogen.pools.input_root)."""
    return autoscaling.input_root(options.inputs)


def spec_files(slos: list[SLO], root: Path) -> dict[str, str]:
    """The text of the SLO files the SLOs came from, keyed by their path under `root`."""
    out: dict[str, str] = {}
    for slo in slos:
        path = Path(slo.origin.file)
        try:
            rel = path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            rel = path.name
        if rel not in out and path.is_file():
            out[rel] = path.read_text(encoding="utf-8")
    return out


def _refuse(problems: list[tuple[str, str]], what: str) -> None:
    """SpecErrors naming every bad build option (and the flag that sets it), if any."""
    if problems:
        raise SpecErrors([SpecError("slogen build", f"{what} option {name} {why}", fix=f"pass a valid --{name.replace('_', '-')}")
                          for name, why in problems])


def _refuse_flags(problems: list[tuple[str, str]]) -> None:
    """SpecErrors naming each bad build flag (`KubeOptions.problems`), if any."""
    if problems:
        raise SpecErrors([SpecError("slogen build", f"{flag} {why}", fix=f"pass a valid {flag}")
                          for flag, why in problems])


def _alerts(opts: HealthOptions | CapacityOptions, what: str, make, gen: GenOptions) -> tuple[HealthAlert, ...]:
    """The alerts `make` generates from `opts` (none when they are off); SpecErrors for bad options."""
    if not opts.enabled:
        return ()
    _refuse(opts.problems(), what)
    return tuple(make(opts, gen.runbook_base_url, dict(gen.extra_labels), gen.grafana_url))


def health_options(options: BuildOptions, tap_config_hash: str = "") -> HealthOptions:
    """The build's health options with what the build knows itself: `tap_config_hash`, llmslo.confighash of the SLO
    files (the taps' ConfigMap), which HEALTH.TAP_CONFIG_DRIFT expects, and the inference pool llmslo.yaml declares
    (`isolation:`), which the isolation alerts read, and whether it installs the tap injector (`tapInjector:`)."""
    pool = options.install.isolation if options.install is not None else None
    known = dataclasses.replace(options.health, tap_config_hash=tap_config_hash,
                                tap_injector=options.install is not None and options.install.tap_injector)
    if pool is None:
        return known
    return dataclasses.replace(known, isolation_pool=pool.pool, isolation_node_label=pool.node_label,
                               serving_namespaces=pool.serving_namespaces, serving_workloads=pool.serving_workloads)


def _health_and_isolation(opts: HealthOptions, *args) -> list[HealthAlert]:
    return health.health_alerts(opts, *args) + isolation.isolation_alerts(opts, *args) + injector.injector_alerts(
        opts, *args)


def health_alerts(options: BuildOptions, tap_config_hash: str = "") -> tuple[HealthAlert, ...]:
    """The capacity and health alerts a build generates (none with `--no-health-alerts`), the inference pool's
    isolation alerts among them when llmslo.yaml declares it (health_options)."""
    return _alerts(health_options(options, tap_config_hash), "health alert", _health_and_isolation, options.gen)


def capacity_alerts(options: BuildOptions) -> tuple[HealthAlert, ...]:
    """The KV-seat alerts a build generates (none with `--no-capacity-rules`)."""
    return _alerts(options.capacity, "capacity", capacity.capacity_alerts, options.gen)


def scope_alerts(results: list[SLOResult], alerts: tuple[HealthAlert, ...], namespace: str) -> tuple[HealthAlert, ...]:
    """Every alert rule of the build as an alert of `namespace` (slogen.rules.scope: the label prometheus-operator's
    OnNamespace matcher needs): the SLOs' rules in place, the health and capacity `alerts` returned. Nothing
    changes without a namespace; recording rules never do."""
    if not namespace:
        return alerts
    for r in results:
        for group in r.rules.groups():
            group.rules = [scoped(rule, namespace) for rule in group.rules]
    return tuple(dataclasses.replace(a, rule=scoped(a.rule, namespace)) for a in alerts)


def slo_teams(results: list[SLOResult]) -> list[str]:
    """The `team` label values the SLOs' alerts carry: a rule's own, or the SLO's labels, which its burn-rate
    alerts keep from the recorded series (a templated value names no one receiver and is left out)."""
    teams: set[str] = set()
    for r in results:
        rules = [rule for group in r.rules.groups() for rule in group.rules if rule.alert]
        if rules and TEAM_LABEL in r.ctx.labels:
            teams.add(r.ctx.labels[TEAM_LABEL])
        teams.update(rule.labels[TEAM_LABEL] for rule in rules if TEAM_LABEL in rule.labels)
    return sorted(t for t in teams if t and "{{" not in t)


def routing(options: BuildOptions, results: list[SLOResult],
            alerts: tuple[HealthAlert, ...]) -> tuple[dict | None, list[SpecError]]:
    """The Alertmanager routing of the build's alerts (None when it has none) and the warnings about its
    receivers (artifacts/alertmanager.py); `alerts`: the health and capacity alerts."""
    alerting = [r.ctx for r in results if r.ctx.alerts_enabled and r.rules.alerts.rules]
    teams, receivers = slo_teams(results), options.kube.receivers
    if not alerting and not options.health.enabled and not options.capacity.enabled:
        return None, receiver_warnings(teams, receivers, routed=False)
    catalogs = list({id(ctx.windows): ctx.windows for ctx in alerting}.values())
    compat = options.gen.sloth_compat
    tiers = () if compat else sorted({t.name for ctx in alerting for t in ctx.tiers if t.severity == "ticket"})
    severities = [(a.rule.alert, a.rule.labels.get(C.LABEL_ALERT_SEVERITY, "")) for a in alerts]
    return alertmanager_config(catalogs, tiers, severities, teams, receivers), receiver_warnings(teams, receivers)


def placeholder_warnings(gen: GenOptions) -> list[SpecError]:
    """A warning for each link every alert carries that points at a reserved example host (the defaults do):
    on call would open a page that does not exist."""
    links = (("runbook_url", gen.runbook_base_url, "--runbook-url 'https://wiki.example/runbooks/{{alert}}' or "
              "--runbook-base-url URL (env SLOGEN_RUNBOOK_BASE_URL)"),
             ("dashboard", gen.grafana_url, "--grafana-url URL (env SLOGEN_GRAFANA_URL)"))
    keys = {"runbook_url": "runbookUrl", "dashboard": "grafanaUrl"}
    return [SpecError("slogen build", f"every alert's {what} annotation points at the placeholder host {host}",
                      fix=f"set {flag} (or {key} in llmslo.yaml) to where yours live")
            for what, url, flag in links if (host := placeholder_host(url)) for key in [keys[what]]]


def compile_catalog(options: BuildOptions) -> Catalog:
    """Load and validate every input, generate the rules of every SLO, and compute what the steps share;
    SpecErrors lists every problem (AutoscalingError: every one in the autoscaling specs)."""
    loaded = load_paths(list(options.inputs))
    extra = load_paths(list(options.windows_paths), windows_only=True).windows if options.windows_paths else []
    windows = merge(loaded.windows + extra, dict(options.gen.windows))
    gen = GenOptions(**{**options.gen.__dict__, "windows": windows})
    refused = override_error(gen)
    if refused is not None:
        raise SpecErrors([refused])
    _refuse_flags(options.kube.problems())
    results = generate(loaded.slos, gen)
    root = input_root(options)
    views = tuple(from_context(r.ctx) for r in results)
    pools: tuple[Pool, ...] = ()
    if options.autoscaling:
        pools, problems = autoscaling.read_pools(autoscaling.directory(options.inputs, options.autoscaling_dir), views)
        if problems:
            raise AutoscalingError(problems)
    files = spec_files(loaded.slos, root)
    tap_hash = config_hash(files.values())
    health, kv = health_alerts(options, tap_hash), capacity_alerts(options)
    scope = scope_alerts(results, health + kv, options.kube.namespace)
    health, kv = scope[:len(health)], scope[len(health):]
    routed, routing_warnings = routing(options, results, health + kv)
    warnings = list(loaded.warnings) + unreachable_warnings(loaded.slos, gen) + placeholder_warnings(gen) + routing_warnings
    return Catalog(options, loaded.slos, results, windows, warnings, pools=pools,
                   spec_files=files, views=views, health_alerts=health, capacity_alerts=kv,
                   tap_config_hash=tap_hash, routing=routed)
