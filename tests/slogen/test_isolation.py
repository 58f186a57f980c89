"""The inference pool's isolation alerts: declared in llmslo.yaml, generated with the health rules, staged by promtool.

The generated promtool tests are the must-show (a training pod landing on the pool pages once; a serving pod does
not; the pod leaving clears it; the mapping down does not fire); these tests also check that they could fail: the
same staged series against rules without the `pod!=""` guard or the serving exception fire where they must not.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from llmslo import conventions as c
from llmslo.durations import MINUTE
from slogen.build import BuildOptions
from slogen.catalog import compile_catalog
from slogen.errors import SpecErrors
from slogen.poolisolation import Isolation
from slogen.rules.health import HealthOptions
from slogen.rules.options import GenOptions
from slogen.settings import InstallSettings, load, render
from slogen.steps import health_rules, runbooks

REPO = Path(__file__).resolve().parents[2]
RULES = f"alerts/{c.HEALTH.GROUP}.rules.yaml"
TESTS = f"alerts/{c.HEALTH.GROUP}.test.yaml"
H = c.HEALTH


def catalog_for(isolation: Isolation | None, health: HealthOptions | None = None, namespace: str = ""):
    install = InstallSettings(inference_namespaces=("llm",), isolation=isolation)
    options = BuildOptions(inputs=(str(REPO / "slos"),), gen=GenOptions(runbook_base_url="https://x.example.org/rb"),
                           health=health or HealthOptions(), install=install)
    if namespace:
        from slogen.k8smeta import KubeOptions

        options = BuildOptions(**{**options.__dict__, "kube": KubeOptions(namespace=namespace)})
    return compile_catalog(options)


def rules_of(files: dict[str, str]) -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(files[RULES])["groups"] for r in g["rules"]}


def run_promtool(promtool: str, files: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    for rel in (RULES, TESTS):
        (tmp_path / Path(rel).name).write_text(files[rel])
    return subprocess.run([promtool, "test", "rules", Path(TESTS).name], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


POOL = Isolation("inference", "llmslo.io/node-pool", ("llm",), ("vllm-llama-3-8b",))


def test_no_declaration_no_isolation_alerts():
    alerts = {a.rule.alert for a in catalog_for(None).health_alerts}
    assert alerts == set(H.ALERTS)


def test_the_declared_pool_and_serving_pods_reach_the_rules():
    rules = rules_of(dict(health_rules(catalog_for(POOL)).files))
    foreign, off = rules[H.POOL_FOREIGN_POD], rules[H.POOL_SERVING_OFF_POOL]
    assert foreign["labels"]["severity"] == "critical" and foreign["for"] == "10m"
    assert off["labels"]["severity"] == "warning" and off["for"] == "30m"
    assert 'node_pool="inference"' in foreign["expr"] and 'node_pool!="inference"' in off["expr"]
    assert 'namespace=~"llm"' in foreign["expr"] and 'pod=~"vllm-llama-3-8b-.+"' in foreign["expr"]
    assert 'pod!=""' in foreign["expr"]  # an idle GPU, or one whose mapping is down, has no holder
    assert "count by (cluster, hostname, namespace, pod)" in foreign["expr"]  # once per pod and node
    assert "llmslo.io/node-pool=inference" in foreign["annotations"]["description"]


def test_generated_promtool_tests_pass(promtool, tmp_path):
    files = dict(health_rules(catalog_for(POOL)).files)
    doc = yaml.safe_load(files[TESTS])
    names = [t["name"].split(":")[0] for t in doc["tests"]]
    assert names == [*H.ALERTS, *H.ISOLATION_ALERTS]
    proc = run_promtool(promtool, files, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_staged_tests_pin_one_page_that_clears():
    files = dict(health_rules(catalog_for(POOL)).files)
    test = next(t for t in yaml.safe_load(files[TESTS])["tests"] if t["name"].startswith(H.POOL_FOREIGN_POD))
    checks = [(ch["eval_time"], len(ch["exp_alerts"])) for ch in test["alert_rule_test"]]
    assert checks == [("4m", 0), ("14m", 0), ("15m", 1), ("20m", 1), ("21m", 0)]
    fired = test["alert_rule_test"][2]["exp_alerts"][0]["exp_labels"]
    assert (fired["pod"], fired["hostname"], fired["severity"]) == ("llm-finetune-0", "gpu-node-a", "critical")


SERVING = 'llm_gpu_memory_total_bytes{namespace=~"llm", pod=~"vllm-llama-3-8b-.+"}'
MUTATIONS = {  # the foreign-pod rule comes first in the file: the first occurrence is its
    "no holder guard": ('llm_gpu_memory_total_bytes{pod!=""} unless', "llm_gpu_memory_total_bytes unless"),
    "no serving exception": (f"unless {SERVING}", 'unless llm_gpu_memory_total_bytes{namespace="none"}'),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_the_staged_tests_fail_rules_that_would_page_a_healthy_pool(promtool, tmp_path, mutation):
    """Without the holder guard, the idle GPU and the unmapped one page; without the serving exception, the
    serving pod does: the generated tests catch both."""
    files = dict(health_rules(catalog_for(POOL)).files)
    old, new = MUTATIONS[mutation]
    rules = files[RULES].replace(old, new, 1)
    assert rules != files[RULES]
    proc = run_promtool(promtool, {**files, RULES: rules}, tmp_path)
    assert proc.returncode != 0 and H.POOL_FOREIGN_POD in proc.stdout + proc.stderr


def test_a_pool_no_exporter_says_is_unwatched_and_the_staged_tests_catch_a_rule_without_the_mapping_arm(
        promtool, tmp_path):
    """The absent arm (no exporter says the pool: its DaemonSet missing or not told its pool) fires with the pool's
    label after `for`, and clears when one says it; without the mapping arm, the generated tests fail."""
    files = dict(health_rules(catalog_for(POOL)).files)
    unwatched = rules_of(files)[H.POOL_UNWATCHED]
    assert unwatched["labels"]["severity"] == "warning" and unwatched["for"] == "30m"
    info = c.EXPORTER_NODE_POOL_INFO.name
    test = {"rule_files": [Path(RULES).name], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": f'{info}{{hostname="gpu-node-a", node_pool="inference"}}', "values": "_x40 1x20"}],
        "alert_rule_test": [
            {"eval_time": "29m", "alertname": H.POOL_UNWATCHED, "exp_alerts": []},
            {"eval_time": "31m", "alertname": H.POOL_UNWATCHED, "exp_alerts": [{
                "exp_labels": {**unwatched["labels"], "node_pool": "inference"},
                "exp_annotations": unwatched["annotations"]}]},
            {"eval_time": "45m", "alertname": H.POOL_UNWATCHED, "exp_alerts": []}]}]}
    proc = run_promtool(promtool, {**files, TESTS: yaml.safe_dump(test, sort_keys=False)}, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    no_mapping_arm = files[RULES].replace(f"{c.EXPORTER_GPU_POD_MAPPING_UP.name} == 0", "vector(0) == 1", 1)
    assert no_mapping_arm != files[RULES]
    proc = run_promtool(promtool, {**files, RULES: no_mapping_arm}, tmp_path)
    assert proc.returncode != 0 and H.POOL_UNWATCHED in proc.stdout + proc.stderr


def test_thresholds_and_a_scoped_build_follow(promtool, tmp_path):
    health = HealthOptions(pool_foreign_pod_for=5 * MINUTE, serving_off_pool_for=15 * MINUTE)
    files = dict(health_rules(catalog_for(POOL, health, namespace="monitoring")).files)
    rules = rules_of(files)
    assert rules[H.POOL_FOREIGN_POD]["for"] == "5m" and rules[H.POOL_SERVING_OFF_POOL]["for"] == "15m"
    assert rules[H.POOL_FOREIGN_POD]["labels"]["namespace"] == "monitoring"  # routed by the AlertmanagerConfig
    proc = run_promtool(promtool, files, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_pod_of_the_serving_namespaces_serves_when_no_workload_is_named(promtool, tmp_path):
    files = dict(health_rules(catalog_for(Isolation("gpu-serving", serving_namespaces=("llm", "chat")))).files)
    assert 'pod=~' not in rules_of(files)[H.POOL_FOREIGN_POD]["expr"]
    proc = run_promtool(promtool, files, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_runbooks_for_the_isolation_alerts():
    built = dict(runbooks(catalog_for(POOL)).files)
    foreign = built[f"docs/runbooks/{H.POOL_FOREIGN_POD}.md"]
    off = built[f"docs/runbooks/{H.POOL_SERVING_OFF_POOL}.md"]
    for text in (foreign, off):
        assert "kubectl taint nodes" in text and "RuntimeClass" in text and "nodeSelector" in text
        assert "get pod \"$POD\" -o wide" in text and c.EXPORTER_NODE_POOL_INFO.name in text
    assert "operator: Exists" in foreign and "pod_resources" not in foreign
    unwatched = built[f"docs/runbooks/{H.POOL_UNWATCHED}.md"]
    assert c.EXPORTER_GPU_POD_MAPPING_UP.name in unwatched and "get daemonset" in unwatched


# ------------------------------------------------------------------------------------------ llmslo.yaml


def settings_file(tmp_path: Path, isolation: str, inference: str = "[llm]") -> Path:
    path = tmp_path / "llmslo.yaml"
    path.write_text(f"version: llmslo/install/v1\ninferenceNamespaces: {inference}\nisolation: {isolation}\n"
                    f"image: ghcr.io/llmslo/llmslo@sha256:{'a' * 64}\n")
    return path


def test_the_settings_declare_it_and_default_to_the_inference_namespaces(tmp_path):
    s = load(settings_file(tmp_path, "{pool: inference, servingWorkloads: [vllm-llama-3-8b]}"))
    assert s.isolation == Isolation("inference", "llmslo.io/node-pool", ("llm",), ("vllm-llama-3-8b",))
    again = tmp_path / "again.yaml"
    again.write_text(render(s))
    assert load(again).isolation == s.isolation


@pytest.mark.parametrize(("isolation", "inference", "field", "words"), [
    ("{}", "[llm]", "isolation.pool", "missing"),
    ("{pool: 'bad value'}", "[llm]", "isolation.pool", "letters, digits"),
    ("{pool: inference, nodeLabel: 'a b'}", "[llm]", "isolation.nodeLabel", "not a label key"),
    ("{pool: inference}", "[]", "isolation.servingNamespaces", "no serving namespace"),
    ("{pool: inference, servingNamespaces: [Bad_NS]}", "[llm]", "isolation.servingNamespaces", "Bad_NS"),
    ("{pool: inference, servingWorkloads: ['vllm-.*']}", "[llm]", "isolation.servingWorkloads", "vllm-.*"),
    ("{pool: inference, servingPods: [x]}", "[llm]", "isolation.servingPods", "unknown key"),
    ("inference", "[llm]", "isolation", "expected a mapping"),
    ("{pool: inference, otherPools: [training, inference]}", "[llm]", "isolation.otherPools", "not among them"),
    ("{pool: inference, otherPools: ['']}", "[llm]", "isolation.otherPools", "is empty"),
])
def test_a_bad_declaration_is_refused_naming_the_field(tmp_path, isolation, inference, field, words):
    with pytest.raises(SpecErrors) as info:
        load(settings_file(tmp_path, isolation, inference))
    problems = [(e.field, str(e)) for e in info.value.errors]
    assert any(f == field and words in text for f, text in problems), problems
