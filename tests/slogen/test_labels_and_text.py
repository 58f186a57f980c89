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
