"""OpenSLO inputs: v1alpha as Sloth reads it, v1 SLO/SLI with inline indicators, refs, good/bad/raw."""

from __future__ import annotations

import textwrap

import pytest

from slogen.errors import SpecErrors
from slogen.model import EventsSLI, RatioSLI, RawSLI
from slogen.rules import generate
from slogen.rules.options import GenOptions
from tests.helpers.specs import load_path

V1 = """\
apiVersion: openslo/v1
kind: SLI
metadata: {name: search-errors}
spec:
  ratioMetric:
    counter: true
    bad: {metricSource: {type: Prometheus, spec: {query: 'sum(rate(http_requests_total{code=~"5.."}[{{.window}}]))'}}}
    total: {metricSource: {type: Prometheus, spec: {query: 'sum(rate(http_requests_total[{{.window}}]))'}}}
---
apiVersion: openslo/v1
kind: SLO
metadata: {name: search-availability, labels: {team: [a, b], "bad.key": x}}
spec:
  service: web
  indicatorRef: search-errors
  timeWindow: [{duration: 28d, isRolling: true}]
  budgetingMethod: Occurrences
  objectives: [{displayName: good, target: 0.995}]
---
apiVersion: openslo/v1
kind: SLO
metadata: {name: search-latency}
spec:
  service: web
  indicator:
    metadata: {name: fast}
    spec:
      ratioMetric:
        counter: true
        good: {metricSource: {type: Prometheus, spec: {query: 'sum(rate(lat_bucket{le="0.3"}[{{.window}}]))'}}}
        total: {metricSource: {type: Prometheus, spec: {query: 'sum(rate(lat_count[{{.window}}]))'}}}
  timeWindow: [{duration: 30d, isRolling: true}]
  budgetingMethod: Occurrences
  objectives: [{target: 0.99}, {targetPercent: 95}]
---
apiVersion: openslo/v1
kind: SLO
metadata: {name: wifi}
spec:
  service: home
  indicator:
    metadata: {name: wifi}
    spec:
      ratioMetric:
        rawType: success
        raw: {metricSource: {type: Prometheus, spec: {query: 'avg(ok_ratio[{{.window}}])'}}}
  budgetingMethod: Occurrences
  objectives: [{target: 0.9}]
"""


def test_v1_documents_map_to_the_model(tmp_path):
    p = tmp_path / "o.yaml"
    p.write_text(V1)
    slos = {s.id: s for s in load_path(p)}
    assert set(slos) == {"web-search-availability", "web-search-latency-0", "web-search-latency-1", "home-wifi"}
    avail = slos["web-search-availability"]
    assert isinstance(avail.sli, EventsSLI) and "5.." in avail.sli.error_query
    assert avail.objective == pytest.approx(99.5) and avail.period == 28 * 86400_000
    assert avail.labels == {"team": "a,b"} and avail.origin.spec == "openslo/v1"
    assert isinstance(slos["web-search-latency-1"].sli, RatioSLI) and slos["web-search-latency-1"].objective == 95
    assert isinstance(slos["home-wifi"].sli, RawSLI) and slos["home-wifi"].sli.error_ratio_query.startswith("1 - (")
    # good/total becomes traffic-weighted events in the default mode
    res = generate([slos["web-search-latency-0"]], GenOptions())[0]
    errors = next(r for r in res.rules.sli.rules if r.record == "slo:sli_errors:rate5m")
    assert "lat_count[5m]" in errors.expr and "lat_bucket" in errors.expr


def test_v1_errors(tmp_path):
    p = tmp_path / "o.yaml"
    p.write_text(textwrap.dedent("""\
        apiVersion: openslo/v1
        kind: SLO
        metadata: {name: s1}
        spec:
          service: web
          indicatorRef: missing
          timeWindow: [{duration: 1w, isRolling: false}]
          budgetingMethod: Timeslices
          objectives: [{target: 0.99}]
        """))
    with pytest.raises(SpecErrors) as e:
        load_path(p)
    fields = {err.field: err for err in e.value.errors}
    assert set(fields) == {"spec.budgetingMethod", "spec.timeWindow[0].isRolling", "spec.indicatorRef"}
    assert all(err.slo == "web-s1" and err.fix for err in e.value.errors)


def test_shared_go_sdk_examples_are_read_or_rejected_clearly(openslo_dir):
    """The OpenSLO SDK examples use Datadog sources, calendar windows and Timeslices: each is a named error."""
    with pytest.raises(SpecErrors) as e:
        load_path(openslo_dir / "go-sdk-v1-examples" / "slos.yaml")
    messages = " ".join(err.message for err in e.value.errors)
    assert "calendar" in messages and "Timeslices" in messages
    assert all(err.file.endswith("slos.yaml") and err.field for err in e.value.errors)


def test_v1alpha_as_sloth(sloth_testdata):
    (slo,) = load_path(sloth_testdata / "in-openslo.yaml")
    assert slo.id == "svc01-slo1-0" and slo.objective == pytest.approx(99.9) and isinstance(slo.sli, RatioSLI)


ALERTING = """\
apiVersion: openslo/v1
kind: AlertCondition
metadata: {name: fast-burn}
spec:
  severity: page
  condition: {kind: burnrate, op: gt, threshold: 14.4, lookbackWindow: 1h, alertAfter: 2m}
---
apiVersion: openslo/v1
kind: AlertPolicy
metadata: {name: pager}
spec:
  alertWhenBreaching: true
  conditions: [{conditionRef: fast-burn}]
---
apiVersion: openslo/v1
kind: SLO
metadata: {name: availability}
spec:
  service: web
  indicator:
    metadata: {name: ok}
    spec:
      ratioMetric:
        bad: {metricSource: {type: Prometheus, spec: {query: 'sum(rate(http_requests_total{code=~"5.."}[{{.window}}]))'}}}
        total: {metricSource: {type: Prometheus, spec: {query: 'sum(rate(http_requests_total[{{.window}}]))'}}}
  objectives: [{target: 0.995}]
  alertPolicies:
    - alertPolicyRef: pager
    - kind: AlertPolicy
      metadata: {name: slack}
      spec:
        alertWhenBreaching: true
        conditions:
          - kind: AlertCondition
            metadata: {name: slow-burn}
            spec:
              severity: warning
              condition: {kind: burnrate, op: gt, threshold: 1, lookbackWindow: 3d, alertAfter: 1h}
    - kind: AlertPolicy
      metadata: {name: silent}
      spec: {alertWhenBreaching: false, conditions: [{conditionRef: fast-burn}]}
"""


def test_v1_alert_policies_switch_on_page_and_ticket_tiers(tmp_path):
    from slogen.loaders import load_paths

    p = tmp_path / "o.yaml"
    p.write_text(ALERTING)
    result = load_paths([p])
    (slo,) = result.slos
    a = slo.alerting
    assert a.name == "WebAvailabilityBudgetBurn"
    assert not a.page.disable and a.page.labels == {"openslo_alert_policy": "pager"}
    assert not a.ticket.disable and a.ticket.labels == {"openslo_alert_policy": "slack"}
    warnings = {w.field: w for w in result.warnings}
    assert "spec.alertPolicies[2]" in warnings, "a policy that never alerts is pointed out"
    burn = warnings["spec.alertPolicies[0].spec.conditions[0].spec.condition"]
    assert "14.4" in burn.message and "page tiers" in burn.message and burn.fix
    rules = generate([slo], GenOptions())[0].rules.alerts.rules
    tiers = {r.labels.get("slo_tier"): r.labels for r in rules}
    assert set(tiers) == {"page-quick", "page-slow", "ticket-quick", "ticket-slow", "no-data",
                          "page-quick-low-traffic", "page-slow-low-traffic"}  # the low-traffic guard's tickets
    assert tiers["page-quick"]["openslo_alert_policy"] == "pager"
    assert tiers["ticket-slow"]["openslo_alert_policy"] == "slack"
    assert tiers["page-quick-low-traffic"]["openslo_alert_policy"] == "slack"


def test_v1_alert_policy_errors_name_the_field_and_fix(tmp_path):
    p = tmp_path / "o.yaml"
    p.write_text(ALERTING.replace("alertPolicyRef: pager", "alertPolicyRef: nope").replace(
        "kind: burnrate, op: gt, threshold: 1,", "kind: anomaly, op: gt, threshold: 1,"))
    with pytest.raises(SpecErrors) as e:
        load_path(p)
    fields = {err.field: err for err in e.value.errors}
    assert set(fields) == {"spec.alertPolicies[0].alertPolicyRef", "spec.alertPolicies[1].spec.conditions[0].spec.condition.kind"}
    assert "nope" in fields["spec.alertPolicies[0].alertPolicyRef"].message
    assert all(err.fix and err.line and err.slo == "web-availability" for err in e.value.errors)


def test_sdk_inline_alert_policies_resolve(openslo_dir):
    """The OpenSLO SDK's inlined policy example: a referenced and an inline condition, both burn rates."""
    from slogen.loaders import load_paths

    result = load_paths([openslo_dir / "go-sdk-test_data" / "inline-inputs-v1_slo.yaml"], raise_errors=False)
    policy_errors = [e for e in result.errors if "alertPolicies" in e.field]
    assert policy_errors == [], policy_errors  # its other errors are the Timeslices / calendar ones
    assert any("memory-usage-breach" in w.message for w in result.warnings)
