"""The tap injector watched: LLMTapInjectorFailing, generated with the health rules when llmslo.yaml installs the
injector (`tapInjector: true`), staged by promtool: the API server's failed handshakes fire it, a caller's malformed
bodies do not, and no injector scraped fires it too (a webhook that fails open must not fail unseen)."""

from __future__ import annotations

from pathlib import Path

import yaml

from llmslo import conventions as c
from slogen.build import BuildOptions
from slogen.catalog import compile_catalog
from slogen.rules.options import GenOptions
from slogen.settings import InstallSettings
from slogen.steps import health_rules, runbooks

from .test_isolation import RULES, TESTS, rules_of, run_promtool

REPO = Path(__file__).resolve().parents[2]
H = c.HEALTH


def files_for(tap_injector: bool) -> dict[str, str]:
    install = InstallSettings(inference_namespaces=("llm",), tap_injector=tap_injector)
    options = BuildOptions(inputs=(str(REPO / "slos"),), gen=GenOptions(runbook_base_url="https://x.example.org/rb"),
                           install=install)
    catalog = compile_catalog(options)
    return {**dict(health_rules(catalog).files), **dict(runbooks(catalog).files)}


def test_only_a_build_that_installs_the_injector_watches_it():
    assert H.TAP_INJECTOR_FAILING not in rules_of(files_for(False))
    rule = rules_of(files_for(True))[H.TAP_INJECTOR_FAILING]
    assert rule["labels"]["severity"] == "warning" and rule["for"] == "15m"
    assert f"absent({c.TAP_INJECTOR_INJECTED.name})" in rule["expr"]
    assert 'reason=~"internal|timeout|tls|overloaded"' in rule["expr"]


def test_generated_tests_pass_and_fail_a_rule_that_counts_a_callers_malformed_bodies(promtool, tmp_path):
    files = files_for(True)
    names = [t["name"].split(":")[0] for t in yaml.safe_load(files[TESTS])["tests"]]
    assert H.TAP_INJECTOR_FAILING in names
    proc = run_promtool(promtool, files, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    every_error = files[RULES].replace('{reason=~"internal|timeout|tls|overloaded"}', "", 1)
    assert every_error != files[RULES]
    proc = run_promtool(promtool, {**files, RULES: every_error}, tmp_path)
    assert proc.returncode != 0 and H.TAP_INJECTOR_FAILING in proc.stdout + proc.stderr


def test_no_injector_scraped_fires_and_one_scraped_clears_it(promtool, tmp_path):
    files = files_for(True)
    rule = rules_of(files)[H.TAP_INJECTOR_FAILING]
    test = {"rule_files": [Path(RULES).name], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": f'{c.TAP_INJECTOR_INJECTED.name}{{pod="llmslo-tap-injector-0"}}',
                          "values": "_x30 0x20"}],
        "alert_rule_test": [
            {"eval_time": "14m", "alertname": H.TAP_INJECTOR_FAILING, "exp_alerts": []},
            {"eval_time": "16m", "alertname": H.TAP_INJECTOR_FAILING, "exp_alerts": [{
                "exp_labels": rule["labels"], "exp_annotations": rule["annotations"]}]},
            {"eval_time": "35m", "alertname": H.TAP_INJECTOR_FAILING, "exp_alerts": []}]}]}
    proc = run_promtool(promtool, {**files, TESTS: yaml.safe_dump(test, sort_keys=False)}, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_its_runbook_finds_the_certificate_and_the_pods_without_the_tap():
    text = files_for(True)[f"docs/runbooks/{H.TAP_INJECTOR_FAILING}.md"]
    assert "caBundle" in text and "rollout restart" in text and "tap-injected" in text
    assert c.TAP_INJECTOR_ERRORS.name in text
