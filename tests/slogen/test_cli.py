"""The CLI as a user runs it: generate (file, directory, stdout), validate, exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from slogen.cli import main

REPO = Path(__file__).resolve().parents[2]
DEMO_WINDOWS = REPO / "demo" / "windows.yaml"


def test_generate_directory_mirrors_files(tmp_path, sloth_testdata):
    src, out = tmp_path / "in", tmp_path / "out"
    (src / "sub").mkdir(parents=True)
    out.mkdir()
    (src / "sub" / "a.yaml").write_text((sloth_testdata / "in-base.yaml").read_text())
    (src / "b.yaml").write_text((sloth_testdata / "in-openslo.yaml").read_text())
    assert main(["generate", "--llm-extras", "-i", str(src), "-o", str(out), "-e", "b\\.yaml"]) == 0
    assert [p.relative_to(out).as_posix() for p in out.rglob("*.yaml")] == ["sub/a.yaml"]
    doc = yaml.safe_load((out / "sub" / "a.yaml").read_text())
    records = {r.get("record") for g in doc["groups"] for r in g["rules"]}
    assert {"slo:sli_errors:rate5m", "slo:sli_total:rate5m", "slo:sli_error:ratio_rate30d"} <= records


def test_generate_k8s_gives_prometheus_rule(sloth_testdata, capsys):
    assert main(["generate", "--llm-extras", "-i", str(sloth_testdata / "in-base-k8s.yaml")]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["kind"] == "PrometheusRule" and doc["metadata"]["name"] == "svc"
    assert doc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "slogen"


def test_validate_catalog_with_promtool(capsys):
    assert main(["validate", "--promtool", str(REPO / "slos")]) == 0
    assert "10 SLOs" in capsys.readouterr().err


def test_console_script_reports_errors_with_exit_1(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text('version: "prometheus/v1"\nservice: s1\nslos:\n  - name: a1\n    objective: 90\n'
                   '    sli: {plugin: {id: llmslo/availability}}\n    alerting: {name: A}\n')
    proc = subprocess.run([sys.executable, "-m", "slogen.cli", "build", str(bad), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert "page-quick alert tier can never fire" in proc.stderr and "bad.yaml:5" in proc.stderr  # objective: 90
    proc = subprocess.run([sys.executable, "-m", "slogen.cli", "build", str(bad), "--out", str(tmp_path / "o"),
                           "--unreachable-tiers", "rescale"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_autoscaling_error_is_a_message_not_a_traceback(tmp_path, capsys):
    """The demo catalog records no 5m window, which the repo's KEDA pools scale on: say so, write nothing."""
    out = tmp_path / "out"
    assert main(["build", "--out", str(out), "--windows", str(DEMO_WINDOWS), "--override-period", "1d"]) == 1
    err = capsys.readouterr().err
    assert "autoscaling/llm-pools.yaml" in err and "ttft_burn_rate.window" in err and "(fix: " in err
    assert not any(out.rglob("*.yaml")) if out.exists() else True


def test_no_autoscaling_builds_on_the_demo_catalog_without_keda_objects(tmp_path):
    out = tmp_path / "out"
    assert main(["build", "--out", str(out), "--windows", str(DEMO_WINDOWS), "--override-period", "1d",
                 "--no-autoscaling"]) == 0
    assert list((out / "alerts").glob("*.rules.yaml"))
    assert not list(out.rglob("keda/*.yaml"))
