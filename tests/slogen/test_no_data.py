"""Per-cluster no-data for every SLI kind: plain Sloth events SLIs aggregated `by (cluster)` (the recorded
total rate per cluster), Sloth SLIs summed over the fleet (the sources' `cluster`), raw ratios (the recorded
ratio per cluster). The generated promtool tests of tests/slogen/fixtures/plain_sloth.yaml run for real,
and fail against rules without the per-cluster arm."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from slogen.promtests.slo_tests import service_tests
from slogen.rules import alerts, generate
from slogen.rules.alerts import kept_labels, no_data_scope, no_data_watched, source_selectors
from slogen.rules.options import GenOptions
from slogen.writers import rule_file
from slogen.yamlio import dump
from tests.helpers.specs import load_path

PLAIN = Path(__file__).parent / "fixtures" / "plain_sloth.yaml"


@pytest.mark.parametrize("query,kept", [
    ('sum by (cluster) (rate(x{a="b"}[{{.window}}]))', ("cluster",)),
    ("sum(rate(x[{{.window}}])) by (cluster, region)", ("cluster", "region")),
    ("sum by (cluster) (rate(a[{{.window}}])) / sum by (cluster) (rate(b[{{.window}}]))", ("cluster",)),
    ("sum(rate(x[{{.window}}]))", ()),
    ("sum without (pod) (rate(x[{{.window}}]))", ()),
    ("sum by (cluster) (rate(a[{{.window}}])) / sum by (region) (rate(b[{{.window}}]))", ()),
    ('sum(rate(x{job="by (cluster)"}[{{.window}}]))', ()),  # inside a string: not a clause
])
def test_kept_labels(query, kept):
    assert kept_labels(query) == kept


def _contexts(**opts):
    return {r.slo.id: r for r in generate(load_path(PLAIN), GenOptions(**opts))}


def test_every_sli_kind_gets_a_per_cluster_arm():
    results = _contexts()
    flt = '{sloth_id="api-%s", sloth_service="api", sloth_slo="%s"}'
    # by (cluster): the recorded total rate per cluster, as the plugin SLIs
    ctx = results["api-requests"].ctx
    assert no_data_scope(ctx) == ("cluster",)
    assert no_data_watched(ctx) == ["slo:sli_total:rate5m" + flt % ("requests", "requests")]
    # summed over the fleet: its source series, per cluster
    ctx = results["api-checkout"].ctx
    assert no_data_scope(ctx) == ("cluster",)
    assert no_data_watched(ctx) == source_selectors(ctx) == ['http_requests_total{job="checkout"}']
    rule = next(x for x in results["api-checkout"].rules.alerts.rules if x.labels["slo_tier"] == "no-data")
    assert ('group by (cluster) (present_over_time(http_requests_total{job="checkout"}[1h]))\n  unless\n'
            '  group by (cluster) (http_requests_total{job="checkout"})\n  unless on ()\n'
            '  (absent(slo:sli_total:rate5m' + flt % ("checkout", "checkout") + '))') in rule.expr
    assert "summed over every cluster" in rule.annotations["description"]
    # raw ratio by (cluster): its recorded ratio per cluster
    ctx = results["api-search"].ctx
    assert no_data_watched(ctx) == ["slo:sli_error:ratio_rate5m" + flt % ("search", "search")]
    # --sloth-compat has no no-data alert at all; without recordings there is nothing to watch
    assert all(x.labels.get("slo_tier") != "no-data" for r in _contexts(sloth_compat=True).values()
               for x in r.rules.alerts.rules)
    assert no_data_scope(_contexts(disable_recordings=True)["api-requests"].ctx) == ()


def _write(tmp_path: Path, results, doc) -> None:
    (tmp_path / "api.rules.yaml").write_text(rule_file([g for r in results for g in r.rules.groups()]))
    (tmp_path / "api.test.yaml").write_text(dump(doc))


def _promtool(promtool: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, "test", "rules", "api.test.yaml"], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_generated_tests_of_plain_sloth_slis_pass_and_catch_a_missing_arm(promtool, tmp_path, monkeypatch):
    results = list(_contexts().values())
    doc, skipped = service_tests(results, "api.rules.yaml")
    assert [s.slo_id for s in skipped] == ["api-search"]  # a raw ratio's sources cannot be synthesized
    names = [g["name"] for g in doc["tests"]]
    for slo in ("api-requests", "api-checkout"):
        assert f"{slo}: one cluster of two goes dark, so the no-data alert fires for that cluster only" in names
        assert f"{slo}: every cluster goes dark, so the no-data alert fires once, not once per cluster" in names
    # by (cluster): every scenario runs one cluster each, as the plugin SLIs' do
    assert any(n.startswith("api-requests: full outage") and n.endswith("(one cluster each)") for n in names)
    assert any(n.startswith("api-checkout: a full outage at 6 requests/hour") and "(page_min_bad_events: 5)" in n
               for n in names)
    dark = next(g for g in doc["tests"] if g["name"].startswith("api-checkout: one cluster of two"))
    fired = dark["alert_rule_test"][-1]["exp_alerts"]
    assert [a["exp_labels"]["cluster"] for a in fired] == ["dark"]
    _write(tmp_path, results, doc)
    proc = _promtool(promtool, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the same dark-cluster tests against rules whose no-data alert is absent() only: both fail
    doc["tests"] = [g for g in doc["tests"] if "one cluster of two goes dark" in g["name"]]
    monkeypatch.setattr(alerts, "no_data_scope", lambda ctx: ())
    _write(tmp_path, list(_contexts().values()), doc)
    proc = _promtool(promtool, tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "ApiRequestsBudgetBurnNoData" in out and "ApiCheckoutBudgetBurnNoData" in out


def test_raw_sli_arm_fires_for_the_dark_cluster(promtool, tmp_path):
    """The raw ratio's arm, in a hand-written test (slogen cannot synthesize a raw SLI's sources)."""
    results = [_contexts()["api-search"]]
    ok = 'http_requests_total{cluster="%s",code="200",job="search"}'
    bad = 'http_requests_total{cluster="%s",code="500",job="search"}'
    series = [{"series": ok % "lit", "values": "0+100x40"}, {"series": bad % "lit", "values": "0+0x40"},
              {"series": ok % "dark", "values": "0+100x6"}, {"series": bad % "dark", "values": "0+0x6"}]
    labels = {"cluster": "dark", "routing": "ticket", "severity": "warning", "slo_tier": "no-data",
              "sloth_id": "api-search", "sloth_service": "api", "sloth_severity": "ticket", "sloth_slo": "search"}
    rule = next(x for x in results[0].rules.alerts.rules if x.labels["slo_tier"] == "no-data")
    doc = {"rule_files": ["api.rules.yaml"], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [
               {"eval_time": "14m", "alertname": rule.alert, "exp_alerts": []},
               {"eval_time": "30m", "alertname": rule.alert,
                "exp_alerts": [{"exp_labels": labels, "exp_annotations": rule.annotations}]}]}]}
    _write(tmp_path, results, doc)
    proc = _promtool(promtool, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
