"""Measurable thresholds (issue #13): an engine-sourced latency threshold must be a bucket edge.

Build time: llmslo/bucket_edges.py is the one table of the engines' latency bucket edges; the
llmslo/latency plugin refuses a `source: engine` threshold that is not an edge of every engine kind
and version its selector may pick, naming the nearest edges and the fixes, or measures the common
edge `threshold_rounding` names. Run time: `<alert>ThresholdNotABucketEdge` fires per cluster and
engine kind where series carrying the SLI's total lack the threshold's bucket; its generated promtool
tests pass, and fail against mutated expressions.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from exporter import adapters
from exporter.config import ENGINE_KINDS as EXPORTER_KINDS
from exporter.promtext import parse_page
from llmslo import bucket_edges as be
from llmslo import conventions as c
from llmslo.sli_plugins import LATENCY_METRICS
from slogen import views
from slogen.build import BuildOptions, build
from slogen.errors import SpecErrors
from slogen.loaders import load_paths
from slogen.paths import rules_path
from slogen.paths import tests_path as service_tests_path
from slogen.plugins import sli_plugin
from slogen.plugins.contract import PluginError, SLIPluginRequest
from slogen.plugins.llm import le_regex
from slogen.rules import generate
from slogen.rules.bucket_alerts import ALERT_SUFFIX, GROUP_PREFIX, TIER
from slogen.rules.options import GenOptions
from slogen.steps import STEPS
from tests.exporter.sample_pages import SAMPLE_PAGES, SHARED_PAGES
from tests.helpers.needs import shared_dir

REPO = Path(__file__).resolve().parents[2]
SPECS = Path(__file__).resolve().parent / "bucket_edges"
SLOGEN = [sys.executable, "-m", "slogen.cli"]


def latency(**options):
    return sli_plugin("llmslo/latency")(SLIPluginRequest("svc", "x", "svc-x", 99.0, {}, options))


def refusal(**options) -> PluginError:
    with pytest.raises(PluginError) as err:
        latency(**options)
    return err.value


# ------------------------------------------------------------------------------ the table


def test_the_table_covers_the_exporters_engine_kinds_and_the_plugins_metrics():
    assert set(c.SERVING_ENGINE_KINDS) == set(EXPORTER_KINDS) - {"tap"}
    assert set(be.LATENCY_METRIC_NAMES) == set(LATENCY_METRICS)
    for row in be.ROWS:
        assert row.kind in c.SERVING_ENGINE_KINDS and row.source
        assert set(row.edges) <= set(be.LATENCY_METRIC_NAMES), row
        for edges in row.edges.values():
            assert list(edges) == sorted(set(edges)) and all(e > 0 for e in edges), row
    assert {r.kind for r in be.ROWS} == set(c.SERVING_ENGINE_KINDS)
    assert c.LABEL_ENGINE == "engine"


# The sample page of each row (../shared/peers/engine-metrics): the exporter, which keeps the engine's
# edges, must write exactly the row's edges for every latency metric, and nothing for one it lacks.
PAGE_ROWS = {
    "vllm-v1.prom": (c.ENGINE_VLLM, ">=0.11"),
    "vllm-v1-0.10-transition.prom": (c.ENGINE_VLLM, "0.10"),
    "vllm-v0-legacy.prom": (c.ENGINE_VLLM, "0.6 (V0)"),
    "sglang.prom": (c.ENGINE_SGLANG, "0.5"),
    "sglang-legacy-docs.prom": (c.ENGINE_SGLANG, "<0.4.6"),
    "tgi.prom": (c.ENGINE_TGI, "v3 router"),
    "triton-trtllm-extended.prom": (c.ENGINE_TRTLLM_TRITON, ""),
    "trtllm-serve.prom": (c.ENGINE_TRTLLM_SERVE, ""),
}
FAMILIES = {be.METRIC_TTFT: c.TTFT, be.METRIC_TPOT: c.TPOT, be.METRIC_ITL: c.ITL, be.METRIC_E2E: c.E2E}


@pytest.mark.parametrize("page", sorted(PAGE_ROWS))
def test_each_row_is_what_the_exporter_writes_for_its_sample_page(page):
    shared_dir(SHARED_PAGES, "engine sample pages")
    kind, versions = PAGE_ROWS[page]
    assert SAMPLE_PAGES[page] == kind
    (row,) = [r for r in be.ROWS if (r.kind, r.versions) == (kind, versions)]
    adapter = adapters.get(kind)
    samples = adapter.adapt(parse_page((SHARED_PAGES / page).read_text(), adapter.wanted).families,
                            {"engine": kind, "pod": "p", "namespace": "n", "node": "x", "model": "m"})
    for metric, family in FAMILIES.items():
        les = {s.labels[c.LABEL_LE] for s in samples if s.metric == family and s.suffix == "_bucket"}
        counts = [s for s in samples if s.metric == family and s.suffix == "_count"]
        if not row.exports(metric):
            assert not les and not counts, (page, metric)
            continue
        assert counts, (page, metric)
        finite = sorted(float(x) for x in les if x != "+Inf")
        assert finite == list(row.edges[metric]), (page, metric)
        # the `le` regex of the SLI matches what the exporter writes for every edge, and only that edge
        for le in les - {"+Inf"}:
            assert [x for x in les if re.fullmatch(le_regex(float(le)), x)] == [le]


def test_every_sample_page_with_latency_histograms_has_a_row():
    assert set(PAGE_ROWS) | {"triton-trtllm.prom"} == set(SAMPLE_PAGES)


# ------------------------------------------------------------------------------ build time


def test_the_issue_case_is_refused_with_nearest_edges_per_engine_and_the_fixes():
    """TTFT 0.3 s over engines whose buckets are 0.25/0.5: exit 0 and no warning before; now refused."""
    e = refusal(metric="ttft", threshold="0.3", source="engine")
    assert e.option == "threshold"
    text = str(e)
    assert "threshold 0.3 s is not a bucket edge of the ttft histogram" in text
    assert "every engine kind, as the selector has no engine matcher" in text
    for kind in ("vllm >=0.11, 0.10, 0.6 (V0): 0.25 < 0.3 < 0.5", "sglang 0.5: 0.2 < 0.3 < 0.4",
                 "sglang <0.4.6: 0.25 < 0.3 < 0.5", "trtllm-triton: 0.1 < 0.3 < 0.5", "trtllm-serve: 0.25 < 0.3 < 0.5"):
        assert kind in text, kind
    assert "tgi" not in text  # TGI has no TTFT histogram: it cannot be blind at any threshold
    assert "write threshold 0.1" in e.fix  # the only TTFT edge every kind and version has
    assert 'threshold_rounding: "down" to measure le=0.1' in e.fix
    assert '"up"' not in e.fix  # no common edge above 0.3: rounding up is not offered


def test_pinning_the_engine_narrows_the_check_to_its_rows():
    e = refusal(metric="ttft", threshold="0.3", source="engine", selector='{engine="vllm"}')
    assert "engine kind vllm, as the selector picks them" in str(e) and "sglang" not in str(e)
    assert "write threshold 0.25 or 0.5" in e.fix
    assert 'threshold_rounding: "down" to measure le=0.25' in e.fix and 'threshold_rounding: "up" to measure le=0.5' in e.fix
    assert "select fewer engine kinds" not in e.fix  # one kind already
    ok = latency(metric="ttft", threshold="0.25", source="engine", selector='{engine="vllm"}')
    assert 'le=~"0\\\\.250*"' in ok.error_query


@pytest.mark.parametrize("selector,kinds", [
    ("", c.SERVING_ENGINE_KINDS),
    ('{engine="sglang"}', (c.ENGINE_SGLANG,)),
    ('{engine!="trtllm-triton"}', (c.ENGINE_VLLM, c.ENGINE_SGLANG, c.ENGINE_TGI, c.ENGINE_TRTLLM_SERVE, c.ENGINE_LLAMACPP)),
    ('{engine=~"vllm|trtllm-.*"}', (c.ENGINE_VLLM, c.ENGINE_TRTLLM_TRITON, c.ENGINE_TRTLLM_SERVE)),
    ('{engine!~"vllm|sglang", namespace="llm"}', (c.ENGINE_TGI, c.ENGINE_TRTLLM_TRITON, c.ENGINE_TRTLLM_SERVE, c.ENGINE_LLAMACPP)),
    ('{engine=~"vllm", engine!="vllm"}', ()),
])
def test_engine_matchers_decide_which_kinds_are_checked(selector, kinds):
    from llmslo.engine_thresholds import engine_kinds
    from llmslo.selectors import parse_selector

    assert engine_kinds(parse_selector(selector)) == kinds


def test_triton_e2e_has_no_finite_edge_so_an_unpinned_e2e_slo_must_exclude_it():
    e = refusal(metric="e2e", threshold="2", source="engine")
    assert "trtllm-triton: no finite edge (count and sum only)" in str(e)
    assert "tgi v3 router: 1.683411219602823 < 2 < 2.5251168294042348" in str(e)
    assert "selector: '{engine=~\"vllm|sglang|trtllm-serve\"}'" in e.fix
    latency(metric="e2e", threshold="2", source="engine", selector='{engine=~"vllm|sglang|trtllm-serve"}')


def test_tgi_edges_are_accepted_as_written_to_the_last_digit():
    edge = be.edge_text(be.rows([c.ENGINE_TGI], be.METRIC_E2E)[0].edges[be.METRIC_E2E][20])
    assert edge == "0.49878850951194753"
    sli = latency(metric="e2e", threshold=edge, source="engine", selector='{engine="tgi"}')
    assert 'le=~"0\\\\.498788509511947530*"' in sli.error_query
    assert "0.49878850951194753 < 0.5 < 0.7481827642679213" in str(
        refusal(metric="e2e", threshold="0.5", source="engine", selector='{engine="tgi"}'))


@pytest.mark.parametrize("options,option,says", [
    ({"selector": '{engine="vlm"}'}, "selector", "pick no engine kind the exporter knows"),
    ({"selector": '{engine="tgi"}'}, "metric", "(tgi) exports a ttft histogram"),
    ({"threshold_rounding": "nearest"}, "threshold_rounding", "not one of down, up"),
    ({"source": "tap", "slo_class": "interactive", "threshold_rounding": "down"}, "threshold_rounding",
     "applies to source: engine or a gateway"),
    ({"threshold_rounding": "up"}, "threshold_rounding", "threshold_rounding: up finds no edge above 0.3"),
])
def test_option_errors(options, option, says):
    e = refusal(**{"metric": "ttft", "threshold": "0.3", "source": "engine", **options})
    assert e.option == option and says in str(e), str(e)


def test_rounding_measures_one_common_edge_and_says_so():
    sli = latency(metric="ttft", threshold="0.3", source="engine", selector='{engine="vllm"}', threshold_rounding="up")
    assert 'le=~"0\\\\.50*"' in sli.error_query and "0\\\\.3" not in sli.error_query
    assert sli.plugin_options["threshold"] == "0.5" and sli.plugin_options["threshold_as_written"] == "0.3"
    assert {f.labels.get(c.LABEL_LE) for f in sli.fixtures} == {None, "0.5"}
    # every kind: the only common TTFT edge is 0.1
    sli = latency(metric="ttft", threshold="0.3", source="engine", threshold_rounding="down")
    assert 'le=~"0\\\\.10*"' in sli.error_query
    # on an edge already, rounding changes nothing
    sli = latency(metric="ttft", threshold="0.5", source="engine", selector='{engine="vllm"}', threshold_rounding="down")
    assert sli.plugin_options == {"metric": "ttft", "threshold": "0.5", "source": "engine",
                                  "selector": '{engine="vllm"}', "threshold_rounding": "down"}


def test_tap_thresholds_are_not_checked():
    """The tap adds every threshold it reads to its edges: 0.3 is fine there."""
    sli = latency(metric="ttft", threshold="0.3", slo_class="interactive")
    assert 'le=~"0\\\\.30*"' in sli.error_query


def test_spec_files_off_edge_refused_rounded_and_on_edge_accepted():
    with pytest.raises(SpecErrors) as err:
        load_paths([str(SPECS / "off-edge.yaml")])
    (e,) = err.value.errors
    assert e.file.endswith("off-edge.yaml") and e.line == 11 and e.slo == "edges-ttft-off-edge"
    assert e.field == "slos[0].sli.plugin.options.threshold"
    assert "0.25 < 0.3 < 0.5" in e.message and "threshold_rounding" in e.fix
    loaded = load_paths([str(SPECS / "on-edge.yaml"), str(SPECS / "rounded.yaml")])
    (on_edge, rounded) = loaded.slos
    assert on_edge.sli.plugin_options["threshold"] == "0.5" and "threshold_as_written" not in on_edge.sli.plugin_options
    assert rounded.sli.plugin_options["threshold"] == "0.25"
    assert 'le=~"0\\\\.250*"' in rounded.sli.error_query


def test_slogen_validate_exits_1_with_the_message(tmp_path):
    run = subprocess.run([*SLOGEN, "validate", str(SPECS / "off-edge.yaml")], capture_output=True, text=True,
                         cwd=REPO)
    assert run.returncode == 1
    assert "off-edge.yaml:11: SLO 'edges-ttft-off-edge': field slos[0].sli.plugin.options.threshold" in run.stderr
    assert "sglang 0.5: 0.2 < 0.3 < 0.4" in run.stderr
    ok = subprocess.run([*SLOGEN, "validate", str(SPECS / "on-edge.yaml"), str(SPECS / "rounded.yaml")],
                        capture_output=True, text=True, cwd=REPO)
    assert ok.returncode == 0, ok.stderr


def test_the_repository_catalog_still_builds():
    """slos/ has no engine-sourced latency SLO today; whatever it has must pass the check."""
    loaded = load_paths([str(REPO / "slos")])
    engine_latency = [s for s in loaded.slos if getattr(s.sli, "plugin", "") == "llmslo/latency"
                      and s.sli.plugin_options.get("source") == "engine"]
    assert all(s.sli.sources for s in engine_latency)


# ------------------------------------------------------------------------------ run time


def _results(*specs: str, **gen):
    loaded = load_paths([str(SPECS / s) for s in specs])
    return generate(loaded.slos, GenOptions(**gen))


def test_the_alert_is_per_cluster_and_engine_series_by_series():
    (result,) = _results("rounded.yaml")
    (group,) = [g for g in result.rules.groups() if g.name.startswith(GROUP_PREFIX)]
    (rule,) = group.rules
    assert group.name == "llmslo-bucket-edges-edges-ttft-rounded"
    assert rule.alert == "EdgesTTFTRoundedBudgetBurn" + ALERT_SUFFIX
    assert rule.expr == ('count by (cluster, engine) (\n'
                         '  llm_time_to_first_token_seconds_count{engine="vllm"}\n'
                         '  unless ignoring (le)\n'
                         '  llm_time_to_first_token_seconds_bucket{engine="vllm",le=~"0\\\\.250*"}\n)\n')
    assert rule.for_ == "10m"
    assert rule.labels["severity"] == "warning" and rule.labels["slo_tier"] == TIER
    assert rule.labels["sloth_id"] == "edges-ttft-rounded"
    assert "the spec wrote 0.3 s; threshold_rounding: down chose 0.25 s" in rule.annotations["description"]
    assert rule.annotations["runbook_url"].endswith("/docs/runbooks/EdgesTTFTRoundedBudgetBurnThresholdNotABucketEdge.md")
    # the burn-rate alert group is untouched
    assert all(r.labels.get("slo_tier") != TIER for r in result.rules.alerts.rules)


def test_no_alert_without_engine_latency_or_alerts_or_in_sloth_compat():
    assert not [g for r in _results("on-edge.yaml", disable_alerts=True) for g in r.rules.groups()
                if g.name.startswith(GROUP_PREFIX)]
    assert not [g for r in _results("on-edge.yaml", sloth_compat=True) for g in r.rules.groups()
                if g.name.startswith(GROUP_PREFIX)]
    catalog = load_paths([str(REPO / "slos")])
    assert not [g for r in generate(catalog.slos, GenOptions()) for g in r.rules.groups()
                if g.name.startswith(GROUP_PREFIX)]  # tap latency, goodput, availability, kv: no such alert


def test_the_alert_gets_its_own_runbook():
    results = _results("on-edge.yaml")
    (view,) = [v for v in views.alert_views(results) if v.kind == views.ALERT_BUCKET_EDGE]
    assert view.name == "EdgesTTFTOnEdgeBudgetBurnThresholdNotABucketEdge" and not view.tiers
    from slogen.artifacts.runbooks import render_runbook

    text = render_runbook(view)
    assert "unless ignoring (le)" in text and "count by (cluster, engine, le)" in text
    assert "| vllm >=0.11 |" in text and "| trtllm-serve |" in text and "| sglang" not in text


def _build(tmp_path: Path, *specs: str) -> Path:
    src = tmp_path / "slos"
    src.mkdir()
    for s in specs:
        shutil.copy(SPECS / s, src / s)
    artifacts = build(BuildOptions(inputs=(str(src),)), [s for s in STEPS if s.name in ("rules", "tests")]).files
    out = tmp_path / "out"
    for rel, text in artifacts.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    return out


def _promtool(test_file: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", "test", "rules", test_file.name], cwd=test_file.parent,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("edges"), "on-edge.yaml", "rounded.yaml")


def test_generated_tests_stage_the_clusters_and_pass_promtool(promtool, built):
    doc = yaml.safe_load((built / service_tests_path("edges")).read_text())
    mine = [t for t in doc["tests"] if t.get("alert_rule_test")
            and all(c["alertname"].endswith(ALERT_SUFFIX) for c in t["alert_rule_test"])]
    assert len(mine) == 4  # two per SLO
    lost = [t for t in doc["tests"] if "upgrades half its engines" in t["name"] or "measured requests" in t["name"]]
    assert len(lost) == 4  # a healthy and a hurt cluster losing the edge, per SLO
    fires, quiet = mine[0], mine[1]
    series = [s["series"] for s in fires["input_series"]]
    assert any('cluster="without-edge"' in s and 'le="0.25"' in s for s in series)
    assert not any('cluster="without-edge"' in s and 'le="0.5"' in s for s in series)
    (late,) = [t for t in fires["alert_rule_test"] if t["exp_alerts"]]
    assert [a["exp_labels"]["cluster"] for a in late["exp_alerts"]] == ["mixed", "without-edge"]
    assert all(a["exp_labels"]["engine"] == "vllm" for a in late["exp_alerts"])
    assert all(not t["exp_alerts"] for t in quiet["alert_rule_test"])
    assert all("with-edge" in s["series"] for s in quiet["input_series"])
    run = _promtool(built / service_tests_path("edges"))
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("mutation", [
    # the set operation inverted: fires where the edge is, not where it is missing
    ("unless ignoring (le)", "and ignoring (le)"),
    # without ignoring(le) no count series ever matches a bucket series: fires everywhere
    ("unless ignoring (le)", "unless"),
    # whole clusters compared (the issue's first sketch): a cluster where one engine lacks the edge is missed
    ("count by (cluster, engine) (\n        llm_time_to_first_token_seconds_count{engine=~\"vllm|trtllm-serve\"}\n"
     "        unless ignoring (le)\n        llm_time_to_first_token_seconds_bucket",
     "count by (cluster, engine) (\n        llm_time_to_first_token_seconds_count{engine=~\"vllm|trtllm-serve\"}\n"
     "        ) unless count by (cluster, engine) (\n        llm_time_to_first_token_seconds_bucket"),
    # fleet-wide instead of per cluster: the alert loses its cluster
    ("count by (cluster, engine) (", "count by (engine) ("),
])
def test_generated_tests_fail_against_a_mutated_expression(promtool, built, tmp_path, mutation):
    out = tmp_path / "alerts"
    out.mkdir()
    rules = (built / rules_path("edges")).read_text()
    old, new = mutation
    assert old in rules, old
    (out / Path(rules_path("edges")).name).write_text(rules.replace(old, new))
    test_file = out / Path(service_tests_path("edges")).name
    test_file.write_text((built / service_tests_path("edges")).read_text())
    run = _promtool(test_file)
    assert run.returncode != 0, "the generated tests did not notice the mutation"
    assert "ThresholdNotABucketEdge" in run.stdout + run.stderr
