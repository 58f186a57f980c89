"""The capacity and health alerts: their rules, their generated promtool tests, their options."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from llmslo import conventions as c
from llmslo.durations import MINUTE
from slogen.build import BuildOptions, build
from slogen.catalog import compile_catalog
from slogen.cli import main
from slogen.errors import SpecErrors
from slogen.rules.alerts import runbook_path
from slogen.rules.health import HealthOptions
from slogen.rules.options import GenOptions
from slogen.steps import health_rules
from tests.helpers.promql_names import metric_names

REPO = Path(__file__).resolve().parents[2]
RULES = f"alerts/{c.HEALTH.GROUP}.rules.yaml"
TESTS = f"alerts/{c.HEALTH.GROUP}.test.yaml"
BASE_URL = "https://git.example.com/llm/blob/main"


def files_for(health: HealthOptions, **gen) -> dict[str, str]:
    options = BuildOptions(inputs=(str(REPO / "slos"),), gen=GenOptions(runbook_base_url=BASE_URL, **gen), health=health)
    return dict(health_rules(compile_catalog(options)).files)


def promtool_test(promtool: str, files: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    for rel in (RULES, TESTS):
        (tmp_path / Path(rel).name).write_text(files[rel])
    return subprocess.run([promtool, "test", "rules", Path(TESTS).name], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)


def rules_of(files: dict[str, str]) -> dict[str, dict]:
    return {r["alert"]: r for g in yaml.safe_load(files[RULES])["groups"] for r in g["rules"]}


def test_every_alert_has_severity_summary_description_and_runbook_url():
    rules = rules_of(files_for(HealthOptions()))
    assert list(rules) == list(c.HEALTH.ALERTS)
    known = {m.name for m in c.ALL_METRICS}
    for name, rule in rules.items():
        assert rule["labels"][c.SLO.LABEL_ALERT_SEVERITY] in ("critical", "warning"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert rule["annotations"]["runbook_url"] == f"{BASE_URL}/{runbook_path(name)}"
        assert metric_names(rule["expr"]) <= known, name
        # Per series, never aggregated: cluster and every other label reach the alert.
        assert not re.search(r"\b(sum|max|min|avg|count)\s*(by|without)?\s*\(", rule["expr"]), name
    assert rules[c.HEALTH.GPU_LOST]["labels"]["severity"] == "critical"
    assert rules[c.HEALTH.GPU_ECC_UNCORRECTED]["labels"]["severity"] == "critical"
    assert rules[c.HEALTH.KV_CACHE_SATURATED]["for"] == "10m"
    # Tap refusals at its own limits only (503s no SLO counts), never the clients' faults.
    tap = rules[c.HEALTH.TAP_REFUSING_REQUESTS]
    assert tap["expr"].strip() == f'rate({c.TAP_REFUSALS.name}{{reason=~"connection_limit|body_memory"}}[5m]) > 0'
    assert set(c.REFUSED_CAPACITY_REASONS) == {c.REFUSED_CONNECTION_LIMIT, c.REFUSED_BODY_MEMORY}
    assert tap["for"] == "10m" and tap["labels"]["severity"] == "warning"
    assert "503" in tap["annotations"]["description"] and "no SLO" in tap["annotations"]["description"]
    assert "--max-connections" in tap["annotations"]["description"]


def test_options_reach_the_rules_and_the_generated_tests_follow_them(promtool, tmp_path):
    opts = HealthOptions(gpu_lost_for=3 * MINUTE, gpu_error_window=15 * MINUTE, target_down_for=2 * MINUTE,
                         kv_usage_threshold=0.8, kv_saturated_for=5 * MINUTE, preemption_rate=0.25,
                         preemption_window=5 * MINUTE, preemption_for=4 * MINUTE,
                         tap_refusal_rate=0.5, tap_refusal_window=2 * MINUTE, tap_refusal_for=3 * MINUTE)
    files = files_for(opts, extra_labels={"team": "inference"})
    rules = rules_of(files)
    assert rules[c.HEALTH.GPU_LOST]["for"] == "3m"
    assert "[15m]" in rules[c.HEALTH.GPU_ECC_UNCORRECTED]["expr"]
    assert f"{c.KV_CACHE_USAGE.name} > 0.8" in rules[c.HEALTH.KV_CACHE_SATURATED]["expr"]
    assert rules[c.HEALTH.PREEMPTION_STORM]["expr"].strip() == f"rate({c.PREEMPTIONS.name}[5m]) > 0.25"
    assert rules[c.HEALTH.TAP_REFUSING_REQUESTS]["expr"].strip().endswith("[2m]) > 0.5")
    assert rules[c.HEALTH.TAP_REFUSING_REQUESTS]["for"] == "3m"
    assert all(r["labels"]["team"] == "inference" for r in rules.values())
    proc = promtool_test(promtool, files, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_generated_tests_pin_labels_annotations_and_the_for(promtool, tmp_path):
    files = files_for(HealthOptions())
    doc = yaml.safe_load(files[TESTS])
    assert [t["name"].split(":")[0] for t in doc["tests"]] == list(c.HEALTH.ALERTS)
    for test in doc["tests"]:
        checks = test["alert_rule_test"]
        assert any(ch["exp_alerts"] == [] for ch in checks) and any(ch["exp_alerts"] for ch in checks), test["name"]
        for ch in checks:
            for alert in ch["exp_alerts"]:
                assert alert["exp_labels"][c.LABEL_CLUSTER] == "east"
                assert "{{" not in "".join(alert["exp_annotations"].values())
    lost = next(t for t in doc["tests"] if t["name"].startswith(c.HEALTH.GPU_LOST))["alert_rule_test"]
    assert [(ch["eval_time"], bool(ch["exp_alerts"])) for ch in lost] == [("4m", False), ("6m", False), ("7m", True)]

    # The tests fail on rules that fire early, ignore the queue, miss a new XID code or use another threshold.
    text = files[RULES]
    refusals = f'{c.TAP_REFUSALS.name}{{reason=~"connection_limit|body_memory"}}'
    tap_for = f"{refusals}[5m]) > 0\n    for: 10m"
    mutants = {
        "for": text.replace("for: 2m", "for: 1m"),
        "and": text.replace(f"\n      and\n      {c.REQUESTS_WAITING.name} > 0", ""),
        "xid": re.sub(r"\n      or\n      \(llm_gpu_xid_errors_total unless [^\n]*\)", "", text),
        "rate": text.replace("[5m]) > 1\n", "[5m]) > 0.1\n"),
        "ecc": text.replace('type="uncorrected"', 'type=~".+"'),
        # Fires on clients' malformed, slow or oversized requests; on a single burst; before its `for`.
        "refusal reasons": text.replace('reason=~"connection_limit|body_memory"', 'reason=~".+"'),
        "refusal window": text.replace(f"{refusals}[5m]", f"{refusals}[15m]"),
        "refusal for": text.replace(tap_for, tap_for.replace("for: 10m", "for: 5m")),
    }
    for what, mutant in mutants.items():
        assert mutant != text, what
        proc = promtool_test(promtool, {**files, RULES: mutant}, tmp_path)
        assert proc.returncode != 0, what


def test_bad_options_are_reported_with_the_option_and_the_fix():
    with pytest.raises(SpecErrors) as e:
        files_for(HealthOptions(kv_usage_threshold=1.5, preemption_for=90_000, tap_refusal_rate=-1,
                                tap_refusal_for=5 * MINUTE))
    text = str(e.value)
    assert "kv_usage_threshold is 1.5" in text and "--kv-usage-threshold" in text
    assert "preemption_for is 1m30s" in text and "whole number of minutes" in text
    assert "tap_refusal_rate is -1" in text and "--tap-refusal-rate" in text
    # A `for` no longer than the rate window would fire on one burst of refusals.
    assert "tap_refusal_for is 5m, not longer than tap_refusal_window (5m)" in text and "--tap-refusal-for" in text


def test_cli_flags_set_the_options_and_no_health_alerts_drops_them(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["build", str(REPO / "slos"), "--out", str(out), "--kv-usage-threshold", "0.9",
                 "--preemption-for", "15m", "--gpu-lost-for", "1m", "--tap-refusal-rate", "0.1",
                 "--tap-refusal-window", "10m", "--tap-refusal-for", "30m"]) == 0
    rules = {r["alert"]: r for g in yaml.safe_load((out / RULES).read_text())["groups"] for r in g["rules"]}
    assert "> 0.9\n" in rules[c.HEALTH.KV_CACHE_SATURATED]["expr"]
    assert rules[c.HEALTH.PREEMPTION_STORM]["for"] == "15m" and rules[c.HEALTH.GPU_LOST]["for"] == "1m"
    assert "[10m]) > 0.1\n" in rules[c.HEALTH.TAP_REFUSING_REQUESTS]["expr"]  # a build with a namespace wraps it
    assert rules[c.HEALTH.TAP_REFUSING_REQUESTS]["for"] == "30m"
    assert main(["build", str(REPO / "slos"), "--out", str(out), "--no-health-alerts"]) == 0
    assert not (out / RULES).exists() and not (out / TESTS).exists()  # removed as orphans of the earlier build
    assert "prometheusrule-llmslo-health.yaml" not in (out / "deploy/generated/kustomization.yaml").read_text()
    assert main(["build", str(REPO / "slos"), "--out", str(out), "--kv-usage-threshold", "2"]) == 1
    assert "kv_usage_threshold is 2" in capsys.readouterr().err


def test_health_files_come_out_of_the_default_build():
    artifacts = build(BuildOptions(inputs=(str(REPO / "slos"),))).files
    assert {RULES, TESTS, f"deploy/generated/prometheusrule-{c.HEALTH.GROUP}.yaml"} <= set(artifacts)
    assert all(f"docs/runbooks/{n}.md" in artifacts for n in c.HEALTH.ALERTS)
