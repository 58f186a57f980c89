"""Built-in LLM SLIs: names from conventions only, le matching, class/model handling, option errors."""

from __future__ import annotations

import re

import pytest

from llmslo import conventions as c
from slogen.plugins import PluginError, SLIPluginRequest, sli_plugin
from slogen.plugins.llm import le_regex


def resolve(pid: str, **options):
    return sli_plugin(pid)(SLIPluginRequest("chat", "x", "chat-x", 99.0, {}, options))


METRIC_RE = re.compile(r"\b((?:llm|slo)[a-z_:]*[a-z_])\{")


def test_queries_use_only_convention_names():
    known = set(c.by_name()) | {m.bucket() for m in c.ALL_METRICS} | {m.count() for m in c.ALL_METRICS} | {c.SLO.KV_SATURATED}
    slis = [
        resolve("llmslo/latency", metric="ttft", threshold="0.5", slo_class="interactive"),
        resolve("llmslo/latency", metric="itl", threshold="0.02", source="engine", models="llama-*"),
        resolve("llmslo/goodput", slo_class="batch", ttft="5", tpot="0.15"),
        resolve("llmslo/availability", source="engine"),
        resolve("llmslo/availability", slo_class="interactive"),
        resolve("llmslo/kv-headroom", threshold="0.85"),
    ]
    for sli in slis:
        names = set(METRIC_RE.findall(sli.error_query + sli.total_query + "".join(sli.sources)))
        assert names and names <= known, names - known
        assert "sum by (cluster)" in sli.total_query and "{{.window}}" in sli.total_query
        assert sli.fixtures and sli.sources


def test_le_regex_matches_both_spellings():
    for threshold, good, bad in (("1", ["1", "1.0", "1.00"], ["10", "0.1", "1.5"]),
                                 ("0.5", ["0.5", "0.50"], ["0.05", "5", "0.51"]),
                                 ("2.5", ["2.5"], ["25", "2.55"])):
        rx = re.compile(le_regex(float(threshold)))
        assert all(rx.fullmatch(v) for v in good) and not any(rx.fullmatch(v) for v in bad)
    sli = resolve("llmslo/latency", metric="ttft", threshold="1", slo_class="interactive")
    assert 'le=~"1(\\\\.0*)?"' in sli.error_query


def test_models_filter_engine_series_but_not_tap_classes():
    engine = resolve("llmslo/latency", metric="ttft", threshold="0.5", source="engine", models="llama-3-8b,chat-*")
    assert 'model=~"llama-3-8b|chat-.*"' in engine.total_query
    tap = resolve("llmslo/goodput", slo_class="interactive", ttft="0.5", tpot="0.05", models="chat-*")
    assert "model" not in tap.total_query and 'slo_class="interactive"' in tap.total_query
    avail = resolve("llmslo/availability", source="tap")
    assert 'outcome!~"client_disconnected|client_error"' in avail.total_query
    assert 'outcome=~"upstream_error|aborted"' in avail.error_query


def test_kv_headroom_is_time_based_events_from_an_aux_rule():
    sli = resolve("llmslo/kv-headroom", threshold="0.9", selector='{namespace="llm"}')
    (aux,) = sli.aux_rules
    assert aux.record == c.SLO.KV_SATURATED and aux.expr == 'llm_kv_cache_usage_ratio{namespace="llm"} > bool 0.9'
    assert "sum_over_time" in sli.error_query and "count_over_time" in sli.total_query


@pytest.mark.parametrize("pid,options,option", [
    ("llmslo/latency", {"metric": "ttfx", "threshold": "1"}, "metric"),
    ("llmslo/latency", {"metric": "ttft", "threshold": "fast"}, "threshold"),
    ("llmslo/latency", {"metric": "itl", "threshold": "0.1"}, "source"),
    ("llmslo/latency", {"metric": "ttft", "threshold": "1", "source": "engine", "slo_class": "x"}, "slo_class"),
    ("llmslo/goodput", {"ttft": "1", "tpot": "1"}, "slo_class"),
    ("llmslo/availability", {"source": "engine", "error_reasons": "oops"}, "error_reasons"),
    ("llmslo/kv-headroom", {"threshold": "1.5"}, "threshold"),
    ("llmslo/kv-headroom", {"selector": "namespace=llm"}, "selector"),
    ("llmslo/kv-headroom", {"by": "not a label"}, "by"),
])
def test_bad_options_name_the_option(pid, options, option):
    with pytest.raises(PluginError) as e:
        resolve(pid, **options)
    assert e.value.option == option and e.value.fix
