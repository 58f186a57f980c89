"""An exporter that looks like the others: --version, llmslo_build_info, process_* series, JSON logs,
and Prometheus exporters' flag names beside the earlier ones."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.process_collector import ProcessCollector

import llmslo
from exporter import cli, procinfo
from exporter.config import Listen
from llmslo import conventions as c

REPO = Path(__file__).resolve().parents[2]


def test_version_flag_names_the_version_and_python(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"llmslo-exporter {llmslo.__version__} ({platform.python_implementation()} {platform.python_version()})"


def test_the_version_is_the_packages() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert llmslo.__version__ == project["version"]


def once_page(capsys, *flags: str) -> dict:
    assert cli.main(["--once", "--gpu", "fake:1", "--pod-resources-socket", "off", *flags]) == 0
    return {f.name: f for f in text_string_to_metric_families(capsys.readouterr().out)}


def test_the_page_carries_build_info_and_process_series(capsys) -> None:
    families = once_page(capsys)
    (info,) = families["llmslo_build_info"].samples
    assert info.value == 1 and info.labels == {
        "version": llmslo.__version__, "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
    }
    # prometheus_client names the counter family without _total, as every client library's page reads
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                 "process_start_time_seconds", "process_open_fds", "process_max_fds"):
        assert name in families, name
    assert families["process_cpu_seconds"].type == "counter"
    assert families["process_resident_memory_bytes"].samples[0].value > 0


def test_process_series_agree_with_prometheus_client() -> None:
    """prometheus_client's ProcessCollector is the reference for what these names mean."""
    ours = {s.metric.name: s.value for s in procinfo.process_samples()}
    theirs = {s.name: s.value for m in ProcessCollector(registry=None).collect() for s in m.samples}
    assert set(ours) == set(theirs)
    for name in ("process_start_time_seconds", "process_max_fds", "process_virtual_memory_bytes"):
        assert ours[name] == pytest.approx(theirs[name], rel=0.01), name
    assert ours["process_resident_memory_bytes"] == pytest.approx(theirs["process_resident_memory_bytes"], rel=0.2)
    assert abs(ours["process_open_fds"] - theirs["process_open_fds"]) <= 2
    # read after ours, so never less (beyond float rounding: it adds user and system time after dividing)
    assert -1e-6 <= theirs["process_cpu_seconds_total"] - ours["process_cpu_seconds_total"] < 5


def test_every_self_series_is_defined_in_conventions() -> None:
    defined = set(c.by_name())
    assert {s.metric.name for s in procinfo.self_samples()} <= defined
    assert c.BUILD_INFO in c.ALL_METRICS and set(c.PROCESS_METRICS) <= set(c.ALL_METRICS)


@pytest.mark.parametrize("new, old", [
    ("--web.listen-address", "--listen"), ("--web.config.file", "--web-config"),
    ("--log.level", "--log-level"), ("--log.format", "--log-format"),
])
def test_prometheus_flag_names_and_their_aliases_set_the_same_thing(new, old) -> None:
    value = {"--web.listen-address": "127.0.0.1:9999", "--web.config.file": "/etc/web.yml",
             "--log.level": "debug", "--log.format": "json"}[new]
    parser = cli.build_parser()
    a, b = parser.parse_args([new, value]), parser.parse_args([old, value])
    assert vars(a) == vars(b)
    dest = {"--web.listen-address": "listen", "--web.config.file": "web_config", "--log.level": "log_level",
            "--log.format": "log_format"}[new]
    assert getattr(a, dest) == value


def test_a_bad_listen_address_names_the_prometheus_flag(capsys) -> None:
    assert cli.main(["--web.listen-address", "nope", "--gpu", "off"]) == cli.EXIT_CONFIG
    assert "--web.listen-address 'nope'" in capsys.readouterr().err


def test_the_listen_flag_reaches_the_config(monkeypatch) -> None:
    seen = {}

    async def fake_serve(config):
        seen["listen"] = config.listen
        seen["level"] = config.log_level
        return 0

    monkeypatch.setattr(cli, "serve", fake_serve)
    assert cli.main(["--web.listen-address", "127.0.0.1:9555", "--log.level", "warning", "--gpu", "off"]) == 0
    assert seen == {"listen": Listen("127.0.0.1", 9555), "level": "warning"}


def test_json_logs_from_the_exporter_process(tmp_path) -> None:
    """A real process: --log.format json writes one JSON object per line on stderr, the tap's formatter."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "exporter", "--once", "--gpu", "fake:1", "--log.level", "info", "--log.format", "json",
         "--pod-resources-socket", str(tmp_path / "missing.sock")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    (missing,) = [d for d in lines if d["event"] == "gpu_pod_mapping_unavailable"]
    assert missing["level"] == "WARNING" and "missing.sock" in missing["reason"]
    assert all(re.match(r"\d{4}-\d\d-\d\dT", d["ts"]) for d in lines)
    assert "llm_exporter_gpu_pod_mapping_up 0" in proc.stdout
