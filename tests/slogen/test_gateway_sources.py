"""Gateways as SLI sources (issue 37, part 1): llm-d, Envoy AI Gateway and Dynamo, each read on its own series.

Real promtool: the generated tests of each example spec (docs/examples/gateways/) pass; a page written as each
gateway writes it (the upstream names, labels and `le` spelling) loaded into a promtool test gives the error
ratio worked out by hand, with the cases that could hide an outage or page a healthy service: llm-d's deprecated
twins (dual-emitted, never added), a request refused before llm-d counted it, an outage where every request is
refused, client faults and cancellations left out, non-streamed requests out of llm-d's TTFT.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from llmslo import gateways as gw
from llmslo.gofloat import go_g
from slogen.promtests.slo_tests import service_tests
from slogen.rules import generate
from slogen.rules.options import GenOptions
from slogen.writers import rule_file
from slogen.yamlio import dump
from tests.helpers.specs import load_path, slo_entry, sloth_spec

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples" / "gateways"


def _run(promtool: str, cwd: Path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, "test", "rules", name], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("source", gw.GATEWAY_SOURCES)
def test_generated_tests_of_each_gateway_example_pass_promtool(promtool, tmp_path, source):
    spec = EXAMPLES / f"{source}.yaml"
    results = generate(load_path(spec), GenOptions())
    assert {r.slo.sli.params.source for r in results} == {source}
    (tmp_path / "r.rules.yaml").write_text(rule_file([g for r in results for g in r.rules.groups()]))
    doc, skipped = service_tests(results, "r.rules.yaml")
    assert not skipped and doc is not None
    # the staged series are the gateway's own: its family names and its model label, never our llm_* names
    staged = {s["series"] for t in doc["tests"] for s in t["input_series"]}
    gateway = gw.GATEWAYS[source]
    assert all(f'{gateway.model_label}="' in s for s in staged if not s.startswith(("slo:", "up{")))
    assert not any(re.match(r"llm_(?!d_epp_)", s) for s in staged)  # llm-d's own prefix is llm_d_epp_
    buckets = [s for s in staged if "_bucket{" in s]
    assert buckets and all(not re.search(r'le="\d+\.0"', s) for s in buckets)  # Go and Rust write 1, not 1.0
    (tmp_path / "r.test.yaml").write_text(dump(doc))
    proc = _run(promtool, tmp_path, "r.test.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


# ------------------------------------------------------------------ pages as each gateway writes them


def _page(lines: list[tuple[str, str, dict[str, str], float]]) -> str:
    """An exposition page: (family, sample suffix, labels, value) per line, labels in the order given."""
    out = []
    for family, suffix, labels, value in lines:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        out.append(f"{family}{suffix}{{{text}}} {go_g(value)}")
    return "\n".join(out) + "\n"


def _series(page: str, minutes: int = 20) -> list[dict]:
    """Each page line as a promtool counter growing by its value every minute from 0."""
    out = []
    for line in page.splitlines():
        series, _, value = line.rpartition(" ")
        out.append({"series": series, "values": f"0+{value}x{minutes}"})
    return out


def _ratio_test(promtool: str, tmp_path: Path, spec_text: str, page: str, expected: dict[str, float]) -> None:
    """The SLO's 5m error ratio per cluster, evaluated by promtool over the page's series."""
    (tmp_path / "svc.yaml").write_text(spec_text)
    results = generate(load_path(tmp_path / "svc.yaml"), GenOptions())
    (tmp_path / "r.yaml").write_text(rule_file([g for r in results for g in r.rules.groups()]))
    slo_id = results[0].slo.id
    labels = 'cluster="{}", sloth_id="%s", sloth_service="svc", sloth_slo="%s", sloth_window="5m"' % (
        slo_id, results[0].slo.name)
    doc = {"rule_files": ["r.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": _series(page),
        "promql_expr_test": [{"expr": f'round(slo:sli_error:ratio_rate5m{{sloth_id="{slo_id}"}}, 0.001)',
                              "eval_time": "10m",
                              "exp_samples": [{"labels": "{" + labels.format(k) + "}", "value": v}
                                              for k, v in sorted(expected.items())]}]}]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = _run(promtool, tmp_path, "t.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _spec(sli_options: str) -> str:
    plugin = "llmslo/latency" if "metric" in sli_options else "llmslo/availability"
    return sloth_spec("svc", slo_entry("gw", 99, f'{{plugin: {{id: "{plugin}", options: {sli_options}}}}}',
                                       alerting="{page_alert: {disable: true}, ticket_alert: {disable: true}}"))


def _llmd(cluster: str, **extra: str) -> dict[str, str]:
    # llm-d's label order (modelLabelsWithFairnessPriority), then the cluster Prometheus adds
    return {gw.LLMD.LABEL_MODEL: "llama-3-8b", gw.LLMD.LABEL_TARGET_MODEL: "llama-3-8b-lora",
            gw.LLMD.LABEL_FAIRNESS_ID: "default-flow", gw.LLMD.LABEL_PRIORITY: "0", **extra, "cluster": cluster}


def test_llmd_availability_counts_refused_requests_and_never_its_deprecated_twins(promtool, tmp_path):
    L = gw.LLMD
    lines = []
    for cluster in ("a", "refusing"):
        # every request also counted under the deprecated inference_objective_* names (dual emission)
        twin = {k: v for k, v in _llmd(cluster).items() if k not in (L.LABEL_FAIRNESS_ID,)}
        scheduled = 100 if cluster == "a" else 0
        if scheduled:
            lines += [(L.REQUESTS, "", _llmd(cluster), scheduled),
                      ("inference_objective_request_total", "", twin, scheduled),
                      (L.ERRORS, "", _llmd(cluster, error_code="ModelServerError"), 5)]  # scheduled, then failed
        lines += [(L.ERRORS, "", _llmd(cluster, error_code="ResourceExhausted"), 10 if scheduled else 50),  # refused
                  (L.ERRORS, "", _llmd(cluster, error_code="BadRequest"), 20),  # the client's fault: neither
                  ("inference_objective_request_error_total", "",
                   {k: v for k, v in _llmd(cluster, error_code="ResourceExhausted").items()
                    if k not in (L.LABEL_FAIRNESS_ID, L.LABEL_PRIORITY)}, 10 if scheduled else 50)]
    page = _page(lines)
    assert "llm_d_epp_request_error_total{model_name=\"llama-3-8b\",target_model_name=" in page
    # a: (5 failed + 10 refused) / (100 scheduled + 10 refused); refusing: every request refused, ratio 1 (not 0/0)
    _ratio_test(promtool, tmp_path, _spec('{source: "llm-d", models: "llama-3-*"}'), page,
                {"a": round(15 / 110, 3), "refusing": 1})


def test_llmd_ttft_reads_streamed_requests_only(promtool, tmp_path):
    L = gw.LLMD
    page = _page([
        (L.TTFT, "_bucket", _llmd("a", streaming="true", le="0.4"), 90),
        (L.TTFT, "_bucket", _llmd("a", streaming="true", le="+Inf"), 100),
        (L.TTFT, "_count", _llmd("a", streaming="true"), 100),
        # non-streamed: TTFT is the whole request (llm_d_router_metrics.go), all slower than 0.4 s; left out
        (L.TTFT, "_bucket", _llmd("a", streaming="false", le="0.4"), 0),
        (L.TTFT, "_count", _llmd("a", streaming="false"), 100),
    ])
    _ratio_test(promtool, tmp_path, _spec('{source: "llm-d", metric: "ttft", threshold: "0.4"}'), page, {"a": 0.1})


def test_envoy_ai_gateway_page_as_the_gateway_writes_it(promtool, tmp_path):
    """The label set of envoyproxy/ai-gateway cmd/extproc/mainlib/admin_test.go's page (c217da8): the GenAI
    attributes with `_` for `.`, the OTel scope labels, error_type only on a failed request."""
    def labels(cluster: str, **extra: str) -> dict[str, str]:
        return {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "openai",
                "gen_ai_request_model": "qwen2.5:0.5b", "gen_ai_response_model": "qwen2.5:0.5b", **extra,
                "otel_scope_name": "envoyproxy/ai-gateway", "otel_scope_schema_url": "", "otel_scope_version": "",
                "cluster": cluster}
    duration = "gen_ai_server_request_duration_seconds"
    page = _page([(duration, "_count", labels("a"), 95), (duration, "_count", labels("a", error_type="_OTHER"), 5),
                  (duration, "_bucket", labels("a", le="5.12"), 90)])
    page = page.replace('otel_scope_schema_url="",', "")  # Prometheus drops empty labels when it scrapes
    page = page.replace('otel_scope_version="",', "")
    _ratio_test(promtool, tmp_path, _spec('{source: "envoy-ai-gateway", models: "qwen*"}'), page, {"a": 0.05})
    ttft = "gen_ai_server_time_to_first_token_seconds"
    page = _page([(ttft, "_bucket", labels("a", le="0.5"), 80), (ttft, "_bucket", labels("a", le="60"), 100),
                  (ttft, "_count", labels("a"), 100)]).replace('otel_scope_schema_url="",', "").replace(
                      'otel_scope_version="",', "")
    _ratio_test(promtool, tmp_path, _spec('{source: "envoy-ai-gateway", metric: "ttft", threshold: "0.5"}'), page,
                {"a": 0.2})


def test_dynamo_page_leaves_client_faults_out_and_reads_older_releases(promtool, tmp_path):
    D = gw.DYNAMO

    def labels(cluster: str, status: str, error_type: str | None) -> dict[str, str]:
        out = {"model": "deepseek-r1", "endpoint": "chat_completions", "request_type": "stream", "status": status}
        if error_type is not None:
            out["error_type"] = error_type
        return {**out, "cluster": cluster}
    page = _page([
        (D.REQUESTS, "", labels("new", "success", None), 90),  # error_type="" on success: no label once scraped
        (D.REQUESTS, "", labels("new", "error", "internal"), 6),
        (D.REQUESTS, "", labels("new", "error", "overload"), 4),
        (D.REQUESTS, "", labels("new", "error", "cancelled"), 50),  # the client left: neither good nor bad
        (D.REQUESTS, "", labels("new", "error", "validation"), 30),
        # a release before the error_type label: every error counts
        (D.REQUESTS, "", labels("old", "success", None), 80),
        (D.REQUESTS, "", labels("old", "error", None), 20),
    ])
    _ratio_test(promtool, tmp_path, _spec('{source: "dynamo", models: "deepseek-*"}'), page,
                {"new": 0.1, "old": 0.2})


def test_gateway_slo_dashboards_read_the_gateways_series_and_prove_their_numbers(promtool, tmp_path):
    """`slogen build` of the examples: each SLO's source panel queries its gateway's own families (never the
    exporter's llm_* or the tap's), and the dashboards' generated tests (synthetic gateway series) pass promtool."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "slogen.cli", "build", str(EXAMPLES), "--out", str(out),
                           "--no-autoscaling", "--no-health-alerts", "--no-capacity-rules", "--no-promtool-check"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    seen = set()
    for path in sorted((out / "dashboards").glob("slo-*.json")):
        doc = yaml.safe_load(path.read_text())
        exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", []) if "slo:" not in t["expr"]
                 and "ALERTS" not in t["expr"]]
        assert exprs, path.name
        source = {"llmd": gw.SOURCE_LLMD, "envoy": gw.SOURCE_ENVOY, "dynamo": gw.SOURCE_DYNAMO}[path.name.split("-")[1]]
        prefix = {gw.SOURCE_LLMD: gw.LLMD.PREFIX, gw.SOURCE_ENVOY: "gen_ai_", gw.SOURCE_DYNAMO: gw.DYNAMO.PREFIX}[source]
        assert all(prefix in e and not re.search(r"\bllm_(?!d_epp_)", e) for e in exprs), (path.name, exprs)
        seen.add(source)
    assert seen == set(gw.GATEWAY_SOURCES)
    ttft = yaml.safe_load((out / "dashboards" / "slo-llmd-chat-ttft.json").read_text())
    assert any('streaming="true"' in t["expr"] for p in ttft["panels"] for t in p.get("targets", []))
    proc = _run(promtool, out / "dashboards", "dashboards.test.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
