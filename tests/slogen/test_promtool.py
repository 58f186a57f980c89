"""Real promtool over every generated output: `check rules` on rule files and PrometheusRules,
`test rules` on the generated unit tests (outage, slow burn, engine hang, no data), run in parallel."""

from __future__ import annotations

import re
import subprocess
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from llmslo import conventions as c
from llmslo.durations import SECOND
from slogen.generate import generate_file
from slogen.promtests.slo_tests import service_tests
from slogen.rules import generate
from slogen.rules.options import GenOptions
from slogen.writers import rule_file
from slogen.yamlio import dump
from tests.helpers.specs import load_path, slo_entry, sloth_spec

REPO = Path(__file__).resolve().parents[2]


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)  # a hang guard: the chat tests take 45 s of CPU, minutes on a loaded machine


def test_generated_rules_pass_promtool_check(promtool, tmp_path, sloth_testdata):
    files = sorted((REPO / "alerts").glob("*.rules.yaml"))
    assert files
    for crd in sorted((REPO / "deploy" / "generated").glob("prometheusrule-*.yaml")):
        spec = yaml.safe_load(crd.read_text())["spec"]
        out = tmp_path / crd.name
        out.write_text(yaml.safe_dump(spec))
        files.append(out)
    # slogen's default mode on every Sloth input too
    for inp in ("in-base.yaml", "in-multifile.yaml", "in-openslo.yaml"):
        for i, doc in enumerate(yaml.safe_load_all(generate_file(str(sloth_testdata / inp), GenOptions()))):
            out = tmp_path / f"default-{i}-{inp}"
            out.write_text(yaml.safe_dump(doc))
            files.append(out)
    proc = run([promtool, "check", "rules", *map(str, files)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_generated_unit_tests_pass(promtool, repository_build):
    """The promtool tests `slogen build` writes for this repository (made here: the repository commits none)."""
    tests = sorted((repository_build / "alerts").glob("*.test.yaml"))
    assert {t.name for t in tests} == {"chat.test.yaml", "batch.test.yaml", "fleet.test.yaml", "llmslo-health.test.yaml",
                                         "llmslo-capacity.test.yaml"}
    with ThreadPoolExecutor(max_workers=len(tests)) as pool:
        results = list(pool.map(lambda t: run([promtool, "test", "rules", t.name], cwd=t.parent), tests))
    for t, proc in zip(tests, results, strict=True):
        assert proc.returncode == 0, f"{t.name}:\n{proc.stdout}{proc.stderr}"
        assert "SUCCESS" in proc.stdout
    doc = yaml.safe_load((repository_build / "alerts" / "chat.test.yaml").read_text())
    names = [g["name"] for g in doc["tests"]]
    assert any("full outage" in n and "slow burn" in n for n in names)  # both scenarios, one cluster each
    assert any("no source series" in n for n in names)
    # A threshold changed on running taps: healthy and hurt, per tap-sourced latency SLO (issue 35).
    changed = [n.split(":")[0] for n in names if "threshold changed on running taps" in n]
    assert sorted(changed) == ["chat-tpot", "chat-tpot", "chat-ttft", "chat-ttft"]


def test_every_tap_slo_has_a_generated_hang_scenario_that_fires(repository_build):
    """A hung engine must burn every tap SLO: each one's generated tests stage a 2h hang per late outcome,
    and expect its tiers to fire in both (the pages where the SLO pages); the engine's SLOs cannot see it."""
    expected = {"chat": {"availability", "ttft", "tpot", "goodput"}, "batch": {"availability", "ttft", "tpot", "goodput"},
                "fleet": set()}
    for service, slos in expected.items():
        doc = yaml.safe_load((repository_build / "alerts" / f"{service}.test.yaml").read_text())
        hangs = {g["name"].split(":")[0]: g for g in doc["tests"] if "engine hangs for 2h" in g["name"]}
        assert set(hangs) == {f"{service}-{slo}" for slo in slos}
        tiers = ("page-quick", "page-slow") if service == "chat" else ("ticket-quick",)
        for slo_id, group in hangs.items():
            fired = {(a["exp_labels"]["cluster"], a["exp_labels"]["slo_tier"])
                     for check in group["alert_rule_test"] for a in check["exp_alerts"]}
            assert {(f"hang-{o}", t) for o in c.TAP_LATE_OUTCOMES for t in tiers} <= fired, slo_id
            late = [s["series"] for s in group["input_series"] if s["values"].startswith("_")]
            assert len(late) == len(c.TAP_LATE_OUTCOMES), slo_id  # the late series appear with the hang


AVAIL = sloth_spec("svc", slo_entry(
    "availability", 99.9, '{plugin: {id: "llmslo/availability", options: {source: "tap"}}}',
    alerting="{name: SvcAvailability}"))


def test_full_outage_at_999_pages_after_52s_plus_one_evaluation(promtool, tmp_path):
    """At 15 s resolution the generated test pins page-quick between 45 s and 60 s after the outage
    starts: the SRE Workbook's 52 s (2% of a 30d budget in 1h at 100% errors), rounded up to the
    next evaluation."""
    spec = tmp_path / "svc.yaml"
    spec.write_text(AVAIL)
    results = generate(load_path(spec), GenOptions())
    (tmp_path / "svc.rules.yaml").write_text(rule_file([g for r in results for g in r.rules.groups()]))
    doc, skipped = service_tests(results, "svc.rules.yaml", step=15 * SECOND, history=3600 * SECOND)
    assert not skipped
    outage = doc["tests"][0]
    assert "page-quick fires 1m after it starts (SRE Workbook: 52s, plus at most one 15s evaluation)" in outage["name"]
    # the checks bracket the transition: not firing 45 s in, page-quick firing at 60 s
    history = 3600
    checks = {c["eval_time"]: c for c in outage["alert_rule_test"]}
    start = history - 15  # the outage's first bad step ends at `history`
    before, after = checks[_dur(start + 45)], checks[_dur(start + 60)]
    def page_quick(check):
        return [a for a in check["exp_alerts"]
                if a["exp_labels"]["cluster"] == "outage" and a["exp_labels"]["slo_tier"] == "page-quick"]

    assert page_quick(before) == [] and len(page_quick(after)) == 1
    # promtool only evaluates up to the last check: keep the first ten minutes of the outage
    limit = start + 600
    outage["alert_rule_test"] = [c for c in outage["alert_rule_test"] if _secs(c["eval_time"]) <= limit]
    doc["tests"] = [outage]
    (tmp_path / "svc.test.yaml").write_text(dump(doc))
    proc = run([promtool, "test", "rules", "svc.test.yaml"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # ... and the same test fails against wrong rules: a 10x looser page-quick threshold fires too late
    rules = tmp_path / "svc.rules.yaml"
    rules.write_text(rules.read_text().replace("(14.4 * 0.001)", "(14.4 * 0.01)"))
    proc = run([promtool, "test", "rules", "svc.test.yaml"], cwd=tmp_path)
    assert proc.returncode != 0 and "SvcAvailability" in proc.stdout + proc.stderr


def _secs(text: str) -> int:
    from llmslo.durations import parse_prometheus_duration

    return parse_prometheus_duration(text) // 1000


def _dur(seconds: int) -> str:
    from llmslo.durations import format_prometheus_duration

    return format_prometheus_duration(seconds * 1000)


LATENCY = sloth_spec("svc", slo_entry(
    "ttft", 99, '{plugin: {id: "llmslo/latency", options: {metric: "ttft", threshold: "1", slo_class: "interactive"}}}',
    alerting="{page_alert: {disable: true}, ticket_alert: {disable: true}}"))


def test_latency_threshold_matches_both_le_spellings(promtool, tmp_path):
    spec = tmp_path / "svc.yaml"
    spec.write_text(LATENCY)
    results = generate(load_path(spec), GenOptions())
    (tmp_path / "r.yaml").write_text(rule_file([g for r in results for g in r.rules.groups()]))
    (tmp_path / "t.yaml").write_text(textwrap.dedent("""\
        rule_files: [r.yaml]
        evaluation_interval: 1m
        tests:
          - interval: 1m
            input_series:
              # Go clients / Prometheus 2 spell the bound "1" (cluster a), Python clients / Prometheus 3 "1.0" (cluster b)
              - {series: 'llm_tap_time_to_first_token_seconds_bucket{cluster="a",slo_class="interactive",le="1"}', values: '0+90x20'}
              - {series: 'llm_tap_time_to_first_token_seconds_count{cluster="a",slo_class="interactive"}', values: '0+100x20'}
              - {series: 'llm_tap_time_to_first_token_seconds_bucket{cluster="b",slo_class="interactive",le="1.0"}', values: '0+80x20'}
              - {series: 'llm_tap_time_to_first_token_seconds_bucket{cluster="b",slo_class="interactive",le="10.0"}', values: '0+99x20'}
              - {series: 'llm_tap_time_to_first_token_seconds_count{cluster="b",slo_class="interactive"}', values: '0+100x20'}
            promql_expr_test:
              - expr: round(slo:sli_error:ratio_rate5m{sloth_id="svc-ttft"}, 0.001)
                eval_time: 10m
                exp_samples:
                  - {labels: '{cluster="a", sloth_id="svc-ttft", sloth_service="svc", sloth_slo="ttft", sloth_window="5m"}', value: 0.1}
                  - {labels: '{cluster="b", sloth_id="svc-ttft", sloth_service="svc", sloth_slo="ttft", sloth_window="5m"}', value: 0.2}
        """))
    proc = run([promtool, "test", "rules", "t.yaml"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_tap_latency_sli_counts_late_requests_per_cluster(promtool, tmp_path):
    """Real evaluation of the generated latency rules, one cluster per case: a late series the tap has not
    created yet costs nothing (a); a hang with the histograms flat (b) or never created (c) gives an
    error ratio of 1, not an empty result; mixed traffic counts each late request as too slow (d)."""
    spec = tmp_path / "svc.yaml"
    spec.write_text(LATENCY)
    results = generate(load_path(spec), GenOptions())
    (tmp_path / "r.yaml").write_text(rule_file([g for r in results for g in r.rules.groups()]))
    count, bucket = "llm_tap_time_to_first_token_seconds_count", "llm_tap_time_to_first_token_seconds_bucket"
    late = "llm_tap_requests_total"
    series = [
        (f'{count}{{cluster="a",slo_class="interactive"}}', "0+100x20"),
        (f'{bucket}{{cluster="a",slo_class="interactive",le="1.0"}}', "0+90x20"),
        (f'{count}{{cluster="b",slo_class="interactive"}}', "0+0x20"),
        (f'{bucket}{{cluster="b",slo_class="interactive",le="1.0"}}', "0+0x20"),
        (f'{late}{{cluster="b",slo_class="interactive",outcome="upstream_timeout"}}', "0+50x20"),
        (f'{late}{{cluster="c",slo_class="interactive",outcome="client_gave_up"}}', "0+20x20"),
        (f'{count}{{cluster="d",slo_class="interactive"}}', "0+100x20"),
        (f'{bucket}{{cluster="d",slo_class="interactive",le="1.0"}}', "0+90x20"),
        (f'{late}{{cluster="d",slo_class="interactive",outcome="upstream_timeout"}}', "0+60x20"),
        (f'{late}{{cluster="d",slo_class="interactive",outcome="client_gave_up"}}', "0+40x20"),
        # neither late nor slow: left out of the latency SLI
        (f'{late}{{cluster="d",slo_class="interactive",outcome="client_disconnected"}}', "0+1000x20"),
    ]
    expected = {"a": 0.1, "b": 1, "c": 1, "d": 0.55}  # d: (10 slow + 100 late) / (100 completed + 100 late)
    labels = 'cluster="{}", sloth_id="svc-ttft", sloth_service="svc", sloth_slo="ttft", sloth_window="{}"'
    tests = [{"expr": f'round(slo:sli_error:ratio_rate{w}{{sloth_id="svc-ttft"}}, 0.001)', "eval_time": "10m",
              "exp_samples": [{"labels": "{" + labels.format(k, w) + "}", "value": v} for k, v in expected.items()]}
             for w in ("5m", "30m")]
    doc = {"rule_files": ["r.yaml"], "evaluation_interval": "1m",
           "tests": [{"interval": "1m", "input_series": [{"series": s, "values": v} for s, v in series],
                      "promql_expr_test": tests}]}
    (tmp_path / "t.yaml").write_text(dump(doc))
    proc = run([promtool, "test", "rules", "t.yaml"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hang_test_fails_against_latency_rules_that_ignore_late_requests(promtool, tmp_path, monkeypatch):
    """The generated hang scenario pages; against the old latency rules (histograms only) it fails,
    because a hung engine completes nothing and those rules see no events at all."""
    from slogen.plugins import llm

    spec = tmp_path / "svc.yaml"
    spec.write_text(LATENCY.replace("alerting: {page_alert: {disable: true}, ticket_alert: {disable: true}}",
                                    "alerting: {name: SvcTTFT}"))
    results = generate(load_path(spec), GenOptions())
    doc, skipped = service_tests(results, "svc.rules.yaml")
    assert not skipped
    hangs = [g for g in doc["tests"] if "engine hangs for 2h" in g["name"]]
    assert len(hangs) == 1 and "every request ending as upstream_timeout" in hangs[0]["name"]
    assert "the same hang, every request ending as client_gave_up (one cluster each)" in hangs[0]["name"]
    paged = {(a["exp_labels"]["cluster"], a["exp_labels"]["slo_tier"])
             for check in hangs[0]["alert_rule_test"] for a in check["exp_alerts"]}
    assert {(f"hang-{o}", t) for o in c.TAP_LATE_OUTCOMES for t in ("page-quick", "page-slow")} <= paged
    doc["tests"] = hangs
    (tmp_path / "svc.test.yaml").write_text(dump(doc))
    (tmp_path / "svc.rules.yaml").write_text(rule_file([g for r in results for g in r.rules.groups()]))
    proc = run([promtool, "test", "rules", "svc.test.yaml"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    monkeypatch.setattr(llm, "_with_late", lambda count, good, late: (f"{count}\n-\n{good}", count))
    old = generate(load_path(spec), GenOptions())
    (tmp_path / "svc.rules.yaml").write_text(rule_file([g for r in old for g in r.rules.groups()]))
    proc = run([promtool, "test", "rules", "svc.test.yaml"], cwd=tmp_path)
    assert proc.returncode != 0 and "SvcTTFT" in proc.stdout + proc.stderr


def _one_series_set(group: dict) -> dict:
    """The same staged traffic as the tap exposed it before issue 35: no `buckets` label, so the old and the new
    configuration's series are one: `_count` goes on through the reload (a counter reset) and the new threshold's
    bucket is born at it."""
    merged: dict[str, str] = {}
    for s in group["input_series"]:
        key = re.sub(rf'{c.LABEL_BUCKETS}="[^"]*",?', "", s["series"]).replace(",}", "}")
        old = merged.get(key)
        merged[key] = s["values"] if old is None else old.removesuffix(" stale") + " " + s["values"].split(" ", 1)[1]
    return {**group, "input_series": [{"series": k, "values": v} for k, v in merged.items()]}


def test_a_threshold_change_on_running_taps_pages_nothing_and_keeps_the_budget(promtool, tmp_path):
    """Issue 35, on the example SLOs: per tap-sourced latency SLO, a threshold change on a healthy service (the old
    configuration's series until the change, then the new ones) fires nothing and keeps the period budget; on a
    hurt one (every request slower than the new threshold after it) the tiers fire when simulate() says. The same
    healthy traffic exposed as one series set across the reload pages and burns the budget: the tests see it."""
    results = generate(load_path(REPO / "slos" / "chat.yaml"), GenOptions())
    (tmp_path / "chat.rules.yaml").write_text(rule_file([g for r in results for g in r.rules.groups()]))
    doc, _ = service_tests(results, "chat.rules.yaml")
    groups = [g for g in doc["tests"] if "threshold changed on running taps" in g["name"]]
    healthy = [g for g in groups if "every request fast" in g["name"]]
    hurt = [g for g in groups if "slower than" in g["name"]]
    assert sorted(g["name"].split(":")[0] for g in healthy) == sorted(g["name"].split(":")[0] for g in hurt) == [
        "chat-tpot", "chat-ttft"]
    for g in hurt:  # the pages fire, one evaluation after the new series' first sample
        assert "page-quick fires 5m after the change" in g["name"]
        fired = {a["exp_labels"]["slo_tier"] for check in g["alert_rule_test"] for a in check["exp_alerts"]}
        assert {"page-quick", "page-slow"} <= fired
    doc["tests"] = groups
    (tmp_path / "chat.test.yaml").write_text(dump(doc))
    proc = run([promtool, "test", "rules", "chat.test.yaml"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc["tests"] = [_one_series_set(g) for g in healthy]
    (tmp_path / "chat.test.yaml").write_text(dump(doc))
    proc = run([promtool, "test", "rules", "chat.test.yaml"], cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    for alert in ("ChatTTFTBudgetBurn", "ChatTPOTBudgetBurn"):
        assert f'ALERTS{{alertname=\\"{alert}\\",alertstate=\\"firing\\"}}' in out, out  # it paged ...
    assert out.count("period_error_budget_remaining") >= 2 and out.count("got: {} 0E+00") == 2, out  # ... and burnt
