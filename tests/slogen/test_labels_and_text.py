"""Labels and text that broke the output (#26): a label the rules group by is refused, naming the field;
`{{` in --grafana-url and in SLO descriptions reaches the annotations as text that promtool accepts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from slogen.cli import main

SPEC = """\
version: "prometheus/v1"
service: "svc"
{labels}slos:
  - name: "availability"
    objective: 99.9
    description: {description}
    sli: {{plugin: {{id: "llmslo/availability", options: {{source: "tap"}}}}}}
    alerting: {{name: SvcAvailability}}
"""


def _spec(tmp_path: Path, labels: str = "", description: str = '"plain"') -> Path:
    path = tmp_path / "svc.yaml"
    path.write_text(SPEC.format(labels=labels, description=description))
    return path


def test_a_label_the_rules_group_by_is_refused_naming_the_field(tmp_path, capsys):
    spec = _spec(tmp_path, labels='labels: {cluster: "prod-a"}\n')
    assert main(["validate", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "labels.cluster" in err and "group by" in err
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 1
    assert main(["build", "--out", str(tmp_path / "out2"), "-l", "cluster=x", str(_spec(tmp_path))]) == 1


def test_braces_in_the_grafana_url_and_description_are_text_promtool_accepts(promtool, tmp_path):
    spec = _spec(tmp_path, description='"requests {{ that fail }}"')
    out = tmp_path / "out"
    assert main(["build", "--out", str(out), "--grafana-url", "https://g.example/{{x}}", str(spec)]) == 0
    alerts = out / "alerts"
    check = subprocess.run([promtool, "check", "rules", "svc.rules.yaml"], cwd=alerts, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # the generated tests expect what Prometheus renders: the braces as written
    tests = yaml.safe_load((alerts / "svc.test.yaml").read_text())
    texts = [a["exp_annotations"] for t in tests["tests"] for c in t.get("alert_rule_test", []) for a in c["exp_alerts"]]
    assert any("requests {{ that fail }}" in a.get("description", "") for a in texts)
    assert any(a.get("dashboard", "").startswith("https://g.example/{{x}}") for a in texts)
    run = subprocess.run([promtool, "test", "rules", "svc.test.yaml"], cwd=alerts, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_braces_in_the_runbook_base_url_are_text_in_every_rules_file(promtool, tmp_path):
    out = tmp_path / "out"
    assert main(["build", "--out", str(out), "--runbook-base-url", "https://r.example/{{y}}",
                 "--grafana-url", "https://g.example/{{x}}", str(_spec(tmp_path))]) == 0
    alerts = out / "alerts"
    rules = sorted(p.name for p in alerts.glob("*.rules.yaml"))
    assert "svc.rules.yaml" in rules and "llmslo-health.rules.yaml" in rules
    check = subprocess.run([promtool, "check", "rules", *rules], cwd=alerts, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = yaml.safe_load((alerts / "llmslo-health.test.yaml").read_text())
    texts = [a["exp_annotations"] for t in tests["tests"] for c in t.get("alert_rule_test", []) for a in c["exp_alerts"]]
    assert texts and all(a["runbook_url"].startswith("https://r.example/{{y}}/docs/runbooks/") for a in texts)


def test_a_rules_file_promtool_rejects_fails_the_build_and_writes_nothing(promtool, tmp_path, capsys):
    spec = tmp_path / "svc.yaml"
    spec.write_text(SPEC.format(labels="", description='"plain"').replace(
        "alerting: {name: SvcAvailability}", 'alerting: {name: SvcAvailability, annotations: {summary: "{{ nosuch }}"}}'))
    out = tmp_path / "out"
    assert main(["build", "--out", str(out), str(spec)]) == 1
    err = capsys.readouterr().err
    assert "alerts/svc.rules.yaml" in err and 'function "nosuch" not defined' in err and "nothing was written" in err
    assert not out.exists()


def test_without_promtool_the_build_says_it_did_not_check(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["build", "--out", str(tmp_path / "out"), str(_spec(tmp_path))]) == 0
    assert "promtool is not on PATH" in capsys.readouterr().err


def test_a_service_name_too_long_for_a_file_name_is_refused_by_validate(tmp_path, capsys):
    longest = tmp_path / "ok.yaml"
    longest.write_text(SPEC.format(labels="", description='"d"').replace('"svc"', '"' + "s" * 234 + '"'))
    assert main(["validate", str(longest)]) == 1  # its SLO id: the dashboard's file name would be 256 bytes
    assert "at most 246" in capsys.readouterr().err
    longest.write_text(SPEC.format(labels="", description='"d"').replace('"svc"', '"' + "s" * 233 + '"'))
    assert main(["validate", str(longest)]) == 0
    assert main(["build", "--out", str(tmp_path / "ok"), "--no-promtool-check", str(longest)]) == 0
    spec = tmp_path / "long.yaml"
    spec.write_text(SPEC.format(labels="", description='"d"').replace('"svc"', '"' + "s" * 300 + '"'))
    assert main(["validate", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "long.yaml:2" in err and "field service" in err and "at most 235" in err
    assert main(["build", "--out", str(tmp_path / "out"), str(spec)]) == 1


def test_an_invalid_alert_name_is_reported_once(tmp_path, capsys):
    spec = tmp_path / "svc.yaml"
    spec.write_text(SPEC.format(labels="", description='"d"').replace("SvcAvailability", "bad-name"))
    assert main(["validate", str(spec)]) == 1
    assert capsys.readouterr().err.count("'bad-name' is not a valid Prometheus alert name") == 1
