"""The AlertmanagerConfig routes every generated alert under prometheus-operator's default matcher strategy
(OnNamespace), to the receiver of its team, proven with the real tools.

prometheus-operator (pkg/alertmanager/amcfg.go) merges an AlertmanagerConfig `<ns>/<name>` into Alertmanager's
configuration as a child of the root route: it renames every receiver `<ns>/<name>/<receiver>`, adds the matcher
`namespace="<ns>"` to the config's top route (and `continue: true`), and adds the same matcher to both sides of
each of its inhibit rules. This test does the same to the object a build with `KubeOptions(namespace=...)` and
receivers writes, checks the result with `amtool check-config`, and asks `amtool config routes test` where each
generated alert goes: with the labels the rules give it, and with the labels the generated promtool tests prove
the alerts fire with (promtool runs them). Without its `namespace` label, the same alert falls through to the
root's receiver: what every alert did before the build gave them the label.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from llmslo.conventions import SLO as C
from slogen.artifacts.alertmanager import PAGE_RECEIVER, TEAM_LABEL, TICKET_RECEIVER
from slogen.build import build
from slogen.catalog import BuildOptions
from slogen.k8smeta import KubeOptions
from slogen.paths import ALERTMANAGER_CONFIG_FILE
from slogen.rules.options import GenOptions
from slogen.rules.scope import EXPORTED_NAMESPACE, scoped
from tests.helpers.needs import command

NAMESPACE = "monitoring"
CONFIG_NAME = "llmslo"  # KubeOptions.alertmanager_config_name's default
ROOT_RECEIVER = "default"  # the Alertmanager's own root route, which the operator hangs the object's route under
PREFIX = f"{NAMESPACE}/{CONFIG_NAME}/"
CLUSTER = "prod-eu-1"

# Three services: two with a spec-level team label, one without (whose page alert names its own team).
SPECS = {
    "chat.yaml": """\
version: "prometheus/v1"
service: "chat"
labels:
  team: inference
slos:
  - name: "availability"
    objective: 99.9
    sli:
      plugin:
        id: "llmslo/availability"
        options: {source: "tap", slo_class: "interactive"}
    alerting:
      name: ChatAvailabilityBudgetBurn
  - name: "ttft"
    objective: 99
    sli:
      plugin:
        id: "llmslo/latency"
        options: {metric: "ttft", threshold: "0.1", source: "engine"}
    alerting:
      name: ChatTTFTBudgetBurn
""",
    "fleet.yaml": """\
version: "prometheus/v1"
service: "fleet"
labels:
  team: platform
slos:
  - name: "kv-headroom"
    objective: 95
    sli:
      plugin:
        id: "llmslo/kv-headroom"
        options: {threshold: "0.9"}
    alerting:
      name: FleetKVHeadroomBudgetBurn
""",
    "search.yaml": """\
version: "prometheus/v1"
service: "search"
slos:
  - name: "availability"
    objective: 99.5
    sli:
      plugin:
        id: "llmslo/availability"
        options: {source: "engine"}
    alerting:
      name: SearchAvailabilityBudgetBurn
      page_alert: {labels: {team: search-sre}}
""",
}
TEAMS = {"chat": "inference", "fleet": "platform"}  # service -> its spec's team label
RECEIVERS = {PAGE_RECEIVER: "https://pager.corp.internal/llm", TICKET_RECEIVER: "https://tickets.corp.internal/llm",
             "inference": "https://hooks.corp.internal/inference", "platform": "https://hooks.corp.internal/platform",
             "search-sre": "https://hooks.corp.internal/search-sre"}
LINKS = GenOptions(runbook_base_url="https://wiki.corp.internal/llm", grafana_url="https://grafana.corp.internal")


def amtool() -> str:
    return command("amtool", "run `make system-deps` (Debian package prometheus-alertmanager)")


def _options(root: Path, receivers: dict[str, str]) -> BuildOptions:
    return BuildOptions(inputs=(str(root / "slos"),), autoscaling=False, gen=LINKS,
                        kube=KubeOptions(namespace=NAMESPACE, receivers=receivers))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnamespace")
    (root / "slos").mkdir()
    for name, text in SPECS.items():
        (root / "slos" / name).write_text(text)
    out = build(_options(root, RECEIVERS))
    files = {p: c if isinstance(c, str) else Path(c).read_text() for p, c in out.files.items()}
    return root, out.catalog, files


# --- what prometheus-operator makes of the object (OnNamespace) -----------------------------------------------


def _matcher(m: dict) -> str:
    return f'{m["name"]}{m["matchType"]}{json.dumps(m["value"], ensure_ascii=False)}'


def _route(crd: dict) -> dict:
    out: dict = {"receiver": PREFIX + crd["receiver"]}
    if "groupBy" in crd:
        out["group_by"] = list(crd["groupBy"])
    for camel, snake in (("groupWait", "group_wait"), ("groupInterval", "group_interval"),
                         ("repeatInterval", "repeat_interval")):
        if camel in crd:
            out[snake] = crd[camel]
    if "matchers" in crd:
        out["matchers"] = [_matcher(m) for m in crd["matchers"]]
    if "routes" in crd:
        out["routes"] = [_route(r) for r in crd["routes"]]
    return out


def operator_config(obj: dict) -> dict:
    """The Alertmanager configuration prometheus-operator generates for this one AlertmanagerConfig in namespace
    NAMESPACE, under a root route of its own (the operator's namespaceEnforcer and continueToNextRoute)."""
    spec = obj["spec"]
    top = _route(spec["route"])
    top["matchers"] = [*top.get("matchers", []), f'namespace="{NAMESPACE}"']
    top["continue"] = True
    guard = f'namespace="{NAMESPACE}"'
    inhibit = [{"source_matchers": [*(_matcher(m) for m in r["sourceMatch"]), guard],
                "target_matchers": [*(_matcher(m) for m in r["targetMatch"]), guard],
                "equal": list(r["equal"])} for r in spec.get("inhibitRules", [])]
    receivers = [{"name": ROOT_RECEIVER}] + [
        {"name": PREFIX + r["name"], **({"webhook_configs": [{"url": w["url"]} for w in r["webhookConfigs"]]}
                                         if "webhookConfigs" in r else {})}
        for r in spec["receivers"]]
    return {"route": {"receiver": ROOT_RECEIVER, "routes": [top]}, "inhibit_rules": inhibit, "receivers": receivers}


@pytest.fixture(scope="module")
def operator_file(built, tmp_path_factory) -> Path:
    _, _, files = built
    obj = yaml.safe_load(files[ALERTMANAGER_CONFIG_FILE])
    assert obj["kind"] == "AlertmanagerConfig"
    path = tmp_path_factory.mktemp("am") / "alertmanager.yaml"
    path.write_text(yaml.safe_dump(operator_config(obj), sort_keys=False))
    return path


def routed(config: Path, labels: dict[str, str]) -> str:
    proc = subprocess.run([amtool(), "config", "routes", "test", f"--config.file={config}",
                           *(f"{k}={v}" for k, v in sorted(labels.items()))], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 or proc.stdout.strip(), proc.stderr
    return proc.stdout.strip()


# --- the alerts and where each must go -------------------------------------------------------------------------


def _rule_files(files: dict[str, str]) -> dict[str, dict]:
    return {p: yaml.safe_load(t) for p, t in files.items() if p.startswith("alerts/") and p.endswith(".rules.yaml")}


def _carries_slo_labels(labels: dict[str, str]) -> bool:
    """Whether the alert keeps the recorded series' labels (the SLO's spec labels among them): the burn-rate
    tiers do (`max without (sloth_window)`); no-data (`absent`, `group by`) and bucket-edge (`count by`) do not."""
    return C.LABEL_SEVERITY in labels and labels.get(C.LABEL_TIER) not in ("no-data", "bucket-edge")


def alerts_as_generated(files: dict[str, str]) -> list[dict[str, str]]:
    """Every alert rule of the generated rule files: its static labels, its name, a cluster, and for an SLO's burn
    tiers the spec's team label as the recorded series carry it (unless a static one overrides it)."""
    out = []
    for doc in _rule_files(files).values():
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                labels = {"alertname": rule["alert"], "cluster": CLUSTER}
                # the group is the SLO's (sloth-slo-alerts-<id>, llmslo-bucket-edges-<id>; id: <service>-<name>)
                team = next((t for s, t in TEAMS.items() if f"-{s}-" in group["name"]), None)
                if team and _carries_slo_labels(rule.get("labels", {})):
                    labels[TEAM_LABEL] = team
                labels.update(rule.get("labels", {}))
                out.append(labels)
    return out


def alerts_as_tested(files: dict[str, str]) -> list[dict[str, str]]:
    """Every label set the generated promtool tests expect a firing alert to carry (promtool proves them)."""
    out = []
    for path, text in files.items():
        if path.startswith("alerts/") and path.endswith(".test.yaml"):
            for test in yaml.safe_load(text)["tests"]:
                for check in test.get("alert_rule_test", []):
                    out += [{"alertname": check["alertname"], **e["exp_labels"]} for e in check["exp_alerts"]]
    return [dict(labels) for labels in dict.fromkeys(tuple(sorted(a.items())) for a in out)]  # each once


def expected_receiver(labels: dict[str, str]) -> str:
    severity = labels.get(C.LABEL_SEVERITY)  # slogen's page/ticket (sloth_severity)
    if severity in ("page", "ticket"):
        default = PAGE_RECEIVER if severity == "page" else TICKET_RECEIVER
        return PREFIX + labels.get(TEAM_LABEL, default)
    # health and capacity alerts: critical pages, the rest tickets
    return PREFIX + (PAGE_RECEIVER if labels.get(C.LABEL_ALERT_SEVERITY) == "critical" else TICKET_RECEIVER)


# --- the tests --------------------------------------------------------------------------------------------------


def test_the_build_with_every_receiver_given_warns_of_none(built):
    _, catalog, _ = built
    assert [str(w) for w in catalog.warnings if "receiver" in str(w)] == []


def test_amtool_accepts_what_the_operator_makes_of_it_and_the_plain_file(built, operator_file):
    _, _, files = built
    plain = operator_file.with_name("plain.yaml")
    plain.write_text(files["alerts/alertmanager.yaml"])
    for path, receivers in ((operator_file, len(RECEIVERS) + 1), (plain, len(RECEIVERS))):
        proc = subprocess.run([amtool(), "check-config", str(path)], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{receivers} receivers" in proc.stdout
    assert routed(plain, {"alertname": "X", C.LABEL_SEVERITY: "page", TEAM_LABEL: "platform"}) == "platform"


def test_every_generated_alert_carries_the_namespace_and_keeps_its_own(built):
    _, catalog, files = built
    rules = [r for doc in _rule_files(files).values() for g in doc["groups"] for r in g["rules"]]
    alerts = [r for r in rules if "alert" in r]
    assert alerts and all(r["labels"]["namespace"] == NAMESPACE for r in alerts)
    assert all(EXPORTED_NAMESPACE in r["expr"] for r in alerts)
    assert not any("namespace" in r.get("labels", {}) or EXPORTED_NAMESPACE in r["expr"] for r in rules if "record" in r)
    tested = alerts_as_tested(files)
    kept = [a for a in tested if EXPORTED_NAMESPACE in a]  # health and capacity alerts on an engine's series
    assert kept and all(a["namespace"] == NAMESPACE and a[EXPORTED_NAMESPACE] != NAMESPACE for a in kept)


def test_the_generated_promtool_tests_pass(built, tmp_path):
    promtool = command("promtool", "run `make system-deps` (Debian package prometheus)")
    _, _, files = built
    for path, text in files.items():
        if path.startswith("alerts/") and path.endswith((".rules.yaml", ".test.yaml")):
            (tmp_path / Path(path).name).write_text(text)
    tests = sorted(p.name for p in tmp_path.glob("*.test.yaml"))
    assert tests
    proc = subprocess.run([promtool, "test", "rules", *tests], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.parametrize("source", ["rules", "promtool tests"])
def test_every_alert_routes_to_its_receiver_and_nowhere_without_the_namespace(built, operator_file, source):
    _, _, files = built
    alerts = alerts_as_generated(files) if source == "rules" else alerts_as_tested(files)
    assert alerts
    wrong, unguarded = [], []
    for labels in alerts:
        want = expected_receiver(labels)
        got = routed(operator_file, labels)
        if got != want:
            wrong.append((labels, want, got))
        bare = {k: v for k, v in labels.items() if k != "namespace"}
        if (got := routed(operator_file, bare)) != ROOT_RECEIVER:
            unguarded.append((bare, got))
    assert wrong == [], wrong[:5]
    assert unguarded == [], unguarded[:5]
    reached = {expected_receiver(labels).removeprefix(PREFIX) for labels in alerts}
    if source == "rules":  # every receiver is somebody's: team pages and tickets, the generic two, health pages
        assert reached == set(RECEIVERS)
        kinds = {(a.get(TEAM_LABEL), a.get(C.LABEL_SEVERITY) or a.get(C.LABEL_ALERT_SEVERITY)) for a in alerts}
        assert {("inference", "page"), ("inference", "ticket"), ("platform", "page"), ("search-sre", "page"),
                (None, "ticket"), (None, "critical"), (None, "warning")} <= kinds


def test_a_team_receiver_without_a_url_and_a_url_nobody_uses_are_warnings(built):
    root, _, _ = built
    receivers = {k: v for k, v in RECEIVERS.items() if k != "platform"} | {"nobody": "https://hooks.corp.internal/x"}
    catalog = build(_options(root, receivers)).catalog
    warnings = [str(w) for w in catalog.warnings if "receiver" in str(w)]
    assert len(warnings) == 2, warnings
    assert any("receiver platform, which has no URL" in w and "--receiver platform=URL" in w
               and "llmslo.yaml receivers:" in w for w in warnings)
    assert any("receiver nobody has a URL, but the routing" in w and "sends nothing to it" in w for w in warnings)


def test_a_team_without_a_url_is_paged_through_the_generic_receiver_not_dropped(built, tmp_path):
    """A team route to a receiver without an integration would page no one: until the team has a URL, its pages
    and tickets go to llmslo-page and llmslo-ticket (amtool on what the operator makes of the object)."""
    root, _, _ = built
    receivers = {k: v for k, v in RECEIVERS.items() if k != "platform"}
    content = build(_options(root, receivers)).files[ALERTMANAGER_CONFIG_FILE]
    obj = yaml.safe_load(content if isinstance(content, str) else Path(content).read_text())
    assert "platform" not in {r["name"] for r in obj["spec"]["receivers"]}
    config = tmp_path / "alertmanager.yaml"
    config.write_text(yaml.safe_dump(operator_config(obj), sort_keys=False))
    base = {"namespace": NAMESPACE, TEAM_LABEL: "platform", C.LABEL_SERVICE: "fleet", "cluster": "a"}
    assert routed(config, {**base, C.LABEL_SEVERITY: "page"}) == PREFIX + PAGE_RECEIVER
    assert routed(config, {**base, C.LABEL_SEVERITY: "ticket"}) == PREFIX + TICKET_RECEIVER
    assert routed(config, {**base, TEAM_LABEL: "inference", C.LABEL_SEVERITY: "page"}) == PREFIX + "inference"


def test_without_namespace_or_receivers_the_build_is_as_before_and_only_alerts_change_with_them(built):
    """The namespace changes the alert rules by `scoped` alone (recording rules not at all); no receivers at all
    is the placeholder routing: the generic two without integrations, no team routes, and a warning for each."""
    root, catalog, _ = built
    plain = build(BuildOptions(inputs=(str(root / "slos"),), autoscaling=False, gen=LINKS)).catalog
    assert [r.slo.id for r in plain.results] == [r.slo.id for r in catalog.results]
    for before, after in zip(plain.results, catalog.results, strict=True):
        for g0, g1 in zip(before.rules.groups(), after.rules.groups(), strict=True):
            assert [scoped(r, NAMESPACE) for r in g0.rules] == g1.rules
            assert [r for r in g0.rules if r.record] == [r for r in g1.rules if r.record]
    assert [scoped(a.rule, NAMESPACE) for a in (*plain.health_alerts, *plain.capacity_alerts)] == \
        [a.rule for a in (*catalog.health_alerts, *catalog.capacity_alerts)]
    assert plain.routing is not None and plain.routing["receivers"] == [{"name": PAGE_RECEIVER}, {"name": TICKET_RECEIVER}]
    assert not any(TEAM_LABEL in m for r in plain.routing["route"]["routes"] for m in r["matchers"])
    warned = [str(w) for w in plain.warnings if "receiver" in str(w)]
    assert len(warned) == 2 + 3  # llmslo-page, llmslo-ticket; teams inference, platform, search-sre
    assert all("--receiver" in w and "llmslo.yaml receivers:" in w for w in warned)


@pytest.mark.parametrize("kube, flag", [
    (KubeOptions(namespace="Monitoring"), "--namespace"),
    (KubeOptions(namespace="a" * 64), "--namespace"),
    (KubeOptions(receivers={"llmslo-page": "ftp://pager.corp.internal"}), "--receiver"),
    (KubeOptions(receivers={"llmslo-page": "https://"}), "--receiver"),
    (KubeOptions(receivers={"": "https://pager.corp.internal"}), "--receiver"),
])
def test_a_bad_namespace_or_receiver_url_is_refused_naming_the_flag(kube, flag):
    assert [f for f, _ in kube.problems()] == [flag]


def test_the_object_with_its_webhook_urls_validates_against_the_crd(built, crd):
    _, _, files = built
    obj = yaml.safe_load(files[ALERTMANAGER_CONFIG_FILE])
    assert crd.crd_errors(obj) == []
    assert {r["name"]: r["webhookConfigs"] for r in obj["spec"]["receivers"]} == \
        {name: [{"url": url}] for name, url in RECEIVERS.items()}
