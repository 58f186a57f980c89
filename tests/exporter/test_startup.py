"""Small things a real cluster found (issue #14, item 5): `--node-name` beats the config file's check, and
`--once` imports only what it uses. How long start-up takes is a benchmark (`python -m bench startup`);
these tests pin the mechanism: which modules a run loads."""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile

import pytest
from prometheus_client.utils import floatToGoString as reference_float_to_go_string

from exporter import cli
from exporter.config import ExporterConfig
from llmslo.gofloat import client_float as floatToGoString
from tests.exporter.test_cli import REPO

# What a --once over saved pages with --gpu off never needs: the tap, the HTTP client and server (aiohttp
# builds TLS contexts when imported), the web config (bcrypt, TLS), YAML, prometheus_client, NVML, the kubelet's
# pod-resources client (gRPC, protobuf), the podmap relay's server, and the distribution-metadata reader (its
# email, zipfile and csv were a third of the modules), and the event loop (asyncio, with ssl and concurrent.futures:
# saved pages are read by a thread and parsed in line).
NOT_FOR_ONCE = (
    "aiohttp", "exporter.tap", "exporter.tap.cli", "exporter.server", "exporter.webconfig", "exporter.sources.http",
    "bcrypt", "yaml", "prometheus_client", "exporter.gpu.nvml", "exporter.gpu.fake", "exporter.discovery",
    "exporter.gpu.podresources", "exporter.gpu.podmap_server", "http.server", "importlib.metadata", "email", "json",
    "platform", "shutil", "llmslo.ranges", "asyncio", "ssl", "concurrent.futures", *(GRPC := ("grpc", "google.protobuf", "exporter.gpu.podresources_pb2")),
)


def loaded_by(*args: str) -> tuple[int, set[str], str]:
    """Run `llmslo-exporter ARGS` in a fresh interpreter; its exit code, the modules it loaded, its stdout."""
    code = (
        "import sys, io\n"
        "from exporter.cli import main\n"
        "out = io.StringIO()\n"
        "class Out:\n"
        "    buffer = io.BytesIO()\n"
        "    def write(self, s): out.write(s)\n"
        "    def flush(self): pass\n"
        "sys.stdout = Out()\n"
        f"rc = main({list(args)!r})\n"
        "sys.stdout = sys.__stdout__\n"
        "modules = sorted(sys.modules)\n"
        "import json\n"  # after the list: the run's own modules only
        "print(json.dumps({'rc': rc, 'modules': modules, 'out': Out.buffer.getvalue().decode()}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    return result["rc"], set(result["modules"]), result["out"]


def test_once_over_saved_pages_loads_nothing_it_does_not_use(pages_dir):
    rc, modules, out = loaded_by("--once", "--gpu", "off", "--engine", f"vllm=file://{pages_dir / 'vllm-v1.prom'}")
    assert rc == 0 and "llm_requests_running{" in out
    assert sorted(m for m in NOT_FOR_ONCE if m in modules) == []


def test_an_http_target_still_loads_the_http_client(pages_dir):
    rc, modules, _ = loaded_by("--once", "--gpu", "off", "--engine", f"vllm=file://{pages_dir / 'vllm-v1.prom'}",
                               "--engine", "vllm=http://127.0.0.1:9/metrics")
    assert rc == 0
    assert {"aiohttp", "exporter.sources.http"} <= modules
    assert "exporter.tap" not in modules


def test_a_fake_gpu_loads_the_fake_provider_only(pages_dir):
    rc, modules, out = loaded_by("--once", "--gpu", "fake:1", "--engine", f"vllm=file://{pages_dir / 'vllm-v1.prom'}")
    assert rc == 0 and "llm_gpu_up{" in out
    assert "exporter.gpu.fake" in modules and "exporter.gpu.nvml" not in modules


def test_grpc_and_protobuf_load_only_when_the_pod_resources_socket_is_there(pages_dir):
    """GPUs read and the mapping off, or its socket absent (no kubelet): no gRPC. A socket there: gRPC, to read it."""
    page = f"vllm=file://{pages_dir / 'vllm-v1.prom'}"
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:  # a short path: a unix socket's is at most 107 bytes
        kubelet = os.path.join(folder, "kubelet.sock")
        for mapping in (["--pod-resources-socket", "off"], ["--pod-resources-socket", kubelet]):
            rc, modules, out = loaded_by("--once", "--gpu", "fake:1", "--engine", page, *mapping)
            assert rc == 0 and "llm_gpu_up{" in out
            assert sorted(m for m in GRPC if m in modules) == [], mapping
        with socket.socket(socket.AF_UNIX) as bound:  # bound, not listening: the kubelet's call is refused at once
            bound.bind(kubelet)
            rc, modules, out = loaded_by("--once", "--gpu", "fake:1", "--engine", page, "--pod-resources-socket", kubelet)
    assert rc == 0 and "llm_gpu_up{" in out
    assert {"grpc", "exporter.gpu.podresources_pb2"} <= modules


def test_the_help_is_wrapped_as_argparse_wraps_it(capsys, monkeypatch):
    """The width is found without shutil, the way shutil finds it: $COLUMNS, else the terminal's, else 80."""
    def help_text() -> str:
        with pytest.raises(SystemExit):
            cli.main(["--help"])
        return capsys.readouterr().out

    for columns in ("50", "200", ""):
        monkeypatch.setenv("COLUMNS", columns)
        ours = help_text()
        with monkeypatch.context() as m:
            m.setattr(cli, "_help_formatter", argparse.HelpFormatter)  # argparse's own, through shutil
            assert ours == help_text(), columns
        if columns == "200":
            assert max(map(len, ours.splitlines())) > 80  # the width is taken, not a fixed 80


def test_the_help_still_names_the_tap_and_tap_must_come_first(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "tap" in capsys.readouterr().out
    assert cli.main(["--once", "tap", "--listen", ":1"]) == cli.EXIT_CONFIG
    assert "`tap` comes first" in capsys.readouterr().err


def test_float_to_go_string_matches_prometheus_client():
    edges = [0.0, -0.0, 1.0, 0.5, 1e-05, 2.5e-4, 0.1, 10.0, 1000.0, 12345.678, 1e6, 1.5e7, 123456789.0, 1e21,
             math.inf, -math.inf, math.nan, -3.25, 7e-310]
    assert [floatToGoString(e) for e in edges] == [reference_float_to_go_string(e) for e in edges]


# --------------------------------------------------------------------------------------
# --node-name over the config file
# --------------------------------------------------------------------------------------
DISCOVERY = "kubernetes_discovery:\n  enabled: true\n"


@pytest.fixture
def captured_run(monkeypatch):
    """cli.main up to the run: the config it would run with (no cluster is contacted)."""
    seen: list[ExporterConfig] = []

    async def fake_run(config: ExporterConfig) -> int:
        seen.append(config)
        return 0

    monkeypatch.setattr(cli, "run_once", fake_run)
    monkeypatch.setattr(cli, "serve", fake_run)
    monkeypatch.setattr(cli.logs, "setup", lambda level, **kw: None)
    return seen


def test_node_name_flag_satisfies_discovery_in_the_config_file(tmp_path, monkeypatch, captured_run):
    monkeypatch.delenv("NODE_NAME", raising=False)
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(DISCOVERY)
    assert cli.main(["--config", str(cfg), "--node-name", "gpu-node-7", "--once"]) == 0
    assert cli.main(["--config", str(cfg), "--node-name", "gpu-node-7"]) == 0
    assert [(c.node_name, c.discovery.enabled) for c in captured_run] == [("gpu-node-7", True)] * 2


def test_without_any_node_name_discovery_is_still_refused(tmp_path, monkeypatch, captured_run, capsys):
    monkeypatch.delenv("NODE_NAME", raising=False)
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(DISCOVERY)
    assert cli.main(["--config", str(cfg), "--once"]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert str(cfg) in err and "kubernetes_discovery.enabled" in err and "--node-name" in err
    assert captured_run == []
    monkeypatch.setenv("NODE_NAME", "from-env")
    assert cli.main(["--config", str(cfg), "--once"]) == 0
    cfg.write_text(DISCOVERY + "node_name: from-file\n")
    assert cli.main(["--config", str(cfg), "--once", "--node-name", "from-flag"]) == 0
    assert [c.node_name for c in captured_run] == ["", "from-flag"]  # "" resolves to $NODE_NAME at run time
