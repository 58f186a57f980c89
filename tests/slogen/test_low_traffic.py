"""The low-traffic guard: a page tier needs page_min_bad_events bad events in its long window, else its
`<tier>-low-traffic` ticket twin fires. Rule shapes, the spec and CLI options, and the generated promtool
tests run for real: one failed request at 6 requests/hour tickets and does not page, a full outage at that
traffic still pages, and rules without the guard (or with a wrong count) fail those tests."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from llmslo.durations import parse_prometheus_duration
from slogen.cli import main
from slogen.loaders import load_paths
from slogen.promtests.slo_tests import service_tests
from slogen.rules import generate
from slogen.rules.options import DEFAULT_PAGE_MIN_BAD_EVENTS, GenOptions
from slogen.writers import rule_file
from slogen.yamlio import dump
from tests.helpers.specs import load_path

REPO = Path(__file__).resolve().parents[2]
PLAIN = Path(__file__).parent / "fixtures" / "plain_sloth.yaml"

AVAIL = """\
version: "prometheus/v1"
service: "svc"
slos:
  - name: "availability"
    objective: 99.9
    sli: {plugin: {id: "llmslo/availability", options: {source: "tap"}}}
    alerting:
      name: SvcAvailability
      page_alert: {labels: {routing: pager}}
      ticket_alert: {labels: {routing: ticket}}
"""
FLT = 'sloth_id="svc-availability", sloth_service="svc", sloth_slo="availability"'


def _results(tmp_path: Path, text: str = AVAIL, **opts):
    spec = tmp_path / "svc.yaml"
    spec.write_text(text)
    return generate(load_path(spec), GenOptions(**opts))


def _alerts(results) -> dict[str, object]:
    return {rule.labels["slo_tier"]: rule for r in results for rule in r.rules.alerts.rules}


def _records(results) -> dict[str, object]:
    return {rule.record: rule for r in results for rule in r.rules.sli.rules}


def test_page_tiers_need_three_bad_events_in_their_long_window_and_tickets_below(tmp_path):
    assert DEFAULT_PAGE_MIN_BAD_EVENTS == 3
    results = _results(tmp_path)
    alerts = _alerts(results)
    assert list(alerts) == ["page-quick", "page-quick-low-traffic", "page-slow", "page-slow-low-traffic",
                            "ticket-quick", "ticket-slow", "no-data"]
    # the short window's last measured ratio (held while it sees no requests), within the long window
    # (recorded: slo:sli_error_held, while the 1h window's traffic expected fewer than 3 requests in the silence)
    burn = (f"max without (sloth_window) (slo:sli_error_held:ratio_rate5m{{{FLT}}} > (14.4 * 0.001))\nand\n"
            f"max without (sloth_window) (slo:sli_error:ratio_rate1h{{{FLT}}} > (14.4 * 0.001))\n")
    guard = f"max without (sloth_window) (slo:sli_errors:rate1h{{{FLT}}} * 3600 > 2.5)\n"
    assert alerts["page-quick"].expr == burn + "and\n" + guard
    assert alerts["page-quick-low-traffic"].expr == burn + "unless\n" + guard
    assert "slo:sli_errors:rate6h" in alerts["page-slow"].expr and "* 21600 > 2.5" in alerts["page-slow"].expr
    # the twin is a ticket, routed as the SLO's tickets are, and says why
    twin = alerts["page-quick-low-traffic"]
    assert twin.alert == alerts["page-quick"].alert == "SvcAvailability"
    assert {k: twin.labels[k] for k in ("severity", "sloth_severity", "routing", "long_window", "short_window")} == {
        "severity": "warning", "sloth_severity": "ticket", "routing": "ticket", "long_window": "1h", "short_window": "5m"}
    assert "fewer than 3 bad events happened in the last 1h" in twin.annotations["description"]
    # ticket tiers are not guarded
    assert "sli_errors" not in alerts["ticket-quick"].expr + alerts["ticket-slow"].expr
    # the page windows record their event rates, and their ratio from them (one query each)
    records = _records(results)
    assert records["slo:sli_error:ratio_rate1h"].expr == (f"slo:sli_errors:rate1h{{{FLT}}}\n/\n"
                                                          f"slo:sli_total:rate1h{{{FLT}}}\n")
    assert "[6h]" in records["slo:sli_errors:rate6h"].expr and "[6h]" in records["slo:sli_total:rate6h"].expr
    assert "slo:sli_errors:rate2h" not in records
    # the page tiers' short windows record their measured ratio (NaN, no requests, dropped)
    assert records["slo:sli_error_measured:ratio_rate5m"].expr == f"slo:sli_error:ratio_rate5m{{{FLT}}} >= 0\n"
    assert records["slo:sli_error_measured:ratio_rate30m"].expr == f"slo:sli_error:ratio_rate30m{{{FLT}}} >= 0\n"
    assert "slo:sli_error_measured:ratio_rate2h" not in records  # ticket tiers read their ratio as is
    # the held verdict: the last measured ratio within 1h, while measured now or the silence since the last
    # measurement expected fewer than 3 requests at the 1h window's rate (a drained cluster's: no time at all)
    assert records["slo:sli_error_held:ratio_rate5m"].expr == (
        f"last_over_time(slo:sli_error_measured:ratio_rate5m{{{FLT}}}[1h])\nand ignoring (sloth_window)\n"
        f"(slo:sli_error_measured:ratio_rate5m{{{FLT}}}\nor\n"
        f"(time() - last_over_time(slo:sli_error_measured:timestamp5m{{{FLT}}}[1h])) * ignoring (sloth_window) "
        f"slo:sli_total:rate1h{{{FLT}}} < 3)\n")
    assert "slo:sli_error:ratio_rate2h" in alerts["ticket-quick"].expr


def test_guard_off_gives_the_plain_tiers_and_ratios(tmp_path):
    off = _results(tmp_path, page_min_bad_events=0)
    alerts = _alerts(off)
    assert list(alerts) == ["page-quick", "page-slow", "ticket-quick", "ticket-slow", "no-data"]
    assert "sli_errors" not in alerts["page-quick"].expr
    records = _records(off)
    assert "slo:sli_errors:rate1h" not in records and "[1h]" in records["slo:sli_error:ratio_rate1h"].expr
    # and --sloth-compat output is Sloth's, whatever the minimum
    compat = [_results(tmp_path, sloth_compat=True, page_min_bad_events=n) for n in (0, 3, 10)]
    assert compat[0][0].rules.groups() == compat[1][0].rules.groups() == compat[2][0].rules.groups()
    assert "sli_errors" not in rule_file(compat[1][0].rules.groups())


def test_pages_off_no_guard_tickets_off_no_twin(tmp_path):
    no_page = _results(tmp_path, AVAIL.replace("page_alert: {labels: {routing: pager}}", "page_alert: {disable: true}"))
    assert list(_alerts(no_page)) == ["ticket-quick", "ticket-slow", "no-data"]
    assert "slo:sli_errors:rate1h" not in _records(no_page)
    no_ticket = _results(tmp_path, AVAIL.replace("ticket_alert: {labels: {routing: ticket}}",
                                                 "ticket_alert: {disable: true}"))
    alerts = _alerts(no_ticket)
    assert list(alerts) == ["page-quick", "page-slow", "no-data"] and "> 2.5" in alerts["page-quick"].expr


def test_raw_and_time_based_slis_are_not_guarded(tmp_path):
    results = {r.slo.id: r for r in generate(load_path(PLAIN), GenOptions())}
    raw = _alerts([results["api-search"]])
    assert "page-quick-low-traffic" not in raw and "sli_errors" not in raw["page-quick"].expr
    kv = _alerts(_results(tmp_path, AVAIL.replace('{id: "llmslo/availability", options: {source: "tap"}}',
                                                  '{id: "llmslo/kv-headroom"}').replace("99.9", "99")))
    assert "page-quick-low-traffic" not in kv  # kv-headroom's events are evaluations: never low
    assert "sli_errors" not in kv["page-quick"].expr
    assert "ApiCheckoutBudgetBurn" == _alerts([results["api-checkout"]])["page-quick-low-traffic"].alert


def test_spec_option_per_slo_and_per_spec(tmp_path, capsys):
    spec = tmp_path / "svc.yaml"
    spec.write_text(AVAIL.replace('service: "svc"\n', 'service: "svc"\npage_min_bad_events: 7\n')
                    + textwrap.indent(textwrap.dedent("""\
                        - name: "own"
                          objective: 99.9
                          page_min_bad_events: 0
                          sli: {plugin: {id: "llmslo/availability", options: {source: "tap"}}}
                          alerting: {name: SvcOwn}
                        """), "  "))
    slos = {s.id: s for s in load_path(spec)}
    assert slos["svc-availability"].page_min_bad_events == 7 and slos["svc-own"].page_min_bad_events == 0
    alerts = {(r.slo.id, x.labels["slo_tier"]): x for r in generate(list(slos.values()), GenOptions())
              for x in r.rules.alerts.rules}
    assert "* 3600 > 6.5" in alerts[("svc-availability", "page-quick")].expr
    assert ("svc-own", "page-quick-low-traffic") not in alerts
    # the CRD spells it pageMinBadEvents
    crd = tmp_path / "crd.yaml"
    crd.write_text(textwrap.dedent("""\
        apiVersion: sloth.slok.dev/v1
        kind: PrometheusServiceLevel
        metadata: {name: svc}
        spec:
          service: svc
          slos:
            - name: availability
              objective: 99.9
              pageMinBadEvents: 4
              sli: {events: {errorQuery: 'sum(rate(x{code="5"}[{{.window}}]))', totalQuery: 'sum(rate(x[{{.window}}]))'}}
              alerting: {name: SvcAvailability}
        """))
    assert load_path(crd)[0].page_min_bad_events == 4
    # bad values are errors naming the field; on a raw SLI it is a warning (no counts to guard)
    for bad in ("-1", "2.5", "true", '"3"'):
        spec.write_text(AVAIL.replace('    objective: 99.9\n', f'    objective: 99.9\n    page_min_bad_events: {bad}\n'))
        loaded = load_paths([spec], raise_errors=False)
        assert [e.field for e in loaded.errors] == ["slos[0].page_min_bad_events"], bad
        assert "0 turns the low-traffic guard off" in str(loaded.errors[0])
    spec.write_text(textwrap.dedent("""\
        version: "prometheus/v1"
        service: "svc"
        slos:
          - name: "raw"
            objective: 99.9
            page_min_bad_events: 3
            sli: {raw: {error_ratio_query: 'sum(rate(x{code="5"}[{{.window}}])) / sum(rate(x[{{.window}}]))'}}
            alerting: {name: SvcRaw}
        """))
    loaded = load_paths([spec], raise_errors=False)
    assert not loaded.errors and ["raw SLI" in str(w) for w in loaded.warnings] == [True]


def test_cli_option(tmp_path, capsys):
    spec = tmp_path / "svc.yaml"
    spec.write_text(AVAIL)
    cases = (([], "> 2.5"), (["--page-min-bad-events", "10"], "> 9.5"), (["--page-min-bad-events", "0"], None))
    for args, expected in cases:
        out = tmp_path / f"out{len(args)}{args[-1] if args else ''}"
        assert main(["build", str(spec), "--out", str(out), "--no-health-alerts", "--no-autoscaling", *args]) == 0
        rules = (out / "alerts" / "svc.rules.yaml").read_text()
        assert (expected in rules) if expected else ("page-quick-low-traffic" not in rules)
    with pytest.raises(SystemExit) as exc:
        main(["build", str(spec), "--out", str(tmp_path / "x"), "--page-min-bad-events", "-2"])
    assert exc.value.code == 2
    assert "not a whole number" in capsys.readouterr().err


def _low_traffic_doc(results, **kwargs) -> dict:
    doc, skipped = service_tests(results, "svc.rules.yaml", **kwargs)
    assert not skipped
    doc["tests"] = [g for g in doc["tests"] if "6 requests/hour" in g["name"]]
    assert len(doc["tests"]) == 1
    return doc


def _promtool(promtool: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, "test", "rules", "svc.test.yaml"], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def _expected(group: dict, cluster: str) -> dict[str, list[str]]:
    """eval_time -> the slo_tiers expected firing there for one cluster."""
    return {check["eval_time"]: sorted(a["exp_labels"]["slo_tier"] for a in check["exp_alerts"]
                                       if a["exp_labels"].get("cluster") == cluster)
            for check in group["alert_rule_test"] if check["alertname"] == "SvcAvailability"}


def test_generated_low_traffic_tests_pass_and_fail_without_the_guard(promtool, tmp_path):
    results = _results(tmp_path)
    rules = tmp_path / "svc.rules.yaml"
    rules.write_text(rule_file([g for r in results for g in r.rules.groups()]))
    doc = _low_traffic_doc(results)
    group = doc["tests"][0]
    assert group["name"] == (
        "svc-availability: one failed request at 6 requests/hour after 6h of clean traffic: tickets (ticket-quick, "
        "ticket-slow, page-quick-low-traffic, page-slow-low-traffic), no page; a full outage at 6 requests/hour after "
        "6h of clean traffic: page-quick pages 25m after it starts, at its 3rd failed request (page_min_bad_events: 3); "
        "held while a short window has no requests: page-quick fires 1x, resolves 1x, page-slow fires 1x, resolves 1x "
        "(checked at every evaluation) "
        "(one cluster each)")
    one, outage = _expected(group, "one-error"), _expected(group, "low-traffic-outage")
    # one error: the twins ticket, page-slow's for 30 minutes; nothing pages, ever
    assert not any(t in ("page-quick", "page-slow") for tiers in one.values() for t in tiers)
    assert one["6h"] == ["page-quick-low-traffic", "page-slow-low-traffic", "ticket-quick", "ticket-slow"]
    assert one["6h25m"][:1] == ["page-slow-low-traffic"] and "page-slow-low-traffic" not in one["6h30m"]
    # the outage (first failed request at 6h, one every 10 minutes): tickets, then pages with the 3rd
    # (page-quick's twin holds at 6h15m, whose 5m window saw no request: it no longer flaps)
    assert outage["6h15m"] == ["page-quick-low-traffic", "page-slow-low-traffic", "ticket-quick", "ticket-slow"]
    assert outage["6h20m"] == ["page-quick", "page-slow", "ticket-quick", "ticket-slow"]
    (tmp_path / "svc.test.yaml").write_text(dump(doc))
    proc = _promtool(promtool, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # without the guard the single error pages: the same tests fail
    unguarded = _results(tmp_path, page_min_bad_events=0)
    rules.write_text(rule_file([g for r in unguarded for g in r.rules.groups()]))
    proc = _promtool(promtool, tmp_path)
    assert proc.returncode != 0 and "page-quick" in proc.stdout + proc.stderr
    # a guard that counts one event as enough pages on it too
    rules.write_text(rule_file([g for r in results for g in r.rules.groups()]).replace("> 2.5)", "> 0.5)"))
    proc = _promtool(promtool, tmp_path)
    assert proc.returncode != 0 and "SvcAvailability" in proc.stdout + proc.stderr


def test_derived_page_windows_guard_from_the_base_rate(promtool, tmp_path):
    """--derive-above 0s: the guard reads avg_over_time of the base errors rate; the simulation models it
    and promtool agrees."""
    results = _results(tmp_path, derive_above=0)
    records = _records(results)
    assert records["slo:sli_errors:rate1h"].expr == f"avg_over_time(slo:sli_errors:rate5m{{{FLT}}}[1h])\n"
    assert "sum_over_time" in records["slo:sli_error:ratio_rate1h"].expr
    (tmp_path / "svc.rules.yaml").write_text(rule_file([g for r in results for g in r.rules.groups()]))
    doc = _low_traffic_doc(results)
    assert "no page" in doc["tests"][0]["name"] and "pages" in doc["tests"][0]["name"]
    (tmp_path / "svc.test.yaml").write_text(dump(doc))
    proc = _promtool(promtool, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_generated_tests_stage_low_traffic_and_keep_the_high_traffic_timings(repository_build):
    doc = yaml.safe_load((repository_build / "alerts" / "chat.test.yaml").read_text())
    names = [g["name"] for g in doc["tests"]]
    quiet = [n for n in names if "one failed request at 6 requests/hour" in n]
    assert {n.split(":")[0] for n in quiet} == {"chat-availability", "chat-ttft", "chat-tpot", "chat-goodput"}
    assert all("no page" in n and "a full outage at 6 requests/hour" in n and "pages" in n for n in quiet)
    # 99.9% full outage at high traffic: still page-quick one 5m evaluation in (52 s by the Workbook)
    assert any(n.startswith("chat-availability: full outage after 6h of clean traffic: page-quick fires 5m after it "
                            "starts (SRE Workbook: 52s") for n in names)
    for group in doc["tests"]:
        if "6 requests/hour" not in group["name"]:
            continue
        pages = {(a["exp_labels"]["cluster"], parse_prometheus_duration(c["eval_time"]))
                 for c in group["alert_rule_test"] for a in c["exp_alerts"]
                 if a["exp_labels"].get("sloth_severity") == "page"}
        assert pages and {cluster for cluster, _ in pages} == {"low-traffic-outage"}, group["name"]


def _expand(values: str) -> list[float | None]:
    """promtool's `a+bxn` / `_xn` notation, expanded (enough for the generated series)."""
    out: list[float | None] = []
    for token in values.split():
        if token.startswith("_"):
            out += [None] * (1 + (int(token[2:]) if "x" in token else 0))
            continue
        head, _, times = token.partition("x")
        n = int(times) if times else 0
        sign = "+" if "+" in head[1:] else "-" if "-" in head[1:] else ""
        if not sign:
            out.append(float(head))
            continue
        i = head.index(sign, 1)
        start, step = float(head[:i]), float(head[i + 1:]) * (1 if sign == "+" else -1)
        out += [start + step * k for k in range(n + 1)]
    return out


def test_the_first_failure_counts_when_its_series_is_at_0_before_it(promtool, tmp_path):
    """rate() never counts a series' first sample. The generated low-traffic tests stage the failed
    requests' series as the tap writes them now (at 0 from its start, then counting: exporter/tap/metrics.py),
    and the one failure at 6 requests/hour tickets as docs/slogen.md promises. Staged as a tap that created an
    outcome's series on its first use (absent, then born at 1), the same tests fail: nothing fires."""
    results = _results(tmp_path)
    (tmp_path / "svc.rules.yaml").write_text(rule_file([g for r in results for g in r.rules.groups()]))
    doc = _low_traffic_doc(results)
    series = doc["tests"][0]["input_series"]
    (bad,) = [s for s in series if 'cluster="one-error"' in s["series"] and 'outcome="upstream_error"' in s["series"]]
    values = _expand(bad["values"])
    assert values[0] == 0  # at 0 from the start: the first failure is an increase
    (tmp_path / "svc.test.yaml").write_text(dump(doc))
    proc = _promtool(promtool, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    staged = {s["series"]: s["values"] for s in series}
    for cluster in ("one-error", "low-traffic-outage"):  # each alone: the one failure, then the outage's 3rd
        for s in series:
            s["values"] = staged[s["series"]]
        (bad,) = [s for s in series if f'cluster="{cluster}"' in s["series"] and 'outcome="upstream_error"' in s["series"]]
        values = _expand(bad["values"])
        first = next(k for k, v in enumerate(values) if v)
        bad["values"] = " ".join(["_"] * first + [f"{v:g}" for v in values[first:]])
        (tmp_path / "svc.test.yaml").write_text(dump(doc))
        proc = _promtool(promtool, tmp_path)
        assert proc.returncode != 0 and f'cluster="{cluster}"' in proc.stdout + proc.stderr, cluster


def test_without_the_hold_the_low_traffic_outage_flaps_and_the_tests_fail(promtool, tmp_path):
    """Today's short condition read as is (0/0 = not burning): at 6 requests/hour page-quick's 5m window is empty
    every other evaluation, so page-quick fires and resolves again and again through the outage; the generated
    tests check every evaluation of the low-traffic scenarios and fail."""
    import re

    results = _results(tmp_path)
    rules = rule_file([g for r in results for g in r.rules.groups()])
    unheld = re.sub(r"slo:sli_error_held:ratio_rate(\w+)\{", r"slo:sli_error:ratio_rate\1{", rules)  # read, not recorded
    assert unheld != rules
    (tmp_path / "svc.test.yaml").write_text(dump(_low_traffic_doc(results)))
    (tmp_path / "svc.rules.yaml").write_text(rules)
    proc = _promtool(promtool, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tmp_path / "svc.rules.yaml").write_text(unheld)
    proc = _promtool(promtool, tmp_path)
    assert proc.returncode != 0 and 'slo_tier="page-quick"' in proc.stdout + proc.stderr
