"""GPU attribution as shipped: the kubelet's socket is read by the podmap relay alone, and the exporter, non-root
with no capabilities, gets the mapping from it (exporter/gpu/podmap.py).

Both run as real processes as the users the manifests set (slogen/kustomize/podmap/daemonset.yaml: uid 0 with
every capability dropped; base/daemonset.yaml: uid 65532), against the stand-in kubelet of test_podresources.py
on a socket made as the kubelet makes it (root's, srwxr-xr-x). The exporter asking the socket itself gets
nothing: that is why the relay exists. Changing users needs root; elsewhere both run as the current user and the
permission half is not asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from exporter.gpu import podmap
from exporter.gpu.podresources import PodResourcesError

from .test_podresources import GPUS, StandInKubelet, fleet_answer

ROOT = Path(__file__).resolve().parents[2]
BASES = ROOT / "slogen" / "kustomize"
AS_ROOT = os.geteuid() == 0


def manifest_user(path: Path) -> int:
    """The uid a DaemonSet's pod runs as (its pod-level securityContext.runAsUser)."""
    return yaml.safe_load(path.read_text())["spec"]["template"]["spec"]["securityContext"]["runAsUser"]


RELAY_UID = manifest_user(BASES / "podmap" / "daemonset.yaml")
EXPORTER_UID = manifest_user(BASES / "base" / "daemonset.yaml")


def as_user(uid: int) -> list[str]:
    """setpriv as the manifests run it: that uid and gid, no supplementary groups, no capabilities at all."""
    if not AS_ROOT:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def kubelet():
    folder = Path(tempfile_dir())
    path = folder / "kubelet.sock"
    k = StandInKubelet(str(path))
    k.answer = fleet_answer()
    os.chmod(path, 0o755)  # the kubelet's: only its owner, root, may connect
    k.path = str(path)
    yield k
    k.stop()
    shutil.rmtree(folder, ignore_errors=True)


def tempfile_dir() -> str:
    import tempfile

    folder = tempfile.mkdtemp(prefix="podmap-", dir="/tmp")  # unix socket paths are limited to 107 bytes
    os.chmod(folder, 0o755)
    return folder


def start_relay(socket_path: str, node: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([*as_user(RELAY_UID), sys.executable, "-m", "exporter.cli", "podmap", "--listen",
                             f"127.0.0.1:{port}", "--pod-resources-socket", socket_path, "--node-name", node],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}{podmap.OWNERS_PATH}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
            return proc, url
        except OSError:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("the relay did not start")


def exporter_once(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([*as_user(EXPORTER_UID), sys.executable, "-m", "exporter.cli", "--once", "--gpu", "fake:8",
                           "--node-name", "node-a", "--log-level", "info", *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)


def mapping_up(page: str) -> float:
    (line,) = [l for l in page.splitlines() if l.startswith("llm_exporter_gpu_pod_mapping_up ")]
    return float(line.split()[1])


@pytest.fixture
def relay(kubelet):
    proc, url = start_relay(kubelet.path, "node-a")
    yield url
    proc.terminate()
    proc.wait(10)


def test_the_non_root_exporter_labels_gpus_with_their_pods_through_the_relay(relay, kubelet):
    assert (RELAY_UID, EXPORTER_UID) == (0, 65532)
    proc = exporter_once("--pod-resources-url", relay)
    assert proc.returncode == 0, proc.stderr
    assert mapping_up(proc.stdout) == 1
    assert 'pod="llama-70b-0"' in proc.stdout and 'container="vllm"' in proc.stdout and GPUS[0] in proc.stdout
    assert "llm_exporter_gpu_pod_mapped_devices 6" in proc.stdout  # 4 GPUs, the MIG slice, the stray GPU- id


@pytest.mark.skipif(not AS_ROOT, reason="running the exporter as another user than the kubelet's needs root")
def test_the_exporter_as_shipped_cannot_read_the_kubelets_socket_itself(kubelet):
    proc = exporter_once("--pod-resources-socket", kubelet.path)
    assert proc.returncode == 0, proc.stderr
    assert mapping_up(proc.stdout) == 0
    assert "gpu_pod_mapping_unavailable" in proc.stderr


def test_a_relay_on_another_node_is_refused_by_name(kubelet):
    proc, url = start_relay(kubelet.path, "node-b")
    try:
        result = exporter_once("--pod-resources-url", url)
    finally:
        proc.terminate()
        proc.wait(10)
    assert mapping_up(result.stdout) == 0
    assert "node-b" in result.stderr and "internalTrafficPolicy: Local" in result.stderr


def test_a_kubelet_that_fails_reaches_the_exporter_as_the_reason(relay, kubelet):
    import grpc

    kubelet.fail = grpc.StatusCode.UNAVAILABLE
    time.sleep(1.1)  # past the relay's cache
    result = exporter_once("--pod-resources-url", relay)
    assert mapping_up(result.stdout) == 0 and "kubelet says no" in result.stderr


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"owners": [1]}', b'{"owners": [{"device": 7}]}',
                                  b"[" * 100000])
def test_a_malformed_answer_is_a_reason_not_a_crash(body):
    with pytest.raises(PodResourcesError):
        podmap.decode(body, "node-a")


def test_what_the_relay_says_is_bounded():
    rows = [{"device": f"GPU-{i}", "pod": "p" * 1000, "namespace": "n", "container": "c"} for i in range(5000)]
    owners = podmap.decode(json.dumps({"node": "node-a", "owners": rows}).encode(), "node-a")
    assert len(owners) == 1024 and max(len(o.pod) for o in owners.values()) == 253
