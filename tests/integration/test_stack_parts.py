"""The local stack's parts, quickly: the supervisor leaves nothing running whatever happens, and the configs it
writes for Prometheus and Alertmanager (slogen's, receivers filled in) pass their own tools' checks (promtool, amtool)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from demo.alertmanager import PAGE_ROUTE, TICKET_ROUTE, AlertmanagerTimers, build_config, load_generated, write_config
from demo.procs import StartError, Supervisor, live_processes_in_groups
from demo.prometheus import PrometheusTimers
from demo.prometheus import build_config as prom_config
from slogen.artifacts.alertmanager import ALERTMANAGER_FILE, PAGE_RECEIVER, TICKET_RECEIVER

REPO = Path(__file__).resolve().parents[2]


def _gone(pgids: list[int], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not live_processes_in_groups(pgids):
            return True
        time.sleep(0.05)
    return False


def test_stop_kills_the_whole_group_even_when_it_ignores_sigterm(tmp_path):
    sup = Supervisor(tmp_path, grace_s=0.5)
    # The shell ignores SIGTERM and so does the grandchild it forks (ignored signals are inherited).
    child = sup.spawn("stubborn", ["sh", "-c", "trap '' TERM; sleep 60 & sleep 60 & wait"])
    time.sleep(0.3)
    assert len(live_processes_in_groups([child.pgid])) >= 3  # the shell and both sleeps share its group
    sup.stop_now()
    assert _gone([child.pgid]), live_processes_in_groups([child.pgid])
    assert child.proc.returncode == -signal.SIGKILL


def test_a_child_that_dies_before_answering_is_reported_with_its_log(tmp_path):
    sup = Supervisor(tmp_path)
    child = sup.spawn("broken", ["sh", "-c", "echo 'cannot bind: address in use' >&2; exit 3"])
    with pytest.raises(StartError, match=r"(?s)broken exited with status 3.*cannot bind"):
        asyncio.run(sup.wait_http(child, "http://127.0.0.1:9/health", timeout_s=10))
    sup.stop_now()


def test_children_die_with_a_supervisor_that_is_killed(tmp_path):
    """SIGKILL leaves no chance to clean up; PR_SET_PDEATHSIG still takes the children down."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from demo.procs import Supervisor
        sup = Supervisor(Path({str(tmp_path)!r}))
        child = sup.spawn("sleeper", ["sleep", "60"])
        print(child.pgid, flush=True)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pgid = int(parent.stdout.readline())
        assert live_processes_in_groups([pgid])
        parent.kill()
        parent.wait()
        assert _gone([pgid]), live_processes_in_groups([pgid])
    finally:
        if parent.poll() is None:
            parent.kill()


def _tool(name: str) -> str:
    path = shutil.which(name) or f"/usr/bin/{name}"
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} is not installed: run `make system-deps`")
    return path


def test_prometheus_config_passes_promtool(tmp_path):
    rules = sorted((REPO / "alerts").glob("*.rules.yaml"))
    assert rules, "alerts/*.rules.yaml missing: run `slogen build`"
    config = prom_config("127.0.0.1:9410", rules, "127.0.0.1:9093", PrometheusTimers(1.0, 1.0, 1.0), "local")
    path = write_config(tmp_path / "prometheus.yml", config)
    result = subprocess.run([_tool("promtool"), "check", "config", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert config["global"]["external_labels"] == {"cluster": "local"}


def test_alertmanager_config_passes_amtool_and_routes_pages_and_tickets(tmp_path):
    """The demo runs slogen's alerts/alertmanager.yaml with its webhook in the placeholder receivers."""
    generated = load_generated(REPO / ALERTMANAGER_FILE)
    config = build_config(generated, "http://127.0.0.1:8080")
    path = write_config(tmp_path / "alertmanager.yml", config)
    result = subprocess.run([_tool("amtool"), "check-config", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    urls = {r["name"]: [w["url"] for w in r["webhook_configs"]] for r in config["receivers"]}
    assert urls == {PAGE_RECEIVER: [f"http://127.0.0.1:8080/{PAGE_ROUTE}"],
                    TICKET_RECEIVER: [f"http://127.0.0.1:8080/{TICKET_ROUTE}"]}
    assert config["route"] == generated["route"] and config["inhibit_rules"] == generated["inhibit_rules"]
    for labels, receiver in (({"sloth_severity": "page"}, PAGE_RECEIVER), ({"sloth_severity": "ticket"}, TICKET_RECEIVER),
                             ({"alertname": "LLMGpuLost", "severity": "critical"}, PAGE_RECEIVER),
                             ({"alertname": "Other"}, TICKET_RECEIVER)):
        args = [f"{k}={v}" for k, v in labels.items()]
        routed = subprocess.run([_tool("amtool"), "config", "routes", "test", f"--config.file={path}", *args],
                                capture_output=True, text=True)
        assert routed.stdout.strip() == receiver, routed.stdout + routed.stderr
    # a timers override (none by default) replaces every route's group_wait and group_interval
    fast = build_config(generated, "http://127.0.0.1:8080", AlertmanagerTimers(0.5, 1.0))
    assert {(r.get("group_wait"), r.get("group_interval")) for r in [fast["route"], *fast["route"]["routes"]]
            if "group_wait" in r} == {("500ms", "1s")}
