"""The `llmslo/*` contract for gateway sources: what each gateway measures, its bucket edges as read upstream, and
the refusals that name the fix (an off-edge threshold, an option of another source, goodput from a gateway)."""

from __future__ import annotations

import pytest

from llmslo import bucket_edges as be
from llmslo import gateways as gw
from llmslo import genai
from llmslo import sli_plugins as sp
from llmslo.plugin_errors import PluginOptionError


def latency(source: str, metric: str, threshold: str, **extra: str) -> sp.LatencyParams:
    params = sp.read_options(sp.LATENCY, {"source": source, "metric": metric, "threshold": threshold, **extra})
    assert isinstance(params, sp.LatencyParams)
    return params


def refusal(plugin: str, options: dict) -> PluginOptionError:
    with pytest.raises(PluginOptionError) as e:
        sp.read_options(plugin, options)
    return e.value


def test_every_gateway_is_a_source_of_latency_and_availability():
    assert set(gw.GATEWAY_SOURCES) == {"llm-d", "envoy-ai-gateway", "dynamo"} and set(gw.GATEWAY_SOURCES) < set(sp.SOURCES)
    for source in gw.GATEWAY_SOURCES:
        a = sp.read_options(sp.AVAILABILITY, {"source": source, "models": "m*"})
        assert isinstance(a, sp.AvailabilityParams) and a.source == source and a.selection.models == ("m*",)


@pytest.mark.parametrize(("source", "measured"), [
    ("llm-d", {"ttft", "tpot", "itl", "e2e"}), ("envoy-ai-gateway", {"ttft", "tpot", "e2e"}),
    ("dynamo", {"ttft", "itl", "e2e"})])
def test_each_gateway_measures_what_its_histograms_hold(source, measured):
    row = be.gateway_rows(source, current=True)[0]
    assert set(row.edges) == measured == set(gw.GATEWAYS[source].latency)
    for metric in measured:
        edge = next(e for e in row.edges[metric] if e >= 0.01)
        p = sp.read_options(sp.LATENCY, {"source": source, "metric": metric, "threshold": be.edge_text(edge)},
                            allow_out_of_range=True)
        assert isinstance(p, sp.LatencyParams) and p.threshold == edge and not p.rounded
    for metric in set(sp.LATENCY_METRICS) - measured:
        e = refusal(sp.LATENCY, {"source": source, "metric": metric, "threshold": "0.5"})
        assert e.option == "metric" and f"source {source}" in str(e) and ", ".join(gw.GATEWAYS[source].latency) in e.fix


def test_an_off_edge_threshold_is_refused_with_the_nearest_edges_and_rounding_measures_one():
    e = refusal(sp.LATENCY, {"source": "llm-d", "metric": "ttft", "threshold": "0.5"})
    assert "0.4 < 0.5 < 0.6" in str(e) and "write threshold 0.4 or 0.6" in e.fix and 'threshold_rounding: "up"' in e.fix
    p = latency("llm-d", "ttft", "0.5", threshold_rounding="up")
    assert (p.threshold, p.threshold_written, p.rounded) == (0.6, 0.5, True)
    assert latency("llm-d", "ttft", "0.5", threshold_rounding="down").threshold == 0.4
    # declared buckets replace the table's edges; a kind name has no place in a gateway's buckets
    assert latency("llm-d", "ttft", "0.5", buckets="0.25, 0.5, 1").threshold == 0.5
    assert refusal(sp.LATENCY, {"source": "llm-d", "metric": "ttft", "threshold": "0.5",
                                "buckets": "vllm: 0.5"}).option == "buckets"


def test_a_threshold_only_an_older_release_has_is_refused_with_its_edges_to_declare():
    # Envoy AI Gateway before 0.5 stopped TTFT at 10 s; 30 s is an edge of the current ladder only: accepted
    assert latency("envoy-ai-gateway", "ttft", "30").threshold == 30
    # Dynamo's ITL ladder changed in #14839: 0.3 is an edge of the old one only
    e = refusal(sp.LATENCY, {"source": "dynamo", "metric": "itl", "threshold": "0.3"})
    assert "0.21 < 0.3 < 0.38" in str(e) and "before #14839" in e.fix and "buckets: \"0.0019, 0.0035" in e.fix


@pytest.mark.parametrize(("plugin", "options", "option"), [
    (sp.LATENCY, {"source": "llm-d", "metric": "ttft", "threshold": "1", "slo_class": "x"}, "slo_class"),
    (sp.LATENCY, {"source": "dynamo", "metric": "ttft", "threshold": "1", "engine_versions": "vllm>=0.11"},
     "engine_versions"),
    (sp.AVAILABILITY, {"source": "envoy-ai-gateway", "slo_class": "x"}, "slo_class"),
    (sp.AVAILABILITY, {"source": "llm-d", "error_reasons": "abort"}, "error_reasons"),
    (sp.AVAILABILITY, {"source": "dynamo", "models": "DeepSeek-*"}, "models"),
])
def test_options_of_another_source_are_refused_with_the_fix(plugin, options, option):
    e = refusal(plugin, options)
    assert e.option == option and e.fix


def test_goodput_from_a_gateway_is_refused_saying_why_the_tap_measures_it():
    e = refusal(sp.GOODPUT, {"slo_class": "interactive", "ttft": "0.5", "tpot": "0.05", "source": "llm-d"})
    assert e.option == "source" and "TTFT and TPOT judged together" in str(e)
    assert "tap" in e.fix and "llmslo/latency" in e.fix


def test_the_edges_are_the_upstream_ones():
    # llm-d-router llm_d_router_metrics.go @ ebab687: TTFT and streaming TPOT lists; duration: generalLatencyBuckets
    llmd = be.gateway_rows("llm-d", current=True)[0].edges
    assert llmd["ttft"][:4] == (0.005, 0.025, 0.05, 0.1) and llmd["ttft"][-2:] == (60.0, 120.0)
    assert llmd["tpot"][:2] == (0.0005, 0.00205) and llmd["e2e"][-1] == 3600.0 and len(llmd["e2e"]) == 35
    # Envoy AI Gateway: the convention's lists, TTFT to 60 s (llmslo/genai.py)
    assert be.gateway_rows("envoy-ai-gateway", "ttft", current=True)[0].edges["ttft"] == genai.TTFT_EDGES
    # Dynamo: generate_log_buckets reproduced, checked against the edges PR #14839 lists for (0.001, 80, 20)
    assert be.dynamo_log_buckets(0.001, 80.0, 20) == (
        0.0, 0.0018, 0.0033, 0.0059, 0.011, 0.02, 0.035, 0.064, 0.12, 0.21, 0.38, 0.69, 1.2, 2.3, 4.1, 7.4, 13.0, 24.0,
        44.0, 80.0)
    assert be.dynamo_log_buckets(1.0, 512.0, 10) == (0.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 130.0, 260.0, 510.0)
    assert all(r.source for r in be.GATEWAY_ROWS)


def test_rules_never_read_llmd_deprecated_twins():
    names = {h.family for g in gw.GATEWAYS.values() for h in g.latency.values()}
    names |= {c.metric for g in gw.GATEWAYS.values() for c in (g.availability.bad, *g.availability.total)}
    assert not any(n.startswith(gw.LLMD.LEGACY_PREFIX) for n in names)
