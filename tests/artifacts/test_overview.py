"""The SLO overview (slogen/artifacts/overview.py): one table row per SLO and cluster, every column proven by
real promtool on the synthetic fleet (the generated dashboard tests), the expressions that would be wrong
failing them, rows linking to each SLO's own dashboard, and its ConfigMap emitted like the other dashboards'.

Cost: a few promtool runs (~0.1 s each) and one render of a 6,000-SLO overview (~1 s).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from llmslo import conventions as c
from llmslo.conventions import SLO as S
from slogen import panels as p
from slogen.artifacts import dashboards as d
from slogen.artifacts import grafana as gf
from slogen.artifacts import overview as ov
from slogen.artifacts.grafana_provisioning import configmap_name, dashboard_configmaps
from slogen.k8smeta import MAX_CONFIGMAP_BYTES, KubeOptions
from slogen.links import slo_dashboard_uid
from slogen.paths import OVERVIEW_DASHBOARD_FILE, slo_dashboard_path
from slogen.promtests import dashboards as pt
from slogen.yamlio import dump


def _table(dashboard: dict) -> dict:
    [panel] = dashboard["panels"]
    return panel


def _promtool(promtool: str, doc: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "overview.test.yaml"
    path.write_text(dump(doc))
    return subprocess.run([promtool, "test", "rules", path.name], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)


def test_the_overview_lists_every_column_and_is_schema_valid(sample_slos, grafana_validator):
    dash = json.loads(d.dashboard_files(sample_slos)[OVERVIEW_DASHBOARD_FILE])
    assert list(grafana_validator.iter_errors(dash)) == []
    table = _table(dash)
    assert table["type"] == "table" and table["title"] == p.OVERVIEW_TITLE
    assert all(t["instant"] and t["format"] == "table" for t in table["targets"])
    names = table["transformations"][1]["options"]["renameByName"]
    tiers = ["page-quick", "page-slow", "ticket-quick", "ticket-slow"]
    assert list(names.values())[:7] == ["Objective %", "SLI % (period)", "Budget left %", "page-quick burn (1h)",
                                         "page-slow burn (6h)", "ticket-quick burn (1d)", "ticket-slow burn (3d)"]
    assert [names[p.firing_label(t)] for t in tiers] == [f"{t} fires" for t in tiers]
    # Only recorded series: the rules' budget, objective, burn rates and ratios, and ALERTS.
    exprs = "\n".join(t["expr"] for t in table["targets"])
    for name in (S.OBJECTIVE, S.ERROR_BUDGET, S.PERIOD_BURN_RATE, S.PERIOD_ERROR_BUDGET_REMAINING, c.PROM_ALERTS,
                 S.sli_error_ratio("1h"), S.sli_error_ratio("3d")):
        assert name + "{" in exprs, name
    assert "rate(" not in exprs and '=~"$cluster"' in exprs


def test_each_row_links_to_its_slos_own_dashboard(sample_slos):
    files = d.dashboard_files(sample_slos)
    table = _table(json.loads(files[OVERVIEW_DASHBOARD_FILE]))
    defaults = table["fieldConfig"]["defaults"]
    assert [link["url"] for link in defaults["links"]] == ["/d/${__data.fields.sloth_id}"]
    # sloth_id displays as its dashboard's uid, which the link reads (Grafana's ${__data.fields.X} is the display text)
    uids = next(m["options"] for m in defaults["mappings"] if S.LABEL_ID not in m["options"]
                and sample_slos[0].slo_id in m["options"])
    for slo in sample_slos:
        own = json.loads(files[slo_dashboard_path(slo.slo_id)])["uid"]
        assert uids[slo.slo_id]["text"] == own == slo_dashboard_uid(slo.slo_id)


def test_a_huge_build_links_to_search_and_still_fits_a_configmap(sample_slos):
    """Past the link budget (a uid mapping per SLO), rows link to Grafana's search for the SLO's dashboard,
    and the overview's ConfigMap stays under the 1 MiB the API server takes."""
    many = [dataclasses.replace(sample_slos[0], service=f"svc{i // 10:04d}", name=f"slo-{i % 10}",
                                slo_id=f"svc{i // 10:04d}-slo-{i % 10}") for i in range(6000)]
    text = gf.render(d.overview_dashboard(many))
    table = _table(json.loads(text))
    assert "/dashboards?tag=slo&query=" in table["fieldConfig"]["defaults"]["links"][0]["url"]
    assert len(text.encode()) < MAX_CONFIGMAP_BYTES
    dashboard_configmaps({OVERVIEW_DASHBOARD_FILE: text}, KubeOptions(), "v")  # raises past 1 MiB
    linked = gf.render(d.overview_dashboard(many[:1000]))
    assert "/d/${__data.fields.sloth_id}" in linked


def test_the_overview_and_its_configmap_are_built_like_the_other_dashboards():
    """`slogen build` writes the overview, its tests in dashboards.test.yaml, and the generator of its ConfigMap
    for the sidecar in dashboards/kustomization.yaml, reading the file."""
    from slogen.build import build
    from slogen.catalog import BuildOptions
    from slogen.steps import STEPS

    repo = Path(__file__).resolve().parents[2]
    files = build(BuildOptions(inputs=(str(repo / "slos"),)), [s for s in STEPS if s.name == "dashboards"]).files
    overview = str(files[OVERVIEW_DASHBOARD_FILE])
    assert json.loads(overview)["uid"]
    made = yaml.safe_load(str(files["dashboards/kustomization.yaml"]))["configMapGenerator"]
    assert [g["files"] for g in made if g["name"] == configmap_name(OVERVIEW_DASHBOARD_FILE)] == [
        ["llm-slo-overview.json"]]
    assert "alerts_page_quick" in str(files[pt.TEST_FILE])  # its columns are tested with the others


def test_the_staged_alerts_carry_a_scoped_builds_namespace_and_the_rows_do_not(sample_slos):
    """A namespace-scoped build's alerts carry `namespace` (and the SLO's identity): the firing columns group it
    away, so they join the other columns' rows."""
    chat = next(s for s in sample_slos if s.slo_id == "chat-ttft")
    alerts = [lb for name, lb, _ in pt.slo_series(chat) if name == c.PROM_ALERTS]
    assert {lb[c.LABEL_NAMESPACE] for lb in alerts} == {pt.SCOPED_NAMESPACE}
    assert pt.staged_alerts(chat) == [("page-quick", "page"), ("page-slow-low-traffic", "ticket")]
    answers = pt.overview_answers(sample_slos)
    states = {t: {lb[p.firing_label(t)] for lb, _ in answers[(p.OVERVIEW_TITLE, ref)] if lb[S.LABEL_ID] == "chat-ttft"}
              for t, ref in zip(p.overview_tiers(sample_slos), "HIJK", strict=True)}
    assert states == {"page-quick": {"page"}, "page-slow": {"ticket"}, "ticket-quick": {"none"}, "ticket-slow": {"none"}}
    assert all(c.LABEL_NAMESPACE not in lb for samples in answers.values() for lb, _ in samples)


def _fails(promtool, sample_slos, tmp_path, monkeypatch, attr: str, wrong, needle: str) -> None:
    monkeypatch.setattr(ov._Queries, attr, wrong)
    proc = _promtool(promtool, pt.dashboard_tests(sample_slos, d.dashboard_files(sample_slos)), tmp_path)
    assert proc.returncode != 0, "promtool passed a broken overview column"
    assert needle in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[:2000]


def test_the_overview_columns_pass_and_wrong_ones_fail(promtool, sample_slos, tmp_path, monkeypatch):
    doc = pt.dashboard_tests(sample_slos, d.dashboard_files(sample_slos))
    cases = [case for group in doc["tests"] for case in group["promql_expr_test"] if S.LABEL_SERVICE + "=~" in case["expr"]]
    assert len(cases) == 3 + 4 + 4  # objective, SLI, budget; a burn rate and a firing state per tier
    proc = _promtool(promtool, doc, tmp_path)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout[-3000:] + proc.stderr
    # The objective straight from its series: it has no cluster, so its rows would not join the others'.
    _fails(promtool, sample_slos, tmp_path, monkeypatch, "objective",
           lambda self: f"100 * {d.q.selector(S.OBJECTIVE, [self.scope])}", "slo:objective:ratio")
    monkeypatch.undo()
    # The period burn rate read as the SLI: 1 - burn rate is not 1 - error ratio.
    _fails(promtool, sample_slos, tmp_path, monkeypatch, "sli",
           lambda self: f"100 * max by ({', '.join(self.row)}) (1 - {d.q.selector(S.PERIOD_BURN_RATE, self.m)})",
           "slo:period_burn_rate:ratio")


def test_a_firing_state_that_misses_the_low_traffic_twin_fails(promtool, sample_slos, tmp_path, monkeypatch):
    real = ov._Queries.firing
    monkeypatch.setattr(ov, "LOW_TRAFFIC_SUFFIX", "-no-such-twin")
    assert "page-slow-low-traffic" not in real(ov._Queries(sample_slos), "page-slow")
    proc = _promtool(promtool, pt.dashboard_tests(sample_slos, d.dashboard_files(sample_slos)), tmp_path)
    assert proc.returncode != 0 and 'alerts_page_slow="none"' in proc.stdout + proc.stderr


def test_two_clusters_and_an_slo_without_data(promtool, sample_slos, tmp_path):
    """Per-cluster rows under a central ruler (objective and budget without `cluster`), and an SLO with no data
    in any cluster listed as a row of its own, every column with the same row labels."""
    ttft, tpot = sample_slos[0], sample_slos[1]
    ident = lambda s: {S.LABEL_ID: s.slo_id, S.LABEL_SERVICE: s.service, S.LABEL_SLO: s.name}  # noqa: E731
    series = []
    for cluster, ratio in (("a", 0.001), ("b", 0.004)):
        labels = {**ident(ttft), c.LABEL_CLUSTER: cluster}
        series += [(S.PERIOD_ERROR_BUDGET_REMAINING, labels, f"{1 - ratio / 0.01:g}x10"),
                   (S.PERIOD_BURN_RATE, labels, f"{ratio / 0.01:g}x10")]
    for s in (ttft, tpot):
        series += [(S.OBJECTIVE, ident(s), "0.99x10"), (S.ERROR_BUDGET, ident(s), "0.01x10")]
    table = _table(json.loads(gf.render(d.overview_dashboard([ttft, tpot]))))
    expr = {t["refId"]: pt.grafana_expr(t["expr"]) for t in table["targets"]}
    row = lambda s, cluster=None: {**ident(s), **({c.LABEL_CLUSTER: cluster} if cluster else {})}  # noqa: E731
    expected = {
        "A": [(row(ttft, "a"), 100 * 0.99), (row(ttft, "b"), 100 * 0.99), (row(tpot), 100 * 0.99)],
        "C": [(row(ttft, k), 100 * float(f"{1 - r / 0.01:g}")) for k, r in (("a", 0.001), ("b", 0.004))],
        "H": [({**row(ttft, k), "alerts_page_quick": "none"}, 0.0) for k in "ab"]
             + [({**row(tpot), "alerts_page_quick": "none"}, 0.0)],
    }
    cases = [{"expr": expr[ref], "eval_time": "5m",
              "exp_samples": [{"labels": pt.label_filter(lb), "value": v} for lb, v in samples]}
             for ref, samples in expected.items()]
    doc = {"rule_files": [], "evaluation_interval": "1m", "tests": [{"interval": "1m", "input_series": [
        {"series": n + pt.label_filter(lb), "values": v} for n, lb, v in series], "promql_expr_test": cases}]}
    proc = _promtool(promtool, doc, tmp_path)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout[-3000:] + proc.stderr


@pytest.mark.parametrize(("service", "rendered"), [("chat", r'"chat"'), ("a.b", r'"a\\.b"'), ("x|y", r'"x\\|y"')])
def test_service_names_are_matched_literally(sample_slos, service, rendered):
    slo = dataclasses.replace(sample_slos[0], service=service)
    assert ov._services([slo]).render() == f"{S.LABEL_SERVICE}=~{rendered}"
