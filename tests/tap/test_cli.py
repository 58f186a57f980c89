"""The tap's command line: arguments, configuration errors, and the subcommand hook."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from exporter.tap import cli
from exporter.tap.addresses import format_host_port, host_port


def test_add_parser_registers_tap_on_a_parent_cli(tmp_path: Path) -> None:
    parent = argparse.ArgumentParser(prog="llmslo-exporter")
    cli.add_parser(parent.add_subparsers(dest="command"))
    args = parent.parse_args(
        ["tap", "--listen", ":8001", "--upstream", "http://127.0.0.1:8000", "--metrics-listen", "[::1]:0",
         "--slo", "a.yaml", "b.yaml", "--slo", "c/", "--max-body-bytes", "1000"]
    )
    assert args.func is cli.run
    assert args.listen == ("0.0.0.0", 8001) and args.metrics_listen == ("::1", 0)
    assert args.slo == ["a.yaml", "b.yaml", "c/"] and args.max_body_bytes == 1000


@pytest.mark.parametrize("bad", ["8001", "host:", "host:99999", "host:http"])
def test_listen_must_be_host_port(bad: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="HOST:PORT"):
        host_port(bad)


@pytest.mark.parametrize("host, port", [("0.0.0.0", 8001), ("::1", 0), ("127.0.0.1", 65535)])
def test_an_address_written_for_a_worker_reads_back(host: str, port: int) -> None:
    assert host_port(format_host_port(host, port)) == (host, port)


def test_bad_slo_file_exits_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text('version: prometheus/v1\nslos:\n  - name: g\n    sli: {plugin: {id: llmslo/goodput, options: {ttft: "1"}}}\n')
    code = cli.main(["--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1", "--metrics-listen", "127.0.0.1:0",
                     "--slo", str(bad)])
    assert code == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "slo_class" in err


def test_upstream_must_be_an_http_url(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:8000", "--metrics-listen", "127.0.0.1:0"])
    assert code == 2 and "http://" in capsys.readouterr().err


def test_a_taken_port_exits_2_with_one_clear_line() -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "exporter.tap", "--listen", f"127.0.0.1:{port}", "--upstream", "http://127.0.0.1:9",
             "--metrics-listen", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=30,
        )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("llmslo-exporter tap: error: cannot listen") and "Traceback" not in proc.stderr


def test_client_idle_timeout_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9", "--metrics-listen", "127.0.0.1:0",
            "--client-idle-timeout", "0"]
    assert cli.main(argv) == 2
    assert "--client-idle-timeout" in capsys.readouterr().err


def test_an_unreadable_upstream_ca_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    argv = ["--listen", "127.0.0.1:0", "--upstream", "https://127.0.0.1:9", "--metrics-listen", "127.0.0.1:0",
            "--upstream-ca", str(bad)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "--upstream-ca" in err and str(bad) in err
