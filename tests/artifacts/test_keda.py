"""KEDA ScaledObjects: valid against KEDA's CRD, string metadata, one-sample queries, no flapping."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from llmslo import conventions as c
from slogen.artifacts import keda
from slogen.autoscaling import AutoscalingError, load_paths, load_text
from tests.helpers.promql_names import metric_names
from tests.helpers.specs import documented_pool, one_pool

# The documented example's first pool (its queue and KV triggers), a burn-rate trigger, and a pool that scales to zero.
SPEC = "\n" + documented_pool(through="kv_cache_utilization") + """\
      ttft_burn_rate: {slo: chat/ttft, above: 2}
  - name: sglang-batch
    namespace: batch
    target: {kind: StatefulSet, name: sglang}
    replicas: {min: 0, max: 3}
    match: {namespace: batch}
    authentication_ref: prometheus-bearer
    triggers:
      queue_depth: {per_replica: 16}
    wake: {metric: nginx_ingress_controller_requests, selector: {exported_namespace: batch, ingress: sglang}}
    scale_down: {stabilization: 15m, max_pods: 2, period: 10m}
"""


@pytest.fixture
def objects(sample_slos) -> list[dict]:
    files = keda.keda_files(load_text(SPEC, "autoscaling/pools.yaml").pools, sample_slos)
    return [o for o in yaml.safe_load_all(files[keda.OUTPUT]) if o]


def triggers(objects) -> list[dict]:
    return [t for o in objects for t in o["spec"]["triggers"]]


def test_scaled_objects_validate_against_kedas_crd(objects, crd):
    assert [o["metadata"]["name"] for o in objects] == ["sglang-batch", "vllm-llama-3-8b"]
    for obj in objects:
        assert crd.crd_errors(obj) == [], obj["metadata"]["name"]


def test_crd_check_rejects_unknown_and_mistyped_fields(objects, crd):
    typo = {**objects[0], "spec": {**objects[0]["spec"], "scaleTargetRefs": {"name": "x"}}}
    assert any("scaleTargetRefs" in e for e in crd.crd_errors(typo))
    number = yaml.safe_load(yaml.safe_dump(objects[1]))
    number["spec"]["triggers"][0]["metadata"]["threshold"] = 4
    assert any("threshold" in e for e in crd.crd_errors(number))


def test_metadata_values_are_strings(objects):
    for t in triggers(objects):
        assert t["metadata"] and all(isinstance(v, str) for v in t["metadata"].values()), t["name"]


def test_queries_return_one_sample_and_zero_when_empty(objects):
    for t in triggers(objects):
        query = t["metadata"]["query"]
        assert re.match(r"^\((sum|max)\(", query), query  # one aggregate over everything: one sample
        assert " by (" not in query and " without (" not in query, query
        assert query.endswith(" or vector(0)"), query


def test_trigger_shapes(objects):
    by_name = {(o["metadata"]["name"], t["name"]): t for o in objects for t in o["spec"]["triggers"]}
    queue = by_name[("vllm-llama-3-8b", keda.TRIGGER_QUEUE)]
    assert queue["metricType"] == "AverageValue" and queue["metadata"]["threshold"] == "4"
    assert metric_names(queue["metadata"]["query"]) == {c.REQUESTS_WAITING.name}
    assert 'namespace="llm"' in queue["metadata"]["query"] and 'model="llama-3-8b"' in queue["metadata"]["query"]
    kv = by_name[("vllm-llama-3-8b", keda.TRIGGER_KV)]
    assert kv["metricType"] == "AverageValue" and kv["metadata"]["threshold"] == "0.85"
    assert metric_names(kv["metadata"]["query"]) == {c.KV_CACHE_USAGE.name}
    burn = by_name[("vllm-llama-3-8b", keda.TRIGGER_BURN)]
    assert burn["metricType"] == "Value" and burn["metadata"]["threshold"] == "2"
    assert metric_names(burn["metadata"]["query"]) == {c.SLO.sli_error_ratio("5m")}
    assert f'{c.SLO.LABEL_ID}="chat-ttft"' in burn["metadata"]["query"]
    assert burn["metadata"]["query"].count("/ 0.01") == 1  # divided by the SLO's budget: a burn rate
    secured = by_name[("sglang-batch", keda.TRIGGER_QUEUE)]
    assert secured["authenticationRef"] == {"name": "prometheus-bearer"}
    assert secured["metadata"]["authModes"] == "bearer"


def test_behaviour_damps_flapping(objects):
    for obj in objects:
        spec = obj["spec"]
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        down, up = behavior["scaleDown"], behavior["scaleUp"]
        assert down["stabilizationWindowSeconds"] >= 300 and down["selectPolicy"] == "Min"
        assert all(p["type"] == "Pods" for p in down["policies"])  # a percent would round to 0 on small pools
        assert up["stabilizationWindowSeconds"] >= 30 and up["selectPolicy"] == "Max"
        assert spec["pollingInterval"] <= 30 and spec["cooldownPeriod"] >= 300
    batch = next(o for o in objects if o["metadata"]["name"] == "sglang-batch")
    down = batch["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    assert down == {"stabilizationWindowSeconds": 900, "selectPolicy": "Min",
                    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 600}]}


def test_queries_evaluate_to_exactly_one_sample_in_prometheus(objects, promtool, tmp_path):
    """promtool evaluates every query against synthetic series: summed, NaN dropped, 0 when absent."""
    by_name = {t["name"]: t["metadata"]["query"] for t in objects[1]["spec"]["triggers"]}
    ratio = c.SLO.sli_error_ratio("5m")
    series_busy = [
        {"series": f'{c.REQUESTS_WAITING.name}{{namespace="llm",model="llama-3-8b",pod="a"}}', "values": "3x5"},
        {"series": f'{c.REQUESTS_WAITING.name}{{namespace="llm",model="llama-3-8b",pod="b"}}', "values": "5x5"},
        {"series": f'{c.REQUESTS_WAITING.name}{{namespace="other",model="llama-3-8b",pod="c"}}', "values": "100x5"},
        {"series": f'{c.KV_CACHE_USAGE.name}{{namespace="llm",model="llama-3-8b",pod="a"}}', "values": "0.5x5"},
        {"series": f'{c.KV_CACHE_USAGE.name}{{namespace="llm",model="llama-3-8b",pod="b"}}', "values": "0.75x5"},
        {"series": f'{ratio}{{sloth_id="chat-ttft",sloth_window="5m",cluster="a"}}', "values": "0.03x5"},
        {"series": f'{ratio}{{sloth_id="chat-ttft",sloth_window="5m",cluster="b"}}', "values": "NaN NaN NaN NaN NaN"},
    ]
    busy = [
        (by_name[keda.TRIGGER_QUEUE], 8), (by_name[keda.TRIGGER_KV], 1.25), (by_name[keda.TRIGGER_BURN], 3),
    ]
    idle = [(q, 0) for q, _ in busy]
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": series_busy,
         "promql_expr_test": [{"expr": q, "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": v}]}
                              for q, v in busy]},
        {"interval": "1m", "input_series": [{"series": 'unrelated{a="b"}', "values": "1x5"}],
         "promql_expr_test": [{"expr": q, "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": v}]}
                              for q, v in idle]},
        # No traffic at all: the ratio is 0/0 = NaN everywhere; the HPA must see 0, not NaN.
        {"interval": "1m", "input_series": [series_busy[-1]],
         "promql_expr_test": [{"expr": by_name[keda.TRIGGER_BURN], "eval_time": "2m",
                               "exp_samples": [{"labels": "{}", "value": 0}]}]},
    ]}
    path = tmp_path / "keda_test.yaml"
    path.write_text(yaml.safe_dump(tests))
    proc = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_empty_spec_writes_nothing(sample_slos):
    assert keda.keda_files([], sample_slos) == {}


@pytest.mark.parametrize("change, field, words, line", [
    # Found when building against the SLOs: the line is the `slo:` field's too (issue 29: it was the pool's).
    ("ttft_burn_rate: {slo: chat/nope, above: 2}", "ttft_burn_rate.slo", "no SLO 'chat/nope'", 10),
    ("ttft_burn_rate: {slo: chat/tpot, above: 2}", "ttft_burn_rate.slo", "not a TTFT latency SLO", 10),
    # Found when loading: the line is the field's.
    ("ttft_burn_rate: {slo: chat/ttft, above: 2, window: 1h}", "ttft_burn_rate.window", "not a short window", 10),
    ("queue_depth: {per_replica: \"4\"}", "queue_depth.per_replica", "expected a number", 10),
    ("queue_dept: {per_replica: 4}", "triggers.queue_dept", "did you mean 'queue_depth'", 10),
    ("kv_cache_utilization: {per_replica: 85}", "kv_cache_utilization.per_replica", "between 0.05 and 1", 10),
])
def test_bad_specs_name_file_line_field_and_fix(sample_slos, change, field, words, line):
    text = "\n" + one_pool(change)
    with pytest.raises(AutoscalingError) as err:
        keda.keda_files(load_text(text, "autoscaling/bad.yaml").pools, sample_slos)
    message = str(err.value)
    assert message.startswith(f"autoscaling/bad.yaml:{line}: field pools[0].") and field in message, message
    assert words in message and "(fix: " in message, message


def test_duplicate_pools_across_files_are_rejected(tmp_path):
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text(SPEC)
    with pytest.raises(AutoscalingError, match="already defined"):
        load_paths([tmp_path])


def test_repository_autoscaling_specs_load():
    root = Path(__file__).resolve().parents[2]
    spec = load_paths([root / "autoscaling"])
    assert spec.pools, "autoscaling/ holds the example pool"


def test_burn_rate_trigger_narrows_to_the_pools_cluster_when_the_slo_keeps_it(sample_slos):
    """Against a fleet-wide Prometheus (Thanos, Mimir), a pool must scale on its own cluster's burn."""
    import dataclasses

    spec = SPEC.replace("match: {namespace: llm, model: llama-3-8b}", "match: {cluster: eu-1, namespace: llm, model: llama-3-8b}")
    pools = load_text(spec, "autoscaling/pools.yaml").pools

    def burn_query(slos) -> str:
        objects = [o for o in yaml.safe_load_all(keda.keda_files(pools, slos)[keda.OUTPUT]) if o]
        return next(t for o in objects for t in o["spec"]["triggers"] if t["name"] == keda.TRIGGER_BURN)["metadata"]["query"]

    split = burn_query([dataclasses.replace(s, by=("cluster",)) for s in sample_slos])
    assert 'cluster="eu-1"' in split and "namespace" not in split and "model" not in split, split
    assert "cluster" not in burn_query(sample_slos), "an SLO recorded without cluster cannot be narrowed by it"


SEATS_SPEC = "\n" + documented_pool(through="queue_depth") + "      kv_seats: {min_free: 8}\n"


def test_kv_seats_trigger_beside_queue_depth_in_keda_and_hpa(promtool, tmp_path, crd):
    """Seats wanted over the pool's recorded p99 seats, a `Value` with target 1: 8 wanted, 4 free -> 2 (double);
    none free -> 80 (as fast as scale_up allows); no seats series (no capacity rules, no traffic) -> 0."""
    from slogen.artifacts import hpa

    pools = load_text(SEATS_SPEC, "autoscaling/pools.yaml").pools
    objects = [o for o in yaml.safe_load_all(keda.keda_files(pools, [])[keda.OUTPUT]) if o]
    assert crd.crd_errors(objects[0]) == []
    trig = {t["name"]: t for t in objects[0]["spec"]["triggers"]}
    assert set(trig) == {keda.TRIGGER_QUEUE, keda.TRIGGER_SEATS}
    seats = trig[keda.TRIGGER_SEATS]
    assert seats["metricType"] == "Value" and seats["metadata"]["threshold"] == "1"
    assert metric_names(seats["metadata"]["query"]) == {c.CAPACITY.SEATS_P99}
    files = hpa.hpa_files(pools, [])
    hpas = [o for o in yaml.safe_load_all(files[hpa.HPAS]) if o]
    targets = {m["external"]["metric"]["name"]: m["external"]["target"] for m in hpas[0]["spec"]["metrics"]}
    assert targets["llmslo_llm_vllm_llama_3_8b_kv_seats"] == {"type": "Value", "value": "1"}
    query = seats["metadata"]["query"]
    s = c.CAPACITY.SEATS_P99
    series = [{"series": f'{s}{{namespace="llm",model="llama-3-8b",pod="a"}}', "values": "1.5x5"},
              {"series": f'{s}{{namespace="llm",model="llama-3-8b",pod="b"}}', "values": "2.5x5"},
              {"series": f'{s}{{namespace="other",model="llama-3-8b",pod="c"}}', "values": "100x5"}]
    full = [{"series": f'{s}{{namespace="llm",model="llama-3-8b",pod="a"}}', "values": "0x5"}]
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": inputs,
         "promql_expr_test": [{"expr": query, "eval_time": "2m", "exp_samples": [{"labels": "{}", "value": v}]}]}
        for inputs, v in ((series, 2), (full, 80), ([{"series": 'unrelated{a="b"}', "values": "1x5"}], 0))]}
    path = tmp_path / "seats_test.yaml"
    path.write_text(yaml.safe_dump(tests))
    proc = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_kv_seats_trigger_refuses_a_node_match():
    spec = SEATS_SPEC.replace("match: {namespace: llm, model: llama-3-8b}", "match: {namespace: llm, node: gpu-1}")
    with pytest.raises(AutoscalingError) as err:
        load_text(spec, "autoscaling/pools.yaml")
    assert "node" in str(err.value) and "namespace and model" in str(err.value)


# ----------------------------------------------------------------------------------------
# Scale to zero: a pool at min 0 wakes only on a signal that exists without replicas.
# ----------------------------------------------------------------------------------------
ZERO = """
version: "llmslo/autoscaling/v1"
pools:
  - name: p
    namespace: llm
    target: {{name: d}}
    replicas: {{min: 0, max: 4}}
    match: {{namespace: llm, model: m}}
    triggers:
      queue_depth: {{per_replica: 4}}
{wake}"""


def test_min_zero_without_a_wake_signal_is_refused_naming_file_field_and_fix():
    with pytest.raises(AutoscalingError) as err:
        load_text(ZERO.format(wake=""), "autoscaling/zero.yaml")
    message = str(err.value)
    assert message.startswith("autoscaling/zero.yaml:7: field pools[0].replicas.min: 0 replicas"), message
    assert "could never wake" in message and "(fix: set min: 1, or" in message and "wake: {metric:" in message


@pytest.mark.parametrize("wake, field, words", [
    ("wake: {metric: llm_tap_requests_total, selector: {namespace: llm}}", "wake.metric", "pool's own pods"),
    ("wake: {query: 'sum(rate(vllm:request_success_total[1m]))'}", "wake.query", "'vllm:request_success_total'"),
    ("wake: {query: 'sum(rate(llm_tap_time_to_first_token_seconds_count[1m]))'}", "wake.query", "pool's own pods"),
    ("wake: {metric: nginx_ingress_controller_requests}", "wake.selector", "missing"),
    ("wake: {metric: gw_requests_total, selector: {}}", "wake.selector", "empty"),
    ("wake: {metric: gw_requests_total, selector: {route: r}, window: 1h}", "wake.window", "not a short window"),
    ("wake: {metric: gw_requests_total, query: 'sum(x)'}", "wake", "exactly one of query and metric"),
    ("wake: {}", "wake", "exactly one of query and metric"),
    ("wake: {query: 'sum(x)', selector: {a: b}}", "wake.selector", "goes with metric"),
])
def test_a_wake_signal_the_pool_itself_writes_is_refused(wake, field, words):
    with pytest.raises(AutoscalingError) as err:
        load_text(ZERO.format(wake="    " + wake + "\n"), "autoscaling/zero.yaml")
    message = str(err.value)
    assert f"pools[0].{field}" in message and words in message and "(fix: " in message, message


def test_a_label_value_that_looks_like_an_engine_metric_is_not_refused():
    wake = """    wake: {query: 'sum(rate(envoy_cluster_upstream_rq_total{envoy_cluster_name="llm_pool"}[1m]))'}\n"""
    (pool,) = load_text(ZERO.format(wake=wake), "autoscaling/zero.yaml").pools
    assert pool.wake is not None and "llm_pool" in pool.wake.query


def test_wake_trigger_wakes_on_any_request_and_validates(objects, crd):
    batch = next(o for o in objects if o["metadata"]["name"] == "sglang-batch")
    assert batch["spec"]["minReplicaCount"] == 0
    wake = next(t for t in batch["spec"]["triggers"] if t["name"] == keda.TRIGGER_WAKE)
    meta = wake["metadata"]
    assert meta["query"] == ('(sum(rate(nginx_ingress_controller_requests{exported_namespace="batch", ingress="sglang"}'
                             '[1m]))) or vector(0)')
    assert meta["activationThreshold"] == "0"  # the first request wakes the pool
    assert float(meta["threshold"]) == keda.WAKE_ONLY_THRESHOLD  # and only wakes it: the engine triggers size it
    assert wake["authenticationRef"] == {"name": "prometheus-bearer"}  # the same Prometheus, the same credentials
    assert crd.crd_errors(batch) == []
    spec = ZERO.format(wake="    wake: {query: 'sum(rate(gw_requests_total{route=\"p\"}[2m]))', per_replica: 5}\n")
    (obj,) = [o for o in yaml.safe_load_all(keda.keda_files(load_text(spec, "z.yaml").pools, [])[keda.OUTPUT]) if o]
    wake = next(t for t in obj["spec"]["triggers"] if t["name"] == keda.TRIGGER_WAKE)
    assert wake["metadata"]["query"] == '(sum(sum(rate(gw_requests_total{route="p"}[2m])))) or vector(0)'
    assert wake["metadata"]["threshold"] == "5" and wake["metricType"] == "AverageValue"


def test_wake_query_reads_the_gateway_at_zero_replicas(objects, promtool, tmp_path):
    """With no engine series at all (zero replicas), the wake query sees the gateway's requests; with none, 0."""
    batch = next(o for o in objects if o["metadata"]["name"] == "sglang-batch")
    query = next(t for t in batch["spec"]["triggers"] if t["name"] == keda.TRIGGER_WAKE)["metadata"]["query"]
    gateway = [
        {"series": 'nginx_ingress_controller_requests{exported_namespace="batch",ingress="sglang",status="503"}',
         "values": "0+60x10"},  # one request a second, answered 503: nothing behind the ingress yet
        {"series": 'nginx_ingress_controller_requests{exported_namespace="chat",ingress="vllm",status="200"}',
         "values": "0+600x10"},  # another pool's traffic must not wake this one
    ]
    tests = {"rule_files": [], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": gateway,
         "promql_expr_test": [{"expr": query, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 1}]}]},
        {"interval": "1m", "input_series": gateway[1:],
         "promql_expr_test": [{"expr": query, "eval_time": "5m", "exp_samples": [{"labels": "{}", "value": 0}]}]},
    ]}
    path = tmp_path / "wake_test.yaml"
    path.write_text(yaml.safe_dump(tests))
    proc = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
