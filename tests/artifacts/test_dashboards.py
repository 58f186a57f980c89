"""Dashboards: valid Grafana JSON, modern panels, deterministic, and only names that exist."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from llmslo import conventions as c
from slogen.artifacts import dashboards as d
from slogen.paths import FLEET_DASHBOARD_FILE, OVERVIEW_DASHBOARD_FILE, slo_dashboard_path
from tests.helpers.dashboards import iter_queries, variable_series
from tests.helpers.promql_names import metric_names

# Grafana's variables, replaced by what Grafana would send, so Prometheus can parse the queries.
GRAFANA_MACROS = {"$__rate_interval": "1m", "$__range": "1h", "$__interval": "1m"}


def substitute(expr: str) -> str:
    for macro, value in GRAFANA_MACROS.items():
        expr = expr.replace(macro, value)
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", ".*", expr)


def defined_names(slos) -> set[str]:
    """Every series the exporter, the tap and the SLO rules produce, plus Prometheus' ALERTS."""
    names = {c.PROM_ALERTS}
    for m in c.ALL_METRICS:
        names |= {m.bucket(), m.count(), m.sum()} if m.kind == "histogram" else {m.name}
    names |= {c.SLO.OBJECTIVE, c.SLO.ERROR_BUDGET, c.SLO.TIME_PERIOD_DAYS, c.SLO.CURRENT_BURN_RATE,
              c.SLO.PERIOD_BURN_RATE, c.SLO.PERIOD_ERROR_BUDGET_REMAINING, c.SLO.INFO}
    from slogen.rules.capacity import CapacityOptions, recording_rules

    names |= {r.record for r in recording_rules(CapacityOptions())}  # alerts/llmslo-capacity.rules.yaml
    for slo in slos:
        for w in slo.windows:
            names |= {c.SLO.sli_error_ratio(w), c.SLO.sli_errors_rate(w), c.SLO.sli_total_rate(w)}
    return names


@pytest.fixture
def files(sample_slos) -> dict[str, str]:
    return d.dashboard_files(sample_slos)


@pytest.fixture
def dashboards(files) -> dict[str, dict]:
    return {path: json.loads(text) for path, text in files.items()}


def all_panels(dashboard: dict) -> list[dict]:
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out += panel.get("panels", [])
    return out


def test_one_dashboard_per_slo_plus_the_fleet_and_the_overview(files, sample_slos):
    expected = {FLEET_DASHBOARD_FILE, OVERVIEW_DASHBOARD_FILE} | {slo_dashboard_path(s.slo_id) for s in sample_slos}
    assert set(files) == expected
    assert set(d.dashboard_files([])) == {FLEET_DASHBOARD_FILE}  # no SLOs, no overview


def test_every_dashboard_validates_against_grafanas_schema(dashboards, grafana_validator):
    for path, dashboard in dashboards.items():
        errors = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in grafana_validator.iter_errors(dashboard)]
        assert errors == [], path


def test_schema_rejects_what_grafanalib_writes_unmodernised(grafana_validator):
    """The schema test has teeth: grafanalib's raw legacy output does not pass it."""
    raw = json.loads(json.dumps(d.fleet_dashboard().to_json_data(), default=lambda o: o.to_json_data()))
    assert any(True for _ in grafana_validator.iter_errors(raw))


def test_modern_panel_types_only(dashboards):
    types = Counter(p["type"] for dash in dashboards.values() for p in all_panels(dash))
    assert set(types) <= {"timeseries", "stat", "heatmap", "bargauge", "table", "row"}
    assert {"timeseries", "stat", "heatmap", "bargauge", "table"} <= set(types)
    for dash in dashboards.values():
        for panel in all_panels(dash):
            if panel["type"] == "heatmap":
                assert panel["options"]["calculate"] is False  # Prometheus buckets, not Grafana's guess
                assert all(t["format"] == "heatmap" for t in panel["targets"])


def test_generation_is_deterministic(files, sample_slos):
    again = d.dashboard_files(list(reversed(sample_slos)))
    assert again == files


def test_uids_and_panel_ids_are_unique_and_grid_positions_do_not_overlap(dashboards):
    uids = [dash["uid"] for dash in dashboards.values()]
    assert len(set(uids)) == len(uids)
    assert all(8 <= len(u) <= 40 for u in uids)
    for path, dash in dashboards.items():
        panels = all_panels(dash)
        ids = [p["id"] for p in panels]
        assert len(set(ids)) == len(ids), path
        cells = set()
        for p in panels:
            g = p["gridPos"]
            assert g["x"] + g["w"] <= 24, (path, p["title"])
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, (path, p["title"])
                    cells.add((x, y))


def test_every_query_parses_in_prometheus(dashboards, check_exprs):
    exprs = {f"{path}: {title} #{i}": substitute(expr)
             for path, dash in dashboards.items() for i, (title, expr) in enumerate(iter_queries(dash))}
    assert len(exprs) > 60
    check_exprs(exprs)


def test_every_query_names_only_defined_series(dashboards, sample_slos):
    known = defined_names(sample_slos)
    for path, dash in dashboards.items():
        for title, expr in iter_queries(dash):
            names = metric_names(expr)
            assert names, (path, title, expr)
            assert names <= known, (path, title, names - known)


def test_the_name_check_catches_an_undefined_series(sample_slos):
    known = defined_names(sample_slos)
    assert not metric_names('sum(rate(llm_made_up_total{model=~"$model"}[$__rate_interval]))') <= known


def test_fleet_dashboard_has_the_four_filters_and_uses_them(dashboards):
    fleet = dashboards[FLEET_DASHBOARD_FILE]
    variables = {v["name"]: v for v in fleet["templating"]["list"]}
    assert {"datasource", "cluster", "namespace", "model", "node"} <= set(variables)
    for name in ("cluster", "namespace", "model", "node"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
        assert metric_names(variable_series(variables[name]["query"])) == {c.REQUESTS_RUNNING.name}
    for title, expr in iter_queries(fleet):
        if title.startswith("variable"):
            continue
        assert '=~"$cluster"' in expr and '=~"$node"' in expr, title
        if c.PREFIX + "gpu_" not in expr:  # GPU series have no namespace or model
            assert '=~"$namespace"' in expr and '=~"$model"' in expr, title


def test_fleet_dashboard_covers_the_serving_signals(dashboards):
    fleet = dashboards[FLEET_DASHBOARD_FILE]
    names = set().union(*(metric_names(e) for _, e in iter_queries(fleet)))
    for metric in (c.GOODPUT_TOKENS, c.OUTPUT_TOKENS, c.REQUESTS_WAITING, c.KV_CACHE_USAGE, c.KV_BLOCKS_FREE,
                   c.PREEMPTIONS, c.PREFIX_CACHE_HITS, c.GPU_MEMORY_USED, c.GPU_MEMORY_FREE,
                   c.LORA_ADAPTERS_RUNNING):
        assert metric.name in names, metric.name
    for record in (c.CAPACITY.POOL_SEATS_P99, c.CAPACITY.POOL_SEATS_P50, c.CAPACITY.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION,
                   c.CAPACITY.SEATS_P99):  # the capacity row
        assert record in names, record
    for hist in (c.TTFT, c.TPOT, c.TAP_TTFT, c.TAP_TPOT):
        assert hist.bucket() in names
    heatmaps = [p for p in all_panels(fleet) if p["type"] == "heatmap"]
    assert {p["title"] for p in heatmaps} == {"TTFT heatmap", "TPOT heatmap"}
    # Heatmaps and fleet-wide percentiles read the tap (one ladder); the engines' histograms only per engine kind.
    assert all(c.PREFIX + "tap_" in t["expr"] for p in heatmaps for t in p["targets"])
    quantiles = [e for _, e in iter_queries(fleet) if e.startswith("histogram_quantile(")]
    for q in ("0.5", "0.9", "0.99"):
        assert sum(e.startswith(f"histogram_quantile({q},") for e in quantiles) == 4
    for e in quantiles:
        assert c.PREFIX + "tap_" in e or "sum by (engine, le)" in e, e


def test_slo_dashboard_panels(dashboards, sample_slos):
    slo = sample_slos[0]
    dash = dashboards[slo_dashboard_path(slo.slo_id)]
    by_title = {p["title"]: p for p in all_panels(dash)}
    # SLI against objective
    sli = by_title["SLI vs objective"]
    assert any(c.SLO.OBJECTIVE in t["expr"] for t in sli["targets"])
    # Budget left over the rolling period and over the calendar month so far
    assert c.SLO.PERIOD_ERROR_BUDGET_REMAINING in by_title["Error budget left (rolling 30d)"]["targets"][0]["expr"]
    month = by_title["Error budget left (this month)"]
    assert month["timeFrom"] == "now/M" and "[$__range]" in month["targets"][0]["expr"]
    assert c.SLO.sli_errors_rate("5m") in month["targets"][0]["expr"]  # traffic-weighted
    # Burn rate on every alert window, one query each, divided by this SLO's budget (1%)
    burn = by_title["Burn rate per window"]
    windows = {w for t in slo.tiers for w in (t.long_window, t.short_window)}
    assert {t["legendFormat"] for t in burn["targets"]} == windows
    assert all(t["expr"].endswith("/ 0.01") for t in burn["targets"])
    # Firing alerts, one bar per tier, never empty
    tiers = by_title["Firing alerts by tier"]
    assert tiers["type"] == "bargauge" and len(tiers["targets"]) == len(slo.tiers)
    for t in tiers["targets"]:
        assert c.PROM_ALERTS in t["expr"] and "or vector(0)" in t["expr"]
        assert f'{c.SLO.LABEL_TIER}="' in t["expr"] and f'{c.SLO.LABEL_ID}="{slo.slo_id}"' in t["expr"]
    assert by_title["Error budget burn-down (rolling 30d)"]["type"] == "timeseries"
    # every SLO-rule query is scoped to this SLO
    for title, expr in iter_queries(dash):
        if any(n.startswith("slo:") for n in metric_names(expr)):
            assert f'{c.SLO.LABEL_ID}="{slo.slo_id}"' in expr, title


def test_time_weighted_month_budget_without_event_rates(dashboards, sample_slos):
    legacy = next(s for s in sample_slos if not s.traffic_weighted)
    dash = dashboards[slo_dashboard_path(legacy.slo_id)]
    month = next(p for p in all_panels(dash) if p["title"] == "Error budget left (this month)")
    assert "avg_over_time(" in month["targets"][0]["expr"]
    assert c.SLO.sli_errors_rate("5m") not in month["targets"][0]["expr"]
