"""The fleet backend, for real (demo/fleet.py): two clusters, each with simulated engines behind goodput taps,
the exporter and a Prometheus agent whose external label is cluster="a" or "b", remote-write into
VictoriaMetrics; vmalert evaluates the rules `slogen build` generated from slos/ (the demo's compressed window
catalog) over the fleet and notifies Alertmanager running slogen's routing. The demo's incident, staged in
cluster a only, must page on-call for cluster a, within the local stack's bound plus the fleet's hops; nothing
may fire for cluster b; the SLIs must be recorded for both clusters; every query of the generated fleet
dashboard must return data for each cluster from VictoriaMetrics's Prometheus API, and its cluster variable
must list both. Nothing may be left running. About 45 s on two busy cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
from dataclasses import replace
from pathlib import Path

import pytest

from demo.alertmanager import PAGE_ROUTE
from demo.fleet import FleetSettings, FleetStack, fleet_bound
from demo.incident import Scenario, fastest_page_tier, run_incident
from demo.procs import live_children_of
from llmslo import conventions as C
from tests.helpers.dashboards import iter_queries
from tests.helpers.incident_runs import assert_nothing_left
from tests.helpers.incident_runs import timeline as incident_timeline

pytestmark = pytest.mark.integration

RATE_INTERVAL = "30s"  # $__rate_interval: the load has drained when the dashboards are read, so look 30 s back
FLEET_DASHBOARD = "llm-serving-fleet.json"
KEEPS_CLUSTER = re.compile(r"\bby \(cluster\b")
BINARIES = ("victoria-metrics", "vmalert", "prometheus", "prometheus-alertmanager")


def _need_binaries() -> None:
    missing = [b for b in BINARIES if not shutil.which(b) and not Path("/usr/bin", b).exists()]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run `make system-deps` (the fleet test runs them for real)")


def for_cluster(expr: str, cluster: str) -> str:
    """What Grafana sends with the cluster variable on one cluster and every other variable on "All"."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", "1h").replace("$__interval", "2s")
    expr = re.sub(r"\$\{?cluster\}?", cluster, expr)
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", ".*", expr)


def may_be_empty(expr: str) -> bool:
    """The exhaustion forecast is absent while no pool's net free tokens fall steadily, and the pool-holder panel
    while no GPU is held by a pod on a node whose exporter is told its pool (no kubelet here); the live-dashboard
    test checks their operands, the generated dashboards.test.yaml the holders' join."""
    return C.CAPACITY.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION in expr or C.EXPORTER_NODE_POOL_INFO.name in expr


def test_incident_in_cluster_a_pages_for_a_only_and_fleet_dashboard_sees_both(tmp_path):
    _need_binaries()
    started = time.monotonic()
    children_before = set(live_children_of(os.getpid()))
    fleet = FleetSettings.fast()
    fleet = replace(fleet, stack=replace(fleet.stack, workdir=tmp_path / "fleet", keep_workdir=True))
    # No all-clear wait (the page group's interval is 2 m): recover as soon as paged, then drain.
    scenario = Scenario(steady_s=8.0, max_incident_s=45.0, max_resolve_s=0.0, segment_s=3.0)
    out: dict = {}
    groups: list[int] = []

    async def body() -> None:
        async with FleetStack(fleet=fleet) as stack:
            groups.extend(stack.process_groups())
            out["start_s"] = stack.timings["start_s"]
            report = await run_incident(stack, scenario)
            out["report"] = report
            out["bound"] = fleet_bound(stack, report.slo, fastest_page_tier(stack.settings), 1.0,
                                       _slowed_latency(report, t_from=report.incident_at))
            out["vmalert"] = await stack.vmalert_alerts()
            out["notes"] = list(stack.webhook.notifications)
            prom = stack.prom()
            if report.fired is not None and report.fired.firing():  # the paged alert's short-window SLI ratio
                labels = report.fired.firing()[0]["labels"]
                record = C.SLO.sli_error_ratio(labels[C.SLO.LABEL_SHORT_WINDOW])
                out["sli_clusters"] = {r["metric"].get(C.LABEL_CLUSTER) for r in await prom.query(
                    f'{record}{{{C.SLO.LABEL_ID}="{labels[C.SLO.LABEL_ID]}"}}')}
            dash = json.loads((stack.workdir / "slogen" / "dashboards" / FLEET_DASHBOARD).read_text())
            queries = [(t, q) for t, q in iter_queries(dash) if not t.startswith("variable ")]
            # Recordings of recordings (the pool's KV seats: three links) appear link by link, each a new series
            # about 10 s after the one before (FleetTimers.new_series_s): poll, as a dashboard refreshes.
            # A new series reaches each query's selector about 10 s late (FleetTimers.new_series_s), so a series
            # the ruler already read may still be missing under another filter: poll both checks together.
            deadline = time.monotonic() + 4 * fleet.timers.new_series_s
            while True:
                empty = []
                for title, expr in queries:
                    for cluster in fleet.clusters:
                        if not may_be_empty(expr) and not await prom.query(for_cluster(expr, cluster)):
                            empty.append(f"{title} [{cluster}]: {for_cluster(expr, cluster)}")
                # With the cluster variable on All, panels that keep `cluster` (per engine, per pool) show both.
                split = {}
                for title, expr in queries:
                    if KEEPS_CLUSTER.search(expr) and not may_be_empty(expr):
                        result = await prom.query(for_cluster(expr, ".*"))
                        split[f"{title}: {expr}"] = {r["metric"].get(C.LABEL_CLUSTER) for r in result}
                one_cluster = {k: v for k, v in split.items() if v != set(fleet.clusters)}
                if (not empty and not one_cluster) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(1.0)
            out["queries"], out["empty"], out["split"] = len(queries), empty, split
            out["dashboards_ready_s"] = time.monotonic() - started
            out["cluster_values"] = await stack.label_values(C.LABEL_CLUSTER, C.REQUESTS_RUNNING.name)

    asyncio.run(body())
    elapsed = time.monotonic() - started
    report = out["report"]
    timeline = incident_timeline(report)
    print(f"\nfleet up in {out['start_s']:.1f}s; whole test {elapsed:.1f}s\n{timeline}")

    # --- nothing left running
    assert_nothing_left(groups, children_before)

    # --- the page: on-call is paged for cluster a, by the service the incident degraded, in time
    assert report.fired is not None, f"no page within {scenario.max_incident_s}s:\n{timeline}"
    page = report.fired
    assert page.route == PAGE_ROUTE and page.group_labels.get(C.LABEL_CLUSTER) == fleet.incident_cluster, page.payload
    for alert in page.firing():
        assert alert["labels"][C.LABEL_CLUSTER] == fleet.incident_cluster, alert["labels"]
        assert alert["labels"][C.SLO.LABEL_SERVICE] == report.slo.service
    assert report.incident_at is not None
    took = page.received_at - report.incident_at
    print(f"paged {took:.1f}s after the fault (bound {out['bound']:.1f}s)")
    assert took <= out["bound"]

    # --- nothing for b: no notification names it, nothing fires there in vmalert
    notes = out["notes"]
    named = {a.get("labels", {}).get(C.LABEL_CLUSTER) for n in notes for a in n.alerts}
    assert named == {fleet.incident_cluster}, [n.payload for n in notes]
    firing_elsewhere = [a["labels"] for a in out["vmalert"] if a.get("state") == "firing"
                        and a.get("labels", {}).get(C.LABEL_CLUSTER) != fleet.incident_cluster]
    assert firing_elsewhere == []
    assert len([n for n in notes if n.route == PAGE_ROUTE and n.status == "firing"]) == 1

    # --- the rules ran over the fleet: the paged SLO's SLI is recorded for every cluster
    assert out.get("sli_clusters") == set(fleet.clusters), out.get("sli_clusters")

    # --- the fleet dashboard, from VictoriaMetrics: every query has data for each cluster; the variable lists both
    print(f"fleet dashboard: {out['queries']} queries x {len(fleet.clusters)} clusters, all with data "
          f"{out['dashboards_ready_s']:.1f}s into the test")
    assert out["queries"] > 20
    assert out["empty"] == [], "\n".join(out["empty"])
    assert out["cluster_values"] == sorted(fleet.clusters)
    assert len(out["split"]) >= 10, out["split"]
    one_cluster = {k: v for k, v in out["split"].items() if v != set(fleet.clusters)}
    assert one_cluster == {}, one_cluster


def _slowed_latency(report, t_from: float | None) -> float:
    """The longest E2E of the degraded pool's requests sent in the 3 s after the fault: how long an error takes
    to be counted (the tap counts a request when it completes)."""
    if report.load is None or t_from is None:
        return 0.0
    e2e = [rec.e2e for t, rec, _ in report.load.records(report.engine) if t_from <= t < t_from + 3.0
           and rec.e2e is not None]
    return max(e2e, default=0.0)


# ---------------------------------------------------------------------------------------------- the pieces, fast
def test_a_cluster_prometheus_only_scrapes_and_remote_writes_with_its_cluster_label():
    from demo.fleet import agent_config
    from demo.prometheus import PrometheusTimers

    config = agent_config("127.0.0.1:9400", PrometheusTimers(1.0, 1.0, 1.0), "a", "http://127.0.0.1:8428", 1.0)
    assert config["global"]["external_labels"] == {C.LABEL_CLUSTER: "a"}
    assert config["remote_write"][0]["url"] == "http://127.0.0.1:8428/api/v1/write"
    assert config["remote_write"][0]["queue_config"]["batch_send_deadline"] == "1s"
    assert "rule_files" not in config and "alerting" not in config  # the fleet's rules run in vmalert


def test_vmalert_runs_every_rule_file_with_the_fleet_settings(tmp_path):
    from demo.fleet import FleetTimers, vmalert_argv

    files = [tmp_path / "a.rules.yaml", tmp_path / "b.rules.yaml"]
    argv = vmalert_argv("vmalert", files, "http://vm", "http://am", 8880, FleetTimers())
    assert [a for a in argv if a.startswith("-rule=")] == [f"-rule={f}" for f in files]
    assert {"-disableAlertgroupLabel", "-rule.resendDelay=4s", "-datasource.url=http://vm",
            "-remoteWrite.url=http://vm", "-notifier.url=http://am"} <= set(argv)


def test_fleet_settings_name_pods_per_cluster_and_refuse_a_missing_incident_cluster():
    fleet = FleetSettings()
    names = [e.name for e in fleet.all_engines()]
    assert names[0].startswith(f"{fleet.incident_cluster}-") and len(set(names)) == len(names)
    with pytest.raises(ValueError, match="incident_cluster"):
        replace(fleet, incident_cluster="c").validate()
    with pytest.raises(ValueError, match="two or more"):
        replace(fleet, clusters=("a", "a")).validate()
