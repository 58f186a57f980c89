"""What kube-prometheus-stack needs of a build (#28): the objects carry the labels its selectors match, the
dashboards come as ConfigMaps for its Grafana sidecar and as a file provider, the routing as an
AlertmanagerConfig, and placeholder links are said out loud."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from slogen.artifacts.alertmanager import alertmanager_config_object
from slogen.artifacts.grafana_provisioning import dashboard_configmap
from slogen.cli import main
from slogen.errors import SpecErrors
from slogen.k8smeta import (
    MAX_CONFIGMAP_BYTES,
    KubeOptions,
    label_value_problem,
    qualified_name_problem,
    subdomain_problem,
)
from tests.helpers.needs import command

from .conftest import ROOT, k8s

RELEASE = {"release": "kps-prod"}  # what the chart's ruleSelector would match for a Helm release `kps-prod`
FLAGS = ["--object-label", "release=kps-prod", "--object-label", "example.com/team=llm-sre",
         "--object-annotation", "example.com/owner=sre@example.com"]
REAL_LINKS = ["--runbook-base-url", "https://wiki.corp.internal/llm", "--grafana-url", "https://grafana.corp.internal"]


def _build(out: Path, *flags: str) -> int:
    """A build of the repository's SLOs without its llmslo.yaml (a user's build with flags alone)."""
    settings = out / "no-settings.yaml"
    settings.write_text("version: llmslo/install/v1\n")
    return main(["build", str(ROOT / "slos"), "--out", str(out), "--settings", str(settings), *flags])


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kps")
    assert _build(out, *FLAGS, *REAL_LINKS) == 0
    return out


def _objects(out: Path) -> list[tuple[str, dict]]:
    """Every Kubernetes object the build wrote, with its file, and the dashboards' ConfigMaps kustomize makes
    (with the file `dashboards/kustomization.yaml`)."""
    files = sorted((out / "deploy").rglob("*.yaml"))
    found = [(f.relative_to(out).as_posix(), d) for f in files for d in k8s.load_all(f.read_text())]
    kubectl = command("kubectl", "install kubectl: its built-in kustomize makes the dashboards' ConfigMaps")
    made = subprocess.run([kubectl, "kustomize", str(out / "dashboards")], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    found += [("dashboards/kustomization.yaml", d) for d in k8s.load_all(made.stdout)]
    return [(p, d) for p, d in found if isinstance(d, dict) and "kind" in d and d["kind"] != "Kustomization"]


def test_every_generated_object_carries_the_object_labels_and_annotations(labelled):
    objects = _objects(labelled)
    kinds = {d["kind"] for _, d in objects}
    assert {"PrometheusRule", "ScaledObject", "HorizontalPodAutoscaler", "ConfigMap", "AlertmanagerConfig"} <= kinds
    for path, obj in objects:
        meta = obj["metadata"]
        assert meta["labels"]["release"] == "kps-prod", (path, meta["name"])
        assert meta["labels"]["example.com/team"] == "llm-sre", (path, meta["name"])
        assert meta["annotations"]["example.com/owner"] == "sre@example.com", (path, meta["name"])
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "slogen"
        for key, value in meta["labels"].items():
            assert qualified_name_problem(key) is None and label_value_problem(value) is None, (path, key, value)
        assert subdomain_problem(meta["name"]) is None, (path, meta["name"])


def test_every_generated_custom_resource_validates_against_its_crd(labelled, crd):
    custom = [(path, obj) for path, obj in _objects(labelled) if crd.is_custom(obj)]
    assert {"PrometheusRule", "ScaledObject", "AlertmanagerConfig"} <= {obj["kind"] for _, obj in custom}
    for path, obj in custom:
        assert crd.crd_errors(obj) == [], path


def _selected(objects: list[tuple[str, dict]], kind: str, match_labels: dict[str, str]) -> list[dict]:
    """What prometheus-operator's `ruleSelector: {matchLabels: ...}` picks (the chart's default form)."""
    return [o for _, o in objects if o["kind"] == kind
            and all(o["metadata"].get("labels", {}).get(k) == v for k, v in match_labels.items())]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _loaded_groups(rule_dir: Path, tmp: Path) -> list[dict]:
    """The rule groups a real Prometheus on loopback loads from `rule_dir/*.yaml` (as the operator mounts them)."""
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"evaluation_interval": "1m"},
                                      "rule_files": [str(rule_dir / "*.yaml")]}))
    port = _free_port()
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"prometheus exited: {proc.stderr.read().decode()[-2000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=2) as resp:
                    body = json.load(resp)
                if body["data"]["groups"] or time.monotonic() > deadline:
                    return body["data"]["groups"]
            except OSError:
                assert time.monotonic() < deadline, "prometheus did not answer within 60 s"
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_prometheus_selecting_by_the_release_label_loads_every_rule(labelled, promtool, tmp_path):
    """The chart's Prometheus selects PrometheusRules by `release`; the operator writes each selected object's
    spec to a rule file. Here: the same selection, the specs checked by promtool and loaded by a real Prometheus."""
    objects = _objects(labelled)
    selected = _selected(objects, "PrometheusRule", RELEASE)
    every = [o for _, o in objects if o["kind"] == "PrometheusRule"]
    assert len(selected) == len(every) == 5
    rule_dir = tmp_path / "rules"
    rule_dir.mkdir()
    for obj in selected:
        path = rule_dir / f"{obj['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(obj["spec"], sort_keys=False))
        proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    want = {g["name"] for o in selected for g in o["spec"]["groups"]}
    groups = _loaded_groups(rule_dir, tmp_path)
    assert {g["name"] for g in groups} == want
    assert sum(len(g["rules"]) for g in groups) == sum(len(g["rules"]) for o in selected for g in o["spec"]["groups"])


def test_without_the_label_the_selector_picks_nothing(tmp_path):
    """The defect: a default build's objects carry no `release`, so the chart's Prometheus ignores them."""
    assert _build(tmp_path, *REAL_LINKS) == 0
    objects = _objects(tmp_path)
    assert [o for _, o in objects if o["kind"] == "PrometheusRule"]
    assert _selected(objects, "PrometheusRule", RELEASE) == []


@pytest.mark.parametrize("flag, value, named", [
    ("--object-label", "Bad Key=x", "--object-label"),
    ("--object-label", "release=" + "x" * 64, "--object-label"),
    ("--object-label", "release=bad value", "--object-label"),
    ("--object-label", "app.kubernetes.io/managed-by=helm", "--object-label"),
    ("--object-label", "UPPER.example.com/x=1", "--object-label"),
    ("--object-label", "release", "--object-label"),
    ("--object-annotation", "/x=1", "--object-annotation"),
    ("--dashboard-label", "grafana_dashboard=not ok", "--dashboard-label"),
    ("--dashboard-folder-annotation", "bad key", "--dashboard-folder-annotation"),
    ("--grafana-dashboards-path", "relative/dir", "--grafana-dashboards-path"),
    ("--alertmanager-config-name", "Not_A_Name", "--alertmanager-config-name"),
    ("--runbook-url", "https://wiki.corp.internal/llm", "--runbook-url"),
    ("--runbook-url", "https://wiki.corp.internal/{{alertname}}", "--runbook-url"),
])
def test_bad_kubernetes_settings_exit_2_naming_the_flag(tmp_path, capsys, flag, value, named):
    assert _build(tmp_path, flag, value) == 2
    err = capsys.readouterr().err
    assert named in err and value.split("=")[0][:20] in err
    assert not (tmp_path / "deploy").exists()


# --- Grafana ---------------------------------------------------------------------------------------------


def test_dashboard_configmaps_hold_exactly_the_dashboards(labelled):
    dashboards = {p.name: p.read_text() for p in (labelled / "dashboards").glob("*.json")}
    maps = [o for _, o in _objects(labelled) if o["kind"] == "ConfigMap"
            and o["metadata"]["labels"].get("app.kubernetes.io/component") == "dashboard"]
    assert len(maps) == len(dashboards) == 12  # the fleet, the SLO overview and one per SLO
    seen = {}
    for cm in maps:
        meta = cm["metadata"]
        assert meta["labels"]["grafana_dashboard"] == "1"  # kube-prometheus-stack's sidecar default
        assert meta["annotations"]["grafana_folder"] == "LLM SLOs"
        assert subdomain_problem(meta["name"]) is None
        (key, text), = cm["data"].items()
        seen[key] = text
        assert json.loads(text) == json.loads(dashboards[key])
        assert text == dashboards[key]  # byte for byte: the sidecar writes the value to a file as is
        assert len(text.encode()) <= MAX_CONFIGMAP_BYTES
    assert set(seen) == set(dashboards)


def test_dashboard_label_folder_and_provider_path_are_settings(tmp_path):
    assert _build(tmp_path, *REAL_LINKS, "--dashboard-label", "grafana_dashboard=llm", "--dashboard-label",
                  "team=sre", "--dashboard-folder-annotation", "k8s-sidecar-target-directory",
                  "--dashboard-folder", "/tmp/dashboards/LLM", "--grafana-dashboards-path", "/etc/dash",
                  "--no-health-alerts", "--no-capacity-rules") == 0
    maps = [o for _, o in _objects(tmp_path) if o["kind"] == "ConfigMap" and "team" in o["metadata"]["labels"]]
    assert maps and all(o["metadata"]["labels"]["grafana_dashboard"] == "llm" for o in maps)
    assert all(o["metadata"]["annotations"] == {"k8s-sidecar-target-directory": "/tmp/dashboards/LLM"} for o in maps)
    provider = yaml.safe_load((tmp_path / "dashboards" / "grafana-provider.yaml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/etc/dash"
    assert provider["providers"][0]["folder"] == "/tmp/dashboards/LLM"


def test_the_provider_has_what_grafana_reads(labelled):
    provider = yaml.safe_load((labelled / "dashboards" / "grafana-provider.yaml").read_text())
    assert provider["apiVersion"] == 1
    (p,) = provider["providers"]
    assert p["type"] == "file" and p["name"] and isinstance(p["orgId"], int)
    assert p["options"]["path"] == "/var/lib/grafana/dashboards/llmslo" and p["folder"] == "LLM SLOs"
    assert isinstance(p["updateIntervalSeconds"], int) and isinstance(p["disableDeletion"], bool)


def test_a_dashboard_over_a_configmaps_limit_is_refused_by_name():
    big = json.dumps({"title": "x", "panels": [{"description": "y" * MAX_CONFIGMAP_BYTES}]})
    with pytest.raises(SpecErrors) as err:
        dashboard_configmap("dashboards/slo-huge.json", big, KubeOptions())
    text = str(err.value)
    assert "dashboards/slo-huge.json" in text and str(MAX_CONFIGMAP_BYTES) in text and "grafana-provider.yaml" in text


# --- Alertmanager ---------------------------------------------------------------------------------------


def _route_errors(route: dict, schema: dict, where: str = "spec.route") -> list[str]:
    """The CRD leaves sub-routes free-form (the operator parses them as routes): check each as a route."""
    import jsonschema
    errors = [f"{where}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(
        {k: v for k, v in route.items() if k != "routes"})]
    for i, sub in enumerate(route.get("routes", [])):
        errors += _route_errors(sub, schema, f"{where}.routes[{i}]")
    return errors


def _from_crd(matchers: list[dict]) -> list[str]:
    return [f'{m["name"]}{m["matchType"]}{json.dumps(m["value"])}' for m in matchers]


def _alertmanager_config(labelled: Path) -> dict:
    (obj,) = [o for _, o in _objects(labelled) if o["kind"] == "AlertmanagerConfig"]
    assert obj["apiVersion"] == "monitoring.coreos.com/v1alpha1" and obj["metadata"]["name"] == "llmslo"
    return obj


def test_alertmanager_config_validates_against_its_crd(labelled, crd):
    obj = _alertmanager_config(labelled)
    assert crd.crd_errors(obj) == []
    route_schema = crd.crd_schema("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig")["properties"]["spec"][
        "properties"]["route"]
    assert _route_errors(obj["spec"]["route"], route_schema) == []


def test_alertmanager_config_is_the_same_routing(labelled):
    plain = yaml.safe_load((labelled / "alerts" / "alertmanager.yaml").read_text())
    obj = _alertmanager_config(labelled)

    def same(crd: dict, am: dict) -> None:
        assert crd["receiver"] == am["receiver"] and crd.get("groupBy") == am.get("group_by")
        for camel, snake in (("groupWait", "group_wait"), ("groupInterval", "group_interval"),
                             ("repeatInterval", "repeat_interval")):
            assert crd.get(camel) == am.get(snake)
        assert _from_crd(crd.get("matchers", [])) == am.get("matchers", [])
        assert len(crd.get("routes", [])) == len(am.get("routes", []))
        for c, a in zip(crd.get("routes", []), am.get("routes", []), strict=True):
            same(c, a)

    same(obj["spec"]["route"], plain["route"])
    assert [(_from_crd(r["sourceMatch"]), _from_crd(r["targetMatch"]), r["equal"]) for r in obj["spec"]["inhibitRules"]] \
        == [(r["source_matchers"], r["target_matchers"], r["equal"]) for r in plain["inhibit_rules"]]
    assert obj["spec"]["receivers"] == plain["receivers"]
    assert any(m["matchType"] == "=~" for r in obj["spec"]["route"]["routes"] for m in r["matchers"])


def test_a_matcher_value_with_quotes_survives():
    config = {"route": {"receiver": "r", "matchers": ['a="x\\"y"', 'b!~"p|q"']}, "inhibit_rules": [],
              "receivers": [{"name": "r"}]}
    route = alertmanager_config_object(config, "n")["spec"]["route"]
    assert route["matchers"] == [{"name": "a", "value": 'x"y', "matchType": "="},
                                 {"name": "b", "value": "p|q", "matchType": "!~"}]


# --- placeholders and the runbook template --------------------------------------------------------------


def test_placeholder_links_are_warned_about_naming_the_flags(tmp_path, capsys):
    assert _build(tmp_path, "--no-health-alerts") == 0
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert any("runbooks.example.com" in w and "--runbook-url" in w and "--runbook-base-url" in w for w in warnings)
    assert any("grafana.example.com" in w and "--grafana-url" in w for w in warnings)


def test_real_links_build_without_placeholder_warnings(tmp_path, capsys):
    assert _build(tmp_path, *REAL_LINKS, "--no-health-alerts") == 0
    assert "placeholder" not in capsys.readouterr().err


def test_runbook_url_template_fills_alert_and_service_and_promtool_renders_it(tmp_path, promtool):
    assert _build(tmp_path, "--runbook-url", "https://wiki.corp.internal/sre/{{service}}/{{ alert }}?from=llmslo",
                  "--grafana-url", "https://grafana.corp.internal") == 0
    rules = yaml.safe_load((tmp_path / "alerts" / "chat.rules.yaml").read_text())
    urls = {r["alert"]: r["annotations"]["runbook_url"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert urls and all(u == f"https://wiki.corp.internal/sre/chat/{a}?from=llmslo" for a, u in urls.items())
    health = yaml.safe_load((tmp_path / "alerts" / "llmslo-health.rules.yaml").read_text())
    assert all(r["annotations"]["runbook_url"] == f"https://wiki.corp.internal/sre/llmslo-health/{r['alert']}?from=llmslo"
               for g in health["groups"] for r in g["rules"])
    # the generated promtool tests expect the rendered annotations: Prometheus' templating must agree (the health
    # and capacity alerts' tests check every annotation in seconds; the SLOs' run in tests/slogen/test_promtool.py)
    tests = [str(tmp_path / "alerts" / f) for f in ("llmslo-health.test.yaml", "llmslo-capacity.test.yaml")]
    proc = subprocess.run([promtool, "test", "rules", *tests], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path / "alerts")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_the_longest_dashboard_file_name_still_makes_a_valid_distinct_configmap():
    """validate admits an SLO id whose dashboard file name is 255 bytes; a ConfigMap's name and key take 253."""
    stems = ["slo-" + "s" * 233 + "-availability", "slo-" + "s" * 233 + "-availabilitx"]
    objs = [dashboard_configmap(f"dashboards/{s}.json", "{}", KubeOptions()) for s in stems]
    names = [o["metadata"]["name"] for o in objs]
    keys = [next(iter(o["data"])) for o in objs]
    assert all(len(f"{s}.json") == 255 for s in stems)
    assert all(subdomain_problem(n) is None for n in names) and len(set(names)) == 2
    assert all(len(k) <= 253 and k.endswith(".json") for k in keys) and len(set(keys)) == 2
