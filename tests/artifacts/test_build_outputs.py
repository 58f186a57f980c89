"""The artifact generators inside the real `slogen build` chain, on a small repository of specs.

These tests tie the artifacts to the rules actually generated: every alert has a runbook its
`runbook_url` points at, every `slo:` series a dashboard, runbook or ScaledObject reads is a
recorded rule, the PrometheusRule passes its CRD, and the tap accepts the ConfigMap it mounts.
"""

from __future__ import annotations

import json
import posixpath
import re

import pytest
import yaml

from llmslo import conventions as c
from slogen.artifacts.deploy import CONFIG_HASH_ANNOTATION, KUSTOMIZATION, TAP_SLO_CONFIG
from slogen.artifacts.keda import OUTPUT as KEDA_OUTPUT
from slogen.build import BuildOptions
from slogen.build import build as slogen_build
from slogen.paths import prometheus_rule_path
from slogen.rules.options import GenOptions
from slogen.steps import STEPS, pairs
from tests.helpers.dashboards import iter_queries
from tests.helpers.promql_names import metric_names

BASE_URL = "https://git.example.com/llm/blob/main"

SPEC = """
version: "prometheus/v1"
service: "chat"
labels: {team: inference}
slos:
  - name: "ttft-interactive"
    objective: 99
    description: "First token within 500 ms."
    sli:
      plugin:
        id: "llmslo/latency"
        options: {metric: "ttft", threshold: "0.5", source: "tap", slo_class: "interactive"}
    alerting:
      name: ChatTTFTBudgetBurn
      page_alert: {labels: {team: inference}}
      ticket_alert: {labels: {team: inference}}
  - name: "tpot"
    objective: 99
    sli:
      plugin:
        id: "llmslo/latency"
        options: {metric: "tpot", threshold: "0.05", source: "engine", selector: '{engine="vllm"}'}
    alerting: {name: ChatTPOTBudgetBurn, page_alert: {}, ticket_alert: {}}
  - name: "goodput-interactive"
    objective: 95
    sli:
      plugin:
        id: "llmslo/goodput"
        options: {slo_class: "interactive", ttft: "0.5", tpot: "0.05"}
    alerting: {name: ChatGoodputBudgetBurn, page_alert: {}, ticket_alert: {}}
  - name: "availability"
    objective: 99.9
    sli: {plugin: {id: "llmslo/availability", options: {source: "tap"}}}
    alerting: {name: ChatAvailabilityBudgetBurn, page_alert: {}, ticket_alert: {disable: true}}
  - name: "kv-headroom"
    objective: 99
    sli: {plugin: {id: "llmslo/kv-headroom", options: {threshold: "0.95"}}}
    alerting: {name: ChatKVSaturation, page_alert: {disable: true}, ticket_alert: {}}
"""

POOLS = """
version: "llmslo/autoscaling/v1"
pools:
  - name: vllm-llama-3-8b
    namespace: llm
    target: {name: vllm-llama-3-8b}
    replicas: {min: 1, max: 8}
    match: {namespace: llm, model: llama-3-8b}
    triggers:
      queue_depth: {per_replica: 4}
      ttft_burn_rate: {slo: chat/ttft-interactive, above: 2}
"""


@pytest.fixture(scope="module", params=[False, True], ids=["traffic-weighted", "sloth-compat"])
def build(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    (root / "slos").mkdir()
    (root / "slos" / "chat.yaml").write_text(SPEC)
    (root / "autoscaling").mkdir()
    (root / "autoscaling" / "pools.yaml").write_text(POOLS)
    options = BuildOptions(inputs=(str(root / "slos"),),
                           gen=GenOptions(sloth_compat=request.param, runbook_base_url=BASE_URL))
    built = slogen_build(options)
    catalog, files = built.catalog, built.files
    return (root, options, catalog), catalog.results, files


def recorded(results) -> set[str]:
    return {r.record for res in results for g in res.rules.groups() for r in g.rules if r.record}


def alerts(results):
    return [r for res in results for g in res.rules.groups() for r in g.rules if r.alert]


def generated_alerts(files: dict[str, str]) -> list[dict]:
    """Every alerting rule in every generated rule file (the SLO services' and the health alerts')."""
    return [rule for path, text in files.items() if path.startswith("alerts/") and path.endswith(".rules.yaml")
            for group in yaml.safe_load(text)["groups"] for rule in group["rules"] if "alert" in rule]


def test_every_alert_has_a_runbook_and_its_url_resolves_to_it(build):
    root, results, files = build
    rules = generated_alerts(files)
    names = {r["alert"] for r in rules}
    assert {r.alert for r in alerts(results)} | set(c.HEALTH.ALERTS) | set(c.CAPACITY.ALERTS) == names
    compat = results[0].ctx.opts.sloth_compat
    for rule in rules:
        path = f"docs/runbooks/{rule['alert']}.md"
        # --sloth-compat reproduces Sloth's annotations, which have no runbook_url; the health alerts always do
        if not compat or rule["alert"] in (*c.HEALTH.ALERTS, *c.CAPACITY.ALERTS):
            url = rule["annotations"]["runbook_url"]
            assert url.startswith(BASE_URL + "/"), url
            assert url.removeprefix(BASE_URL + "/") == path
        assert path in files, path
        assert files[path].startswith(f"# {rule['alert']}\n")
    runbooks = {p for p in files if p.startswith("docs/runbooks/")}
    assert runbooks == {f"docs/runbooks/{name}.md" for name in names}  # and no orphans


def test_runbook_topics_follow_the_sli(build):
    _, results, files = build
    assert "--enable-chunked-prefill" in files["docs/runbooks/ChatTTFTBudgetBurn.md"]
    assert "--max-num-seqs" in files["docs/runbooks/ChatTPOTBudgetBurn.md"]
    assert c.GOODPUT_REQUESTS.name in files["docs/runbooks/ChatGoodputBudgetBurn.md"]
    assert "seats" in files["docs/runbooks/ChatKVSaturation.md"]
    assert "seats" in files[f"docs/runbooks/{c.HEALTH.KV_CACHE_SATURATED}.md"]
    assert "XID" in files[f"docs/runbooks/{c.HEALTH.GPU_LOST}.md"]
    if not results[0].ctx.opts.sloth_compat:  # Sloth has no no-data alert
        assert "Prometheus has no samples" in files["docs/runbooks/ChatTTFTBudgetBurnNoData.md"]


def test_slo_series_read_by_artifacts_are_recorded_rules(build):
    _, results, files = build
    records = recorded(results)
    reads: dict[str, set[str]] = {}
    for path, text in files.items():
        if path.endswith(".json"):
            for _, expr in iter_queries(json.loads(text)):
                reads.setdefault(path, set()).update(metric_names(expr))
        elif path.startswith("docs/runbooks/"):
            for block in re.findall(r"```promql\n(.*?)```", text, re.DOTALL):
                for line in block.splitlines():
                    if line.strip():
                        reads.setdefault(path, set()).update(metric_names(line.split("   #")[0]))
        elif path == KEDA_OUTPUT:
            for obj in yaml.safe_load_all(text):
                for trigger in (obj or {}).get("spec", {}).get("triggers", []):
                    reads.setdefault(path, set()).update(metric_names(trigger["metadata"]["query"]))
    from slogen.rules.capacity import CapacityOptions, recording_rules

    exported = {c.PROM_ALERTS} | {r.record for r in recording_rules(CapacityOptions())}  # llmslo-capacity's records
    for m in c.ALL_METRICS:
        exported |= {m.bucket(), m.count(), m.sum()} if m.kind == "histogram" else {m.name}
    for path, names in reads.items():
        assert names <= records | exported, (path, sorted(names - records - exported))
    assert any(n.startswith("slo:") for n in reads[KEDA_OUTPUT])


def test_dashboards_cover_every_slo(build):
    _, results, files = build
    for res in results:
        path = f"dashboards/slo-{res.slo.id}.json"
        dash = json.loads(files[path])
        assert res.slo.id in dash["title"] or res.slo.name in dash["title"]


def test_prometheus_rule_validates_and_carries_every_group(build, crd):
    _, results, files = build
    obj = next(d for d in yaml.safe_load_all(files[prometheus_rule_path("chat")]) if d)
    assert crd.crd_errors(obj) == []
    names = {g["name"] for g in obj["spec"]["groups"]}
    assert names == {g.name for res in results for g in res.rules.groups()}
    health = next(d for d in yaml.safe_load_all(files[prometheus_rule_path(c.HEALTH.GROUP)]) if d)
    assert crd.crd_errors(health) == []
    assert [r["alert"] for g in health["spec"]["groups"] for r in g["rules"]] == list(c.HEALTH.ALERTS)
    assert health["spec"]["groups"] == yaml.safe_load(files[f"alerts/{c.HEALTH.GROUP}.rules.yaml"])["groups"]


def test_generated_kustomization_lists_what_was_generated(build):
    _, _, files = build
    kustomization = yaml.safe_load(files[KUSTOMIZATION])
    assert kustomization["resources"] == ["../../dashboards", "alertmanagerconfig.yaml",
                                          "keda/scaledobjects.yaml", "prometheusrule-chat.yaml",
                                          "prometheusrule-llmslo-capacity.yaml", "prometheusrule-llmslo-health.yaml"]
    # a file, or a directory with its own kustomization (../../dashboards: a ConfigMap generated per dashboard)
    assert all(posixpath.normpath(f"deploy/generated/{r}") in files
               or posixpath.normpath(f"deploy/generated/{r}/kustomization.yaml") in files
               for r in kustomization["resources"])
    made = yaml.safe_load(files["dashboards/kustomization.yaml"])["configMapGenerator"]
    dashboards = sorted(p.removeprefix("dashboards/") for p in files if p.startswith("dashboards/") and p.endswith(".json"))
    assert sorted(f for g in made for f in g["files"]) == dashboards  # each dashboard once, read from its file


def test_the_tap_reads_the_configmap_it_mounts(build, tmp_path):
    from exporter.tap.classes import load_slo_config

    _, _, files = build
    cm = yaml.safe_load(files[TAP_SLO_CONFIG])
    for key, text in cm["data"].items():
        (tmp_path / key).write_text(text)
    config = load_slo_config([tmp_path])
    assert "interactive" in {cls.name for cls in config.classes}
    assert 0.5 in config.thresholds["ttft"]
    # The hash the tap reports for these files is the ConfigMap's annotation and the one the drift alert expects.
    assert config.hash and cm["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] == config.hash
    health = yaml.safe_load(files["alerts/llmslo-health.rules.yaml"])
    (drift,) = [r for g in health["groups"] for r in g["rules"] if r.get("alert") == c.HEALTH.TAP_CONFIG_DRIFT]
    assert drift["expr"].strip() == f'{c.TAP_CONFIG_INFO.name}{{{c.LABEL_CONFIG_HASH}!="{config.hash}"}}'


def test_no_health_alerts_option_drops_their_files(build):
    import dataclasses

    from slogen.rules.health import HealthOptions

    (root, options, catalog), _, files = build
    without = dataclasses.replace(options, health=HealthOptions(enabled=False))
    fewer = slogen_build(without).files
    assert set(files) - set(fewer) == {
        f"alerts/{c.HEALTH.GROUP}.rules.yaml", f"alerts/{c.HEALTH.GROUP}.test.yaml",
        prometheus_rule_path(c.HEALTH.GROUP), *(f"docs/runbooks/{n}.md" for n in c.HEALTH.ALERTS)}
    assert "prometheusrule-llmslo-health.yaml" not in fewer[KUSTOMIZATION]


def test_build_is_deterministic(build):
    (root, options, catalog), _, files = build
    again = {p: t for step in STEPS for p, t in pairs(step.run(catalog).files)}
    assert again and all(files[p] == text for p, text in again.items())
    assert KEDA_OUTPUT in again  # autoscaling/ was found next to the input directory
