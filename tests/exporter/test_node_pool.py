"""The exporter's node pool (--node-pool, $LLMSLO_NODE_POOL, `node_pool:`): said as llm_exporter_node_pool_info beside
the GPU series, and, end to end as shipped, what the inference pool's isolation alert reads.

The end-to-end test runs the podmap relay and the exporter as the users the manifests set (test_podmap_relay.py),
the exporter told its pool through the environment as the pool's DaemonSet tells it, and hands the page it prints
to promtool with the generated isolation rules: a training pod on two GPUs of a node of the pool pages, once; the
70B in llm-chat, the serving namespace, does not.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.collector import Collector
from exporter.config import ExporterConfig, load_config
from llmslo import conventions as c
from slogen.promtests.health_tests import alert_check
from slogen.rules.health import HealthOptions, health_group
from slogen.rules.isolation import isolation_alerts
from slogen.writers import rule_file
from slogen.yamlio import dump
from tests.helpers.needs import command

from .test_podmap_relay import EXPORTER_UID, as_user, kubelet, relay  # noqa: F401 (fixtures)
from .test_podresources import GPUS, container, devices, fleet_answer, pod

ROOT = Path(__file__).resolve().parents[2]
INFO = c.EXPORTER_NODE_POOL_INFO.name


def once(*flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "LLMSLO_NODE_POOL"} | (env or {})
    return subprocess.run([sys.executable, "-m", "exporter.cli", "--once", "--gpu", "fake:2", "--node-name", "node-a",
                           "--pod-resources-socket", "off", *flags], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=environ)


def info_lines(page: str) -> list[str]:
    return [line for line in page.splitlines() if line.startswith(INFO + "{")]


def test_the_flag_says_the_pool_once_beside_the_gpus():
    proc = once("--node-pool", "inference")
    assert proc.returncode == 0, proc.stderr
    assert info_lines(proc.stdout) == [f'{INFO}{{hostname="node-a",node_pool="inference"}} 1']
    assert 'llm_gpu_up{' in proc.stdout and 'hostname="node-a"' in proc.stdout  # the join key, on both


def test_the_environment_says_it_as_the_daemonset_does_and_the_flag_wins():
    assert info_lines(once(env={"LLMSLO_NODE_POOL": "training"}).stdout) == [
        f'{INFO}{{hostname="node-a",node_pool="training"}} 1']
    assert 'node_pool="inference"' in once("--node-pool", "inference", env={"LLMSLO_NODE_POOL": "training"}).stdout


def test_not_told_no_series():
    proc = once()
    assert proc.returncode == 0 and info_lines(proc.stdout) == []


def test_without_gpus_no_series():
    """The pool is said beside the GPU series it is joined to, never alone."""
    with_gpus = Collector(ExporterConfig(gpu="fake:1", node_pool="inference", pod_resources_socket="off"), None,
                          object(), "node-a")
    without = Collector(ExporterConfig(gpu="off", node_pool="inference"), None, None, "node-a")
    assert (with_gpus.node_pool, without.node_pool) == ("inference", "")


@pytest.mark.parametrize(("flags", "env", "named"), [
    (("--node-pool", "in ference"), {}, "--node-pool"),
    (("--node-pool", "-" + "x" * 70), {}, "--node-pool"),
    ((), {"LLMSLO_NODE_POOL": "bad/pool"}, "$LLMSLO_NODE_POOL"),
])
def test_a_value_that_is_no_label_value_exits_2_naming_where_it_came_from(flags, env, named):
    proc = once(*(f"{flags[0]}={flags[1]}",) if flags else (), env=env)
    assert proc.returncode == 2
    assert named in proc.stderr and "Kubernetes label value" in proc.stderr and "fix:" in proc.stderr


def test_the_config_file_takes_it_and_refuses_a_bad_one(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("node_pool: inference\n")
    bad.write_text("gpu: off\nnode_pool: 'not a label'\n")
    assert load_config(str(good)).node_pool == "inference"
    proc = subprocess.run([sys.executable, "-m", "exporter.cli", "--once", "--config", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and re.search(r"bad\.yaml:2: field node_pool: .*label value", proc.stderr), proc.stderr


# ------------------------------------------------------------------------------ as shipped, through to the alert


def page_series(page: str, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """(series, value) of the page's samples of `names`, as promtool's input_series writes them."""
    out = []
    for line in page.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            series, value = line.rsplit(" ", 1)
            out.append((series, value))
    return out


def test_as_shipped_a_foreign_pod_on_the_pool_pages_once(relay, kubelet, tmp_path):  # noqa: F811 (fixtures)
    promtool = command("promtool", "run scripts/install-system-deps.sh (Debian package prometheus)")
    kubelet.answer = fleet_answer() + pod("llm-finetune-0", "train",
                                          container("trainer", devices("nvidia.com/gpu", GPUS[5], GPUS[6])))
    proc = subprocess.run([*as_user(EXPORTER_UID), sys.executable, "-m", "exporter.cli", "--once", "--gpu", "fake:8",
                           "--node-name", "node-a", "--pod-resources-url", relay], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "LLMSLO_NODE_POOL": "inference"})
    assert proc.returncode == 0, proc.stderr
    series = page_series(proc.stdout, (c.GPU_MEMORY_TOTAL.name, INFO))
    assert sum('pod="llm-finetune-0"' in s for s, _ in series) == 2 and any('pod="llama-70b-0"' in s for s, _ in series)
    assert any(s.startswith(INFO) and 'node_pool="inference"' in s for s, _ in series)
    opts = HealthOptions(isolation_pool="inference", serving_namespaces=("llm-chat",))
    (foreign,) = [a for a in isolation_alerts(opts, "https://x.example.org/rb") if a.rule.alert == c.HEALTH.POOL_FOREIGN_POD]
    fires = {c.LABEL_HOSTNAME: "node-a", c.LABEL_NAMESPACE: "train", c.LABEL_POD: "llm-finetune-0"}
    doc = {"rule_files": ["isolation.rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "name": "the stand-in kubelet's node, told it is in the pool",
        "interval": "1m",
        "input_series": [{"series": s, "values": f"{v}x40"} for s, v in series],
        "alert_rule_test": [alert_check(foreign, 9, None), alert_check(foreign, 10, fires),
                            alert_check(foreign, 30, fires)],
    }]}
    (tmp_path / "isolation.rules.yaml").write_text(rule_file([health_group([foreign])], "# test\n"))
    (tmp_path / "isolation.test.yaml").write_text(dump(doc))
    result = subprocess.run([promtool, "test", "rules", "isolation.test.yaml"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
