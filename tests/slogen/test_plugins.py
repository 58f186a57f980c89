"""Built-in LLM SLIs: names from conventions only, le matching, class/model handling, option errors."""

from __future__ import annotations

import re

import pytest

from llmslo import conventions as c
from slogen.plugins import sli_plugin
from slogen.plugins.contract import PluginError, SLIPluginRequest
from slogen.plugins.llm import le_regex


def resolve(pid: str, **options):
    return sli_plugin(pid)(SLIPluginRequest("chat", "x", "chat-x", 99.0, {}, options))


METRIC_RE = re.compile(r"\b((?:llm|slo)[a-z_:]*[a-z_])\{")


def test_queries_use_only_convention_names():
    known = set(c.by_name()) | {m.bucket() for m in c.ALL_METRICS} | {m.count() for m in c.ALL_METRICS} | {c.SLO.KV_SATURATED}
    slis = [
        resolve("llmslo/latency", metric="ttft", threshold="0.5", slo_class="interactive"),
        resolve("llmslo/latency", metric="itl", threshold="0.02", source="engine", models="llama-*",
                selector='{engine="sglang"}'),
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
    engine = resolve("llmslo/latency", metric="ttft", threshold="0.5", source="engine", models="llama-3-8b,chat-*",
                     selector='{engine="vllm"}')
    assert 'model=~"llama-3-8b|chat-.*"' in engine.total_query
    tap = resolve("llmslo/goodput", slo_class="interactive", ttft="0.5", tpot="0.05", models="chat-*")
    assert "model" not in tap.total_query and 'slo_class="interactive"' in tap.total_query
    avail = resolve("llmslo/availability", source="tap")
    assert 'outcome!~"client_disconnected|client_error"' in avail.total_query


def outcome_set(query: str, op: str) -> set[str]:
    """The outcomes one `outcome<op>"a|b"` matcher of `query` names (exactly one such matcher)."""
    (alternatives,) = re.findall(rf'{c.LABEL_OUTCOME}{re.escape(op)}"([^"]*)"', query)
    return set(alternatives.split("|"))


def test_tap_outcome_sets_come_from_the_conventions():
    """Availability's bad set, goodput's and availability's neutral set are conventions' own: an outcome
    added there (a hang's upstream_timeout) is counted without touching the plugins."""
    avail = resolve("llmslo/availability", source="tap", slo_class="interactive")
    assert outcome_set(avail.error_query, "=~") == set(c.TAP_BAD_OUTCOMES)
    assert outcome_set(avail.total_query, "!~") == set(c.TAP_NEUTRAL_OUTCOMES)
    goodput = resolve("llmslo/goodput", slo_class="interactive", ttft="0.5", tpot="0.05")
    assert outcome_set(goodput.total_query, "!~") == set(c.TAP_NEUTRAL_OUTCOMES)
    assert set(c.TAP_LATE_OUTCOMES) <= set(c.TAP_BAD_OUTCOMES)  # so goodput's total counts a hang
    assert not set(c.TAP_BAD_OUTCOMES) & set(c.TAP_NEUTRAL_OUTCOMES)


@pytest.mark.parametrize("options,matchers", [
    ({"metric": "ttft", "threshold": "0.5", "slo_class": "interactive"}, 'slo_class="interactive"'),
    ({"metric": "tpot", "threshold": "0.05", "models": "llama-*", "selector": '{namespace="llm"}', "by": "cluster,region"},
     'namespace="llm",model=~"llama-.*"'),
])
def test_tap_latency_counts_late_requests_as_too_slow(options, matchers):
    """A hung engine completes nothing, so the histograms see nothing: the late outcomes, with the
    SLI's own matchers and `by`, are added to both error and total, and guarded against absence."""
    sli = resolve("llmslo/latency", **options)
    by = ", ".join(sli.by)
    late = (f'sum by ({by}) (rate({c.TAP_REQUESTS.name}{{{matchers},{c.LABEL_OUTCOME}=~"'
            f'{"|".join(c.TAP_LATE_OUTCOMES)}"}}[{{{{.window}}}}]))')
    count = sli.total_query.split("\n")[0]
    for query in (sli.error_query, sli.total_query):
        # late is 0 where the tap has not created its series yet; a group with late requests only stays
        assert f"({late}\nor\n0 * {count})" in query and query.endswith(f"\nor\n{late}")
    assert outcome_set(late, "=~") == set(c.TAP_LATE_OUTCOMES)
    assert {f.incident for f in sli.fixtures if f.role == "late"} == set(c.TAP_LATE_OUTCOMES)


def test_engine_latency_has_no_late_term():
    """The engine cannot see a hang (it never finishes the request); its query stays count - bucket."""
    sli = resolve("llmslo/latency", metric="ttft", threshold="0.5", source="engine", selector='{engine="vllm"}')
    assert c.TAP_REQUESTS.name not in sli.error_query + sli.total_query
    assert sli.error_query == f"{sli.total_query}\n-\n" + sli.error_query.split("\n-\n")[1]
    assert not [f for f in sli.fixtures if f.role == "late"]


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
