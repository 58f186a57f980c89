"""Sloth's contrib SLO plugins beyond info_labels/rule_intervals/alert_for: remove_labels and
error_budget_exhausted_alert as their READMEs (and Sloth's plugin tests) describe them; the others refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slogen.cli import main
from tests.helpers.specs import events_sli

SPEC = """version: "prometheus/v1"
service: web-service
labels: {team: platform}
slo_plugins:
  chain:
{chain}
slos:
  - name: availability
    objective: 99.9
    labels: {environment: production}
""" + events_sli("http_requests_total") + """    alerting:
      name: WebAvailability
"""


def _write(tmp_path: Path, chain: str) -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("{chain}", chain))
    return spec


def _rules(text: str) -> list[dict]:
    return [r for d in yaml.safe_load_all(text) if d for g in d["groups"] for r in g["rules"]]


@pytest.mark.parametrize("extras", [[], ["--llm-extras"]])
def test_remove_labels_keeps_ids_window_preserved_and_the_info_metric(tmp_path, capsys, extras):
    chain = ('    - id: "sloth.dev/contrib/remove_labels/v1"\n      priority: 100\n'
             '      config: {preserveLabels: [environment], skipMetrics: ["slo:objective:ratio"]}')
    assert main(["generate", *extras, "-i", str(_write(tmp_path, chain))]) == 0
    rules = _rules(capsys.readouterr().out)
    ids = {"sloth_id", "sloth_service", "sloth_slo"}
    sli = [r for r in rules if r.get("record", "").startswith("slo:sli_")]
    assert sli and all(set(r["labels"]) == ids | {"sloth_window", "environment"} for r in sli)
    kept = {r["record"]: r["labels"] for r in rules if r.get("record") in ("sloth_slo_info", "slo:objective:ratio")}
    assert kept["sloth_slo_info"]["team"] == "platform" and kept["slo:objective:ratio"]["team"] == "platform"
    meta = [r for r in rules if r.get("record") and not r["record"].startswith("slo:sli_") and r["record"] not in kept]
    assert meta and all(set(r["labels"]) <= ids | {"environment"} for r in meta)
    assert all("team" not in r["labels"] for r in meta)
    assert main(["generate", *extras, "-i", str(_write(tmp_path, "    []"))]) == 0
    plain = _rules(capsys.readouterr().out)
    assert [r for r in rules if "alert" in r] == [r for r in plain if "alert" in r]  # alerts are not touched
    assert any("team" in r["labels"] for r in plain if r.get("record", "").startswith("slo:sli_"))


def test_error_budget_exhausted_alert(tmp_path, capsys):
    chain = ('    - id: "sloth.dev/contrib/error_budget_exhausted_alert/v1"\n'
             '      config: {threshold: 0.05, alert_name: ErrorBudgetLow, alert_labels: {severity: info},\n'
             '               selector_labels: {region: us-west-2}, annotations: {summary: low}}')
    assert main(["generate", "-i", str(_write(tmp_path, chain))]) == 0
    [alert] = [r for r in _rules(capsys.readouterr().out) if r.get("alert") == "ErrorBudgetLow"]
    assert alert == {
        "alert": "ErrorBudgetLow",
        "expr": 'slo:period_error_budget_remaining:ratio{environment="production", region="us-west-2", '
                'sloth_id="web-service-availability", sloth_service="web-service", sloth_slo="availability", '
                'team="platform"} <= 0.05',
        "for": "5m", "labels": {"severity": "info"}, "annotations": {"summary": "low"}}
    chain = '    - id: "sloth.dev/contrib/error_budget_exhausted_alert/v1"'
    assert main(["generate", "--llm-extras", "-i", str(_write(tmp_path, chain))]) == 0
    [alert] = [r for r in _rules(capsys.readouterr().out) if r.get("alert") == "ErrorBudgetExhausted"]
    assert alert["expr"].endswith("} <= 0") and alert["for"] == "5m"


def test_bad_config_names_the_key(tmp_path, capsys):
    chain = '    - id: "sloth.dev/contrib/error_budget_exhausted_alert/v1"\n      config: {threshold: low}'
    assert main(["generate", "-i", str(_write(tmp_path, chain))]) == 1
    assert "threshold must be a number" in capsys.readouterr().err
    chain = '    - id: "sloth.dev/contrib/remove_labels/v1"\n      config: {preserveLabel: [a]}'
    assert main(["generate", "-i", str(_write(tmp_path, chain))]) == 1
    assert "unknown config key(s) preserveLabel" in capsys.readouterr().err


def test_sloths_denominator_corrected_example_is_refused_by_name(sloth_dir, capsys):
    example = sloth_dir / "examples" / "contrib-denominator-corrected.yaml"
    assert main(["generate", "-i", str(example)]) == 1
    err = capsys.readouterr().err
    assert "sloth.dev/contrib/denominator_corrected_rules/v1 is not supported" in err
    assert "contrib-denominator-corrected.yaml:" in err and "low-traffic guard" in err and "remove it" in err


def test_validate_victoria_metrics_is_refused_by_name(tmp_path, capsys):
    chain = '    - id: "sloth.dev/contrib/validate_victoria_metrics/v1"'
    assert main(["generate", "-i", str(_write(tmp_path, chain))]) == 1
    assert "validate_victoria_metrics/v1 is not supported" in capsys.readouterr().err
