"""The generated dashboard tests (dashboards/dashboards.test.yaml): every panel query, run by real promtool on
the synthetic fleet, gives the number its title claims; the expressions that were wrong (issue #18) fail them.

Cost: one promtool run of the generated file (~0.1 s; the repository's build, made by the suite) and one per broken
expression, plus one SLO load.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from llmslo import conventions as c
from slogen import promql as q
from slogen.artifacts import dashboards as d
from slogen.errors import SpecErrors
from slogen.loaders import load_paths
from slogen.panels import LATE_TITLE
from slogen.promtests import dashboards as pt
from slogen.promtests import fleet_scenario as fs
from slogen.rules import generate
from slogen.rules.options import GenOptions
from slogen.views import from_context
from slogen.yamlio import dump
from tests.helpers.dashboards import iter_queries

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def views():
    return [from_context(r.ctx) for r in generate(load_paths([REPO / "slos"]).slos, GenOptions())]


def promtool_test(promtool: str, doc: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "dashboards.test.yaml"
    path.write_text(dump(doc))
    return subprocess.run([promtool, "test", "rules", path.name], cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_the_generated_dashboard_tests_pass(promtool, repository_build):
    test_file = repository_build / pt.TEST_FILE
    proc = subprocess.run([promtool, "test", "rules", test_file.name], cwd=test_file.parent, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def test_every_panel_query_of_every_dashboard_is_tested(repository_build):
    panels = sum(1 for path in (repository_build / "dashboards").glob("*.json")
                 for title, _ in iter_queries(json.loads(path.read_text())) if not title.startswith("variable "))
    tests = yaml.safe_load((repository_build / pt.TEST_FILE).read_text())["tests"]
    cases = [case for group in tests for case in group["promql_expr_test"]]
    assert len(cases) == panels > 200
    assert all(case["exp_samples"] for case in cases)  # no panel passes by returning nothing


def test_the_fleet_has_what_broke_the_panels():
    kinds = {e.kind for e in fs.FLEET.engines}
    assert {"vllm", "sglang", "trtllm-triton"} <= kinds
    assert any(not e.pod for e in fs.FLEET.engines)  # static targets
    assert len({e.block_size for e in fs.FLEET.engines if e.block_size}) >= 2 and len({e.node for e in fs.FLEET.engines}) == 2
    outcomes = {o for t in fs.FLEET.taps for o, _ in t.outcomes}
    assert set(c.TAP_NEUTRAL_OUTCOMES) <= outcomes and any(not t.goodput for t in fs.FLEET.taps)


def test_answers_are_the_hand_derived_ones(views):
    """A few answers spelled out: 48 of the 66 interactive requests the SLI counts were good; the batch class had
    none and shows 0, not nothing; SGLang's 900 free blocks of 64 tokens are more room than vLLM's 2000 of 16."""
    fleet = pt.fleet_answers(views)
    assert sorted(fleet[("Goodput ratio by SLO class", "A")], key=str) == [
        ({"slo_class": "batch"}, 0.0), ({"slo_class": "interactive"}, 48 / 66)]
    free = {lb.get("pod", ""): v for lb, v in fleet[("Free KV-cache tokens per engine", "A")]}
    assert free["sglang-0"] == 57600 and free["vllm-0"] == 32000
    chat = next(v for v in views if v.slo_id == "chat-availability")
    assert pt.month_answer(chat) == 1 - (10 / 1440) / 0.001 * (1 / 31)  # 77.6% left, not -594%


def _fails_on(promtool, views, tmp_path, needle: str) -> str:
    proc = promtool_test(promtool, pt.dashboard_tests(views, d.dashboard_files(views)), tmp_path)
    assert proc.returncode != 0, "promtool passed a broken panel"
    failed = proc.stdout + proc.stderr
    assert needle in failed, failed[:2000]
    return failed


def test_the_old_goodput_ratio_fails(promtool, views, tmp_path, monkeypatch):
    """The denominator that counted client_disconnected and client_error, and no 0 for a class in outage."""
    monkeypatch.setattr(d, "goodput_ratio", lambda m, by=(), window=d.RATE: q.ratio(
        q.sum_rate(c.GOODPUT_REQUESTS.name, m, window, by), q.sum_rate(c.TAP_REQUESTS.name, m, window, by)))
    _fails_on(promtool, views, tmp_path, "llm_goodput_requests_total")


def test_the_old_month_budget_fails(promtool, views, tmp_path, monkeypatch):
    """Without the share of the month gone, a 10-minute outage a day in reads -594%."""
    monkeypatch.setattr(d, "MONTH_ELAPSED", "1")
    failed = _fails_on(promtool, views, tmp_path, "sum_over_time(")
    assert "-5.94" in failed


def test_mixed_ladders_are_refused_by_the_guard_and_fail_promtool(promtool, views, tmp_path, monkeypatch):
    monkeypatch.setattr(d, "PER_KIND", ())
    with pytest.raises(q.MixedLaddersError, match="keep engine or pod"):
        d.dashboard_files(views)
    monkeypatch.setattr(q, "check_one_ladder", lambda histogram, labels: None)  # the guard off: promtool catches it
    _fails_on(promtool, views, tmp_path, "histogram_quantile(0.9, sum by (le) (rate(llm_time_to_first_token_seconds_bucket")


def test_a_hang_shows_in_the_late_requests_panels_and_in_no_percentile(promtool, views, tmp_path, monkeypatch):
    """The batch tap's 4 requests/s that hit the tap's deadline (upstream_timeout) never complete: no latency
    histogram holds them, so only the late-requests panels show a hang. Counting them out fails the test."""
    batch = pt.fleet_answers(views)[(LATE_TITLE + " by SLO class", "A")]
    assert sorted(batch, key=str) == [({"slo_class": "batch"}, 4.0), ({"slo_class": "interactive"}, 2.0)]
    batch_ttft = next(v for v in views if v.slo_id == "batch-ttft")
    assert pt.slo_answers(batch_ttft)[(LATE_TITLE, "A")] == [({}, 4.0)]
    gave_up_only = q.matcher(c.LABEL_OUTCOME, "=", c.OUTCOME_CLIENT_GAVE_UP)  # the engine's hang left out
    monkeypatch.setattr(d, "_late_requests", lambda m, labels: d.gf.prom_target(
        q.sum_rate(c.TAP_REQUESTS.name, [*m, gave_up_only], d.RATE, labels), "late", "A"))
    _fails_on(promtool, views, tmp_path, 'got: {slo_class="interactive"} 2E+00')


def test_a_legend_naming_a_missing_label_stops_the_build(views, monkeypatch):
    monkeypatch.setattr(d, "ENGINE_LEGEND", "{{Hostname}} {{pod}}")
    with pytest.raises(SpecErrors, match=r"legend names \{\{Hostname\}\}"):
        pt.dashboard_tests(views, d.dashboard_files(views))


def test_a_panel_without_an_answer_stops_the_build(views, monkeypatch):
    answers = pt.fleet_answers
    monkeypatch.setattr(pt, "fleet_answers", lambda slos, f: {k: v for k, v in answers(slos, f).items()
                                                              if k[0] != "Goodput ratio now"})
    with pytest.raises(SpecErrors, match="'Goodput ratio now' .* has no expected answer"):
        pt.dashboard_tests(views, d.dashboard_files(views))


def test_a_heatmap_with_falling_buckets_is_refused():
    """The old engine TTFT heatmap on this fleet (vLLM, SGLang and Triton buckets summed by le) fell from 32 at
    le=0.1 to 20 at le=0.2: Grafana drew a cell of -12 requests/s. The tap's buckets only rise."""
    old = [({"le": "0.1"}, 32.0), ({"le": "0.2"}, 20.0), ({"le": "0.25"}, 40.0), ({"le": "+Inf"}, 160.0)]
    assert not pt._cumulative(old)
    assert pt._cumulative(pt.fleet_answers([])[("TTFT heatmap", "A")])


def test_every_kind_of_slo_gets_passing_dashboard_tests(promtool, sample_slos, tmp_path):
    """Not just slos/: engine-sourced latency (ITL too), tap E2E, engine availability, KV headroom, a Sloth raw
    SLI without event rates (time-weighted month budget); `slogen build` must not stop on a valid spec."""
    proc = promtool_test(promtool, pt.dashboard_tests(sample_slos, d.dashboard_files(sample_slos)), tmp_path)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout[-3000:] + proc.stderr
