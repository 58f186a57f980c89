"""`llmslo-exporter` as a user runs it: --once to stdout, exit codes, messages, the tap subcommand."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter import cli
from llmslo import conventions as c

REPO = Path(__file__).resolve().parents[2]


def exporter(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "exporter", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=env)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_once_prints_one_cycle_and_exits_zero(pages_dir):
    done = exporter("--once", "--gpu", "fake:2", "--node-name", "n1",
                    "--engine", f"vllm=file://{pages_dir / 'vllm-v1.prom'}",
                    "--engine", f"auto=file://{pages_dir / 'tgi.prom'}",
                    "--engine", f"vllm=http://127.0.0.1:{closed_port()}/metrics")
    assert done.returncode == 0, done.stderr
    fams = {f.name: f for f in text_string_to_metric_families(done.stdout)}
    up = sorted((s.labels["engine"], s.value) for s in fams[c.EXPORTER_TARGET_UP.name].samples)
    assert up == [("tgi", 1), ("vllm", 0), ("vllm", 1)]  # one down target does not fail --once; auto found tgi
    assert {s.labels["node"] for s in fams[c.REQUESTS_RUNNING.name].samples} == {"n1"}
    assert len(fams[c.GPU_UP.name].samples) == 2
    assert "target_down" in done.stderr and "connection_refused" in done.stderr  # warnings on stderr only


def test_once_exits_non_zero_naming_each_failure_when_nothing_could_be_read(tmp_path):
    port = closed_port()
    done = exporter("--once", "--gpu", "off", "--engine", f"vllm=http://127.0.0.1:{port}/metrics",
                    "--engine", f"tgi=file://{tmp_path / 'missing.prom'}")
    assert done.returncode == 1
    assert done.stdout == ""
    assert "no source could be read" in done.stderr
    assert f"127.0.0.1:{port}/metrics (vllm): connection_refused" in done.stderr
    assert "missing.prom (tgi): not_found" in done.stderr


@pytest.fixture
def exporter_logger():
    """cli.main configures the exporter's logger; put it back so caplog in later tests still sees events."""
    logger = logging.getLogger("llmslo.exporter")
    saved = (logger.handlers[:], logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


def test_once_with_no_sources_at_all_says_what_to_add(capsys, exporter_logger):
    assert cli.main(["--once", "--gpu", "off"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "no engine targets configured" in captured.err


def test_once_without_nvml_falls_back_and_still_succeeds(pages_dir):
    from exporter.gpu import GpuUnavailable, NvmlProvider

    try:
        NvmlProvider().close()
        nvml_present = True
    except GpuUnavailable:
        nvml_present = False
    done = exporter("--once", "--engine", f"vllm=file://{pages_dir / 'vllm-v1.prom'}")  # --gpu nvml is the default
    assert done.returncode == 0, done.stderr
    assert c.REQUESTS_RUNNING.name in done.stdout
    assert ("gpu_nvml_unavailable" in done.stderr) == (not nvml_present)


def test_config_errors_exit_2_with_the_message(tmp_path, capsys):
    bad = tmp_path / "exporter.yaml"
    bad.write_text("gpu: nvidia\n")
    assert cli.main(["--once", "--config", str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"llmslo-exporter: error: {bad}:1: field gpu:")
    bad.write_text("gpu: nvidia\ninterval: soon\n")
    assert cli.main(["--once", "--config", str(bad)]) == 2
    assert [line.split(": ")[2] for line in capsys.readouterr().err.splitlines()] == [f"{bad}:1", f"{bad}:2"]
    assert cli.main(["--once", "--engine", "llama=http://a/metrics"]) == 2
    assert "unknown engine kind 'llama'" in capsys.readouterr().err


def test_serving_with_a_broken_web_config_exits_2(tmp_path, capsys, exporter_logger):
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  alice: plaintext\n")
    assert cli.main(["--web-config", str(web), "--listen", "127.0.0.1:0", "--gpu", "off"]) == 2
    assert f"{web}: field basic_auth_users.alice: not a bcrypt hash" in capsys.readouterr().err


def test_a_taken_port_exits_2_with_one_clear_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = exporter("--listen", f"127.0.0.1:{port}", "--gpu", "fake:1", "--log-level", "warning")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"llmslo-exporter: error: cannot listen on 127.0.0.1:{port}: Address already in use")
    assert done.stderr.count("\n") == 1  # one line: no traceback, no warning about sessions left open
    assert done.stdout == ""


def test_config_file_and_flags_together(tmp_path, pages_dir):
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(f"gpu: off\ntargets:\n  - kind: vllm\n    url: file://{pages_dir / 'vllm-v1.prom'}\n"
                   "    pod: vllm-0\n    namespace: llm\n")
    done = exporter("--once", "--config", str(cfg), "--engine", f"sglang=file://{pages_dir / 'sglang.prom'}")
    assert done.returncode == 0, done.stderr
    fams = {f.name: f for f in text_string_to_metric_families(done.stdout)}
    pods = {(s.labels["engine"], s.labels["pod"]) for s in fams[c.REQUESTS_RUNNING.name].samples}
    assert pods == {("vllm", "vllm-0"), ("sglang", "")}
    assert c.GPU_UP.name not in fams


def test_tap_subcommand_is_wired_to_the_tap(capsys):
    done = exporter("tap", "--help")
    assert done.returncode == 0 and "--upstream" in done.stdout


def test_help_lists_every_flag(capsys):
    try:
        cli.main(["--help"])
    except SystemExit as exit_:
        assert exit_.code == 0
    out = capsys.readouterr().out
    for flag in ("--listen", "--engine", "--gpu", "--config", "--interval", "--once", "--web-config", "--node-name", "tap"):
        assert flag in out
