"""The HPA v2 + prometheus-adapter alternative: valid Kubernetes objects that scale on exactly what KEDA would."""

from __future__ import annotations

import subprocess
from decimal import Decimal

import kubernetes_validate
import pytest
import yaml

from slogen.artifacts import hpa, keda
from slogen.autoscaling import load_text
from tests.artifacts.test_keda import SPEC

K8S_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())


@pytest.fixture
def generated(sample_slos) -> tuple[list[dict], list[dict], list[dict]]:
    """(HPAs, adapter rules, KEDA ScaledObjects) from the same spec and SLOs."""
    pools = load_text(SPEC, "autoscaling/pools.yaml").pools
    files = hpa.hpa_files(pools, sample_slos)
    assert set(files) == {hpa.HPAS, hpa.ADAPTER_RULES}
    hpas = [o for o in yaml.safe_load_all(files[hpa.HPAS]) if o]
    rules = yaml.safe_load(files[hpa.ADAPTER_RULES])["externalRules"]
    scaled = [o for o in yaml.safe_load_all(keda.keda_files(pools, sample_slos)[keda.OUTPUT]) if o]
    return hpas, rules, scaled


def parse_quantity(text: str) -> Decimal:
    return Decimal(text[:-1]) / 1000 if text.endswith("m") else Decimal(text)


def test_hpas_validate_strictly_against_the_kubernetes_schema(generated):
    hpas, _, _ = generated
    assert [o["metadata"]["name"] for o in hpas] == ["sglang-batch", "vllm-llama-3-8b"]
    for obj in hpas:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    typo = yaml.safe_load(yaml.safe_dump(hpas[0]))
    typo["spec"]["metrics"][0]["external"]["target"]["averageValues"] = "4"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSIONS[-1], strict=True)


def test_every_hpa_metric_is_served_by_one_adapter_rule_with_kedas_query_and_target(generated):
    hpas, rules, scaled = generated
    by_name = {r["name"]["as"]: r for r in rules}
    assert len(by_name) == len(rules), "external metric names are unique across pools"
    # The wake trigger takes a pool from zero replicas; an HPA never goes below one, so it has no use for it.
    keda_triggers = {(o["metadata"]["name"], t["name"]): t for o in scaled for t in o["spec"]["triggers"]
                     if t["name"] != keda.TRIGGER_WAKE}
    assert sum(len(o["spec"]["metrics"]) for o in hpas) == len(rules) == len(keda_triggers)
    for obj in hpas:
        pool = obj["metadata"]["name"]
        for metric in obj["spec"]["metrics"]:
            name = metric["external"]["metric"]["name"]
            trigger = next(t for (p, t_name), t in keda_triggers.items()
                           if p == pool and name.endswith(t_name.replace("-", "_")))
            rule = by_name[name]
            assert rule["metricsQuery"] == trigger["metadata"]["query"]
            assert rule["resources"] == {"namespaced": False}, "the query names the pool's labels itself"
            target = metric["external"]["target"]
            assert target["type"] == trigger["metricType"]
            value = target["averageValue"] if target["type"] == "AverageValue" else target["value"]
            assert parse_quantity(value) == Decimal(trigger["metadata"]["threshold"])


def test_behaviour_matches_keda_and_the_minimum_is_at_least_one(generated):
    hpas, _, scaled = generated
    for h, s in zip(hpas, scaled, strict=True):
        assert h["spec"]["behavior"] == s["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert h["spec"]["maxReplicas"] == s["spec"]["maxReplicaCount"]
        assert h["spec"]["minReplicas"] == max(1, s["spec"]["minReplicaCount"])
    assert hpas[0]["spec"]["minReplicas"] == 1, "sglang-batch asks for 0: an HPA cannot scale to zero"


@pytest.mark.parametrize("value, text", [(4, "4"), (16.0, "16"), (0.85, "850m"), (2.5, "2500m"), (0.1, "100m")])
def test_quantities(value, text):
    assert hpa.quantity(value) == text


def test_adapter_queries_are_valid_promql(generated, tmp_path, promtool):
    _, rules, _ = generated
    doc = {"groups": [{"name": "adapter", "rules": [
        {"record": f"adapter:check_{i}:{part}", "expr": rule[key]}
        for i, rule in enumerate(rules) for part, key in (("series", "seriesQuery"), ("value", "metricsQuery"))]}]}
    path = tmp_path / "adapter.rules.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_pools_no_files():
    assert hpa.hpa_files([], []) == {}
