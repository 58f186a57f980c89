"""End to end, for real: `slogen build` of slos/ with the demo's compressed window catalog, two simulated
engines (one with LoRA adapters) behind goodput taps, the node exporter with fake GPUs, Prometheus with the
generated rules, Alertmanager running slogen's generated routing with a webhook as on-call. A slow-down on
the interactive pool must page once (one notification for the service, however many of its SLOs and tiers
burn), with runbook and dashboard links and the routing labels, within the time the window catalog implies,
with no ticket sent while the page is open; the page's all-clear must follow recovery; the goodput
Prometheus reports must equal the load generator's own count; nothing may be left running.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from demo.alertmanager import PAGE_ROUTE, TICKET_ROUTE
from demo.incident import (
    IncidentReport,
    Scenario,
    expected_fire_bound,
    expected_resolve_bound,
    fastest_page_tier,
    pipeline_lag_s,
    sent_between,
)
from demo.procs import live_children_of
from demo.stack import StackSettings
from llmslo import conventions as C
from simulator.stats import percentile
from slogen.links import slo_dashboard_uid
from tests.helpers.incident_runs import assert_nothing_left, run_staged_incident
from tests.helpers.incident_runs import timeline as incident_timeline

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _need_binaries() -> None:
    missing = [b for b in ("prometheus", "prometheus-alertmanager") if not shutil.which(b) and not Path("/usr/bin", b).exists()]
    if missing:
        pytest.fail(f"{', '.join(missing)} not installed: run `make system-deps` (the integration test runs them for real)")


def _page_labels_from_spec(slo_paths, service: str, slo_name: str) -> dict[str, str]:
    """The labels the SLO file asks its page alert to carry (alerting.page_alert.labels)."""
    from exporter.tap.classes import expand_paths

    for path in expand_paths(slo_paths):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and doc.get("service") == service:
                for slo in doc.get("slos") or []:
                    if slo.get("name") == slo_name:
                        return dict(((slo.get("alerting") or {}).get("page_alert") or {}).get("labels") or {})
    return {}


def _incident_latency(report: IncidentReport, engine: str, since: float, until: float) -> float:
    """The longest E2E of the requests sent to the degraded pool in [since, until): how long an error
    takes to be counted (the tap counts a request when it completes)."""
    assert report.load is not None
    e2e = [rec.e2e for t, rec, _ in report.load.records(engine) if since <= t < until and rec.e2e is not None]
    return max(e2e, default=0.0)


def _last_completion(report: IncidentReport, engine: str, since: float, until: float) -> float:
    """When the last request sent to the degraded pool during the incident completed (wall clock)."""
    assert report.load is not None
    ends = [t + rec.e2e for t, rec, _ in report.load.records(engine) if since <= t < until and rec.e2e is not None]
    return max(ends, default=until)


def test_staged_incident_pages_with_runbook_resolves_and_goodput_matches(tmp_path):
    _need_binaries()
    started = time.monotonic()
    children_before = set(live_children_of(os.getpid()))  # other tests' business, not ours
    settings = StackSettings.fast(workdir=tmp_path / "stack")
    scenario = Scenario(steady_s=10.0, max_incident_s=60.0, max_resolve_s=200.0, segment_s=3.0)
    groups: list[int] = []
    out = run_staged_incident(settings, scenario, groups)
    elapsed = time.monotonic() - started
    report: IncidentReport = out["report"]
    slo = report.slo
    tier = fastest_page_tier(settings)  # page-quick: the first tier to fire on a sharp incident
    t_inc, t_rec = report.incident_at, report.recovered_at
    assert t_inc is not None and t_rec is not None
    timeline = incident_timeline(report)
    print(f"\nstack up in {out['start_s']:.1f}s; whole test {elapsed:.1f}s\n{timeline}")

    # --- nothing is left running: every process group the stack made is empty, no child of ours survives
    assert_nothing_left(groups, children_before)

    # --- the page: one notification for the degraded class's service, on the page route, with labels and links
    assert report.fired is not None, f"no page for {slo.service} within {scenario.max_incident_s}s:\n{timeline}"
    page = report.fired
    fired_at = page.received_at
    assert page.route == PAGE_ROUTE and page.status == "firing"
    assert page.firing(), page.payload
    for alert in page.firing():
        labels, ann = alert["labels"], alert["annotations"]
        assert labels[C.SLO.LABEL_SERVICE] == slo.service
        assert labels[C.SLO.LABEL_SEVERITY] == "page"
        assert labels[C.SLO.LABEL_ALERT_SEVERITY] == "critical"
        assert labels[C.LABEL_CLUSTER] == settings.cluster  # Prometheus' external label survives the rules
        for key, value in _page_labels_from_spec(settings.slo_paths, slo.service, labels[C.SLO.LABEL_SLO]).items():
            assert labels.get(key) == value, f"page alert lacks the spec's label {key}={value}: {labels}"
        runbook = urlsplit(ann["runbook_url"])
        assert runbook.scheme == "file" and Path(unquote(runbook.path)).is_file(), ann["runbook_url"]
        assert Path(unquote(runbook.path)).name == f"{labels[C.LABEL_ALERTNAME]}.md"
        assert ann["dashboard"].endswith("/d/" + slo_dashboard_uid(labels[C.SLO.LABEL_ID])), ann["dashboard"]
        assert ann.get("summary") and ann.get("description")

    # --- not before the incident, and within the time the catalog implies
    notes = out["notifications"]
    early = [n for n in notes if n.received_at < t_inc and n.route == PAGE_ROUTE]
    assert early == [], f"paged before the incident: {[n.payload for n in early]}"
    assert report.load is not None
    bad_share = report.load.bad_ttft_share(out["engine"], slo.threshold_s, t_inc, fired_at)
    assert bad_share is not None and bad_share > 0.5, f"the slow-down did not degrade TTFT (bad share {bad_share})"
    lag = _incident_latency(report, out["engine"], t_inc, t_inc + 3.0)
    timers = out["timers"]
    bound = expected_fire_bound(settings, timers, slo, tier, bad_share, lag)
    print(f"paged {fired_at - t_inc:.1f}s after the fault (bound {bound:.1f}s: bad share {bad_share:.2f}, "
          f"slowed E2E {lag:.1f}s, pipeline {pipeline_lag_s(settings, timers):.1f}s)")
    assert fired_at - t_inc <= bound

    # --- the all-clear after recovery: the same group, every alert in it resolved
    assert report.resolved is not None, f"no all-clear within {scenario.max_resolve_s}s:\n{timeline}"
    all_clear = report.resolved
    assert all_clear.route == PAGE_ROUTE and all_clear.group_key == page.group_key and all_clear.received_at > t_rec
    assert all(a["status"] == "resolved" for a in all_clear.alerts)
    tail = _last_completion(report, out["engine"], t_inc, t_rec) - t_rec
    resolve_bound = expected_resolve_bound(settings, timers, tail)
    print(f"all clear {all_clear.received_at - t_rec:.1f}s after recovery (bound {resolve_bound:.1f}s: the last slowed "
          f"request completed {tail:.1f}s after recovery)")
    assert all_clear.received_at - t_rec <= resolve_bound

    # --- one incident, one page: one page notification, no ticket while it was open
    pages = [n for n in notes if n.route == PAGE_ROUTE and n.status == "firing"]
    tickets = sent_between(notes, TICKET_ROUTE, fired_at, all_clear.received_at)
    print(f"on-call notifications: {len(pages)} page, {sum(1 for n in notes if n.route == TICKET_ROUTE and n.status == 'firing')}"
          f" ticket ({len(tickets)} while the page was open)")
    assert len(pages) == 1, [n.payload for n in pages]
    assert tickets == [], [n.payload for n in tickets]

    # --- goodput: Prometheus (taps -> exporter -> Prometheus) equals the load generator's own count
    good_load = report.load.good()
    good_prom = out["good_prom"]
    assert good_load > 0 and report.load.requests() > good_load  # both good and bad requests were judged
    if good_prom != good_load:
        near = _near_thresholds(report)
        pytest.fail(f"goodput: Prometheus {good_prom} != load generator {good_load} of {report.load.requests()} "
                    f"requests; the taps counted outcomes {out['outcomes']}; requests within 2 ms of a threshold "
                    f"and other clues: {near}")


def _near_thresholds(report: IncidentReport) -> list[str]:
    """Diagnostics for a goodput mismatch: requests whose client-side timing sits on a threshold's edge."""
    out = []
    assert report.load is not None
    for _, res in report.load.segments:
        for r in res.values():
            for rec, o in zip(r.records, r.objectives, strict=True):
                for name, value, limit in (("ttft", rec.ttft, o.ttft), ("tpot", rec.tpot, o.tpot)):
                    if value is not None and limit is not None and abs(value - limit) < 0.002:
                        out.append(f"{r.engine.name} {name}={value:.4f} (threshold {limit})")
    failed = [rec.error for _, res in report.load.segments for r in res.values() for rec in r.records if not rec.ok]
    if failed:
        out.append(f"failed requests: {sorted(set(failed))}")
    p99 = percentile([rec.e2e for _, res in report.load.segments for r in res.values() for rec in r.records
                      if rec.e2e is not None], 99)
    out.append(f"E2E p99 {p99}")
    return out
