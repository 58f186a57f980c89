"""Real promtool over every generated output: `check rules` on rule files and PrometheusRules,
`test rules` on the generated unit tests (outage, slow burn, no data), run in parallel."""

from __future__ import annotations

import subprocess
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from slogen.durations import SECOND
from slogen.generate import generate_file
from slogen.generators import generate
from slogen.generators.options import GenOptions
from slogen.generators.tests import service_tests
from slogen.loaders import load_path
from slogen.writers import rule_file
from slogen.yamlio import dump

REPO = Path(__file__).resolve().parents[2]


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


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


def test_generated_unit_tests_pass(promtool):
    tests = sorted((REPO / "alerts").glob("*.test.yaml"))
    assert {t.name for t in tests} == {"chat.test.yaml", "batch.test.yaml", "fleet.test.yaml", "llmslo-health.test.yaml"}
    with ThreadPoolExecutor(max_workers=len(tests)) as pool:
        results = list(pool.map(lambda t: run([promtool, "test", "rules", t.name], cwd=t.parent), tests))
    for t, proc in zip(tests, results):
        assert proc.returncode == 0, f"{t.name}:\n{proc.stdout}{proc.stderr}"
        assert "SUCCESS" in proc.stdout
    doc = yaml.safe_load((REPO / "alerts" / "chat.test.yaml").read_text())
    names = [g["name"] for g in doc["tests"]]
    assert any("full outage" in n and "slow burn" in n for n in names)  # both scenarios, one cluster each
    assert any("no source series" in n for n in names)


AVAIL = """\
version: "prometheus/v1"
service: "svc"
slos:
  - name: "availability"
    objective: 99.9
    sli: {plugin: {id: "llmslo/availability", options: {source: "tap"}}}
    alerting: {name: SvcAvailability}
"""


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
    from slogen.durations import parse_duration

    return parse_duration(text) // 1000


def _dur(seconds: int) -> str:
    from slogen.durations import format_duration

    return format_duration(seconds * 1000)


LATENCY = """\
version: "prometheus/v1"
service: "svc"
slos:
  - name: "ttft"
    objective: 99
    sli: {plugin: {id: "llmslo/latency", options: {metric: "ttft", threshold: "1", slo_class: "interactive"}}}
    alerting: {page_alert: {disable: true}, ticket_alert: {disable: true}}
"""


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
