"""GPUs tied to pods: the exporter against a real gRPC server speaking the kubelet's pod-resources API.

The stand-in is grpc's own server on a unix socket, answering `v1.PodResourcesLister/List` with bytes
encoded here by hand from the kubelet's field numbers, fields the exporter does not read included
(topology, cpu_ids): what a kubelet sends, not what our stubs would write.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from exporter import cli
from exporter.collector import Collector
from exporter.config import ExporterConfig
from exporter.exposition import render
from exporter.gpu import podresources_pb2 as pb
from exporter.gpu.fake import FakeProvider, fake_uuid
from exporter.gpu.owners import MAX_DEVICES, MAX_NAME_CHARS
from exporter.gpu.podresources import owners_from_response
from exporter.logs import EXPORTER_LOGGER
from llmslo import conventions as c

REPO = Path(__file__).resolve().parents[2]


# ---- the kubelet's wire format, by hand (k8s.io/kubelet/pkg/apis/podresources/v1/api.proto) ----------------
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def devices(resource: str, *ids: str, numa: int | None = 0) -> bytes:
    """ContainerDevices{resource_name=1, device_ids=2, topology=3{nodes=1{ID=1}}}."""
    body = _field(1, resource) + b"".join(_field(2, i) for i in ids)
    if numa is not None:
        body += _field(3, _field(1, _varint(1 << 3 | 0) + _varint(numa)))
    return body


def container(name: str, *device_sets: bytes, cpus: tuple[int, ...] = (2, 3)) -> bytes:
    """ContainerResources{name=1, devices=2, cpu_ids=3 (packed int64)}."""
    body = _field(1, name) + b"".join(_field(2, d) for d in device_sets)
    if cpus:
        body += _field(3, b"".join(_varint(cpu) for cpu in cpus))
    return body


def pod(name: str, namespace: str, *containers: bytes) -> bytes:
    """PodResources{name=1, namespace=2, containers=3}, as a ListPodResourcesResponse.pod_resources (1) entry."""
    return _field(1, _field(1, name) + _field(2, namespace) + b"".join(_field(3, k) for k in containers))


class StandInKubelet:
    """grpc's server on a unix socket with the kubelet's List method, answering `self.answer`."""

    def __init__(self, path: str) -> None:
        self.answer = b""
        self.calls = 0
        self.hang: threading.Event | None = None  # set: List waits on it (a kubelet that does not answer)
        self.fail: grpc.StatusCode | None = None
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=pb.ListPodResourcesRequest.FromString,
                response_serializer=lambda raw: raw,
            ),
        })
        self.server.add_generic_rpc_handlers((handler,))
        assert self.server.add_insecure_port(f"unix://{path}")
        self.server.start()

    def _list(self, request, context):
        self.calls += 1
        if self.hang is not None:
            self.hang.wait(10)
        if self.fail is not None:
            context.abort(self.fail, "kubelet says no")
        return self.answer

    def stop(self) -> None:
        if self.hang is not None:
            self.hang.set()
        self.server.stop(None)


@pytest.fixture
def sockdir():
    path = tempfile.mkdtemp(prefix="podres-", dir="/tmp")  # unix socket paths are limited to 107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(sockdir):
    k = StandInKubelet(os.path.join(sockdir, "kubelet.sock"))
    k.path = os.path.join(sockdir, "kubelet.sock")
    yield k
    k.stop()


class Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def events():
    handler = Events()
    log = logging.getLogger(EXPORTER_LOGGER)
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield handler
    log.removeHandler(handler)
    log.setLevel(old_level)


GPUS = [fake_uuid("GPU", i) for i in range(8)]
MIG_3G = fake_uuid("MIG", 7, 2)  # GPU 7 in MIG mode: instance 1 is 4g.40gb, instance 2 is 3g.40gb


def fleet_answer(seventy_b_gpus=GPUS[:4]) -> bytes:
    """The SRE's node: the TP=4 70B on four GPUs, an SGLang Qwen on a MIG slice, and pods with no GPU."""
    return b"".join([
        pod("llama-70b-0", "llm-chat",
            container("vllm", devices("nvidia.com/gpu", *seventy_b_gpus[:2]), devices("nvidia.com/gpu", *seventy_b_gpus[2:], numa=1)),
            container("tap", cpus=())),
        pod("qwen-sglang-7f9c", "llm-batch", container("sglang", devices("nvidia.com/mig-3g.40gb", MIG_3G))),
        pod("fpga-job", "other", container("main", devices("example.com/fpga", "fpga0", "GPU-not-on-this-node"))),
        pod("web", "default", container("nginx")),
    ])


def collector(socket: str, provider, timeout_s: float = 2.0) -> Collector:
    config = ExporterConfig(gpu="fake:8", pod_resources_socket=socket, pod_resources_timeout_s=timeout_s)
    return Collector(config, None, provider, "node-a")


def gpu_series(snapshot, metric, **match) -> list[dict[str, str]]:
    return [s.labels for s in snapshot.samples
            if s.metric is metric and all(s.labels.get(k) == v for k, v in match.items())]


def self_metric(snapshot, metric) -> float | None:
    values = [s.value for s in snapshot.samples if s.metric is metric]
    return values[0] if values else None


def owner(labels: dict[str, str]) -> tuple[str, str, str]:
    return labels[c.LABEL_POD], labels[c.LABEL_NAMESPACE], labels[c.LABEL_CONTAINER]


def test_the_70b_four_gpus_and_a_mig_slice_map_to_their_pods(kubelet) -> None:
    kubelet.answer = fleet_answer()
    col = collector(kubelet.path, FakeProvider(8, mig_index=7))
    snap = asyncio.run(col.collect([]))
    for gpu in range(4):
        (up,) = gpu_series(snap, c.GPU_UP, gpu=str(gpu))
        assert owner(up) == ("llama-70b-0", "llm-chat", "vllm"), gpu
        assert {owner(l) for l in gpu_series(snap, c.GPU_POWER, gpu=str(gpu))} == {("llama-70b-0", "llm-chat", "vllm")}
    for gpu in range(4, 8):  # GPUs no container holds, and GPU 7's whole-GPU series: empty, never absent
        for labels in gpu_series(snap, c.GPU_UP, gpu=str(gpu)) + gpu_series(snap, c.GPU_MEMORY_USED, gpu=str(gpu), GPU_I_ID=""):
            assert owner(labels) == ("", "", ""), labels
    (mig,) = gpu_series(snap, c.GPU_MEMORY_USED, gpu="7", GPU_I_ID="2")
    assert owner(mig) == ("qwen-sglang-7f9c", "llm-batch", "sglang") and mig[c.LABEL_GPU_INSTANCE_PROFILE] == "3g.40gb"
    (other_slice,) = gpu_series(snap, c.GPU_MEMORY_USED, gpu="7", GPU_I_ID="1")
    assert owner(other_slice) == ("", "", "")
    assert self_metric(snap, c.EXPORTER_GPU_POD_MAPPING_UP) == 1
    assert self_metric(snap, c.EXPORTER_GPU_POD_MAPPED_DEVICES) == 6  # 4 GPUs, the MIG slice, the stray GPU- id
    page = render(snap.samples).decode()
    assert 'container="vllm"' in page and 'pod="llama-70b-0"' in page and 'namespace="llm-batch"' in page
    assert "fpga0" not in page and "nginx" not in page


def test_the_mapping_is_listed_again_every_cycle(kubelet) -> None:
    kubelet.answer = fleet_answer()
    col = collector(kubelet.path, FakeProvider(8))
    asyncio.run(col.collect([]))
    kubelet.answer = fleet_answer(GPUS[4:])  # the 70B rescheduled onto the other four GPUs
    snap = asyncio.run(col.collect([]))
    assert kubelet.calls == 2
    assert owner(gpu_series(snap, c.GPU_UP, gpu="0")[0]) == ("", "", "")
    assert owner(gpu_series(snap, c.GPU_UP, gpu="5")[0]) == ("llama-70b-0", "llm-chat", "vllm")


def test_a_legacy_mig_device_id_maps_to_its_instance(kubelet) -> None:
    kubelet.answer = pod("old", "llm", container("vllm", devices("nvidia.com/mig-4g.40gb", f"MIG-{GPUS[7]}/1/0")))
    snap = asyncio.run(collector(kubelet.path, FakeProvider(8, mig_index=7)).collect([]))
    (mig,) = gpu_series(snap, c.GPU_MEMORY_USED, gpu="7", GPU_I_ID="1")
    assert owner(mig) == ("old", "llm", "vllm")


def test_without_the_socket_it_says_so_once_and_goes_on(sockdir, events) -> None:
    path = os.path.join(sockdir, "kubelet.sock")
    col = collector(path, FakeProvider(4))
    for _ in range(3):
        snap = asyncio.run(col.collect([]))
        assert snap.gpus_up == 4
        assert {owner(l) for l in gpu_series(snap, c.GPU_UP)} == {("", "", "")}
        assert self_metric(snap, c.EXPORTER_GPU_POD_MAPPING_UP) == 0
    unavailable = [line for line in events.lines if "event=gpu_pod_mapping_unavailable" in line]
    assert len(unavailable) == 1 and f"no kubelet pod-resources socket at {path}" in unavailable[0]
    kubelet = StandInKubelet(path)  # the kubelet comes up: the next cycle maps, and says so
    try:
        kubelet.answer = fleet_answer()
        snap = asyncio.run(col.collect([]))
    finally:
        kubelet.stop()
    assert self_metric(snap, c.EXPORTER_GPU_POD_MAPPING_UP) == 1
    assert owner(gpu_series(snap, c.GPU_UP, gpu="3")[0]) == ("llama-70b-0", "llm-chat", "vllm")
    assert sum("event=gpu_pod_mapping_up" in line for line in events.lines) == 1


@pytest.mark.parametrize("failure", ["error", "hang", "not a socket"])
def test_a_kubelet_that_fails_leaves_the_labels_empty(kubelet, sockdir, events, failure) -> None:
    kubelet.answer = fleet_answer()
    path = kubelet.path
    if failure == "error":
        kubelet.fail = grpc.StatusCode.PERMISSION_DENIED
        reason = "PERMISSION_DENIED"
    elif failure == "hang":
        kubelet.hang = threading.Event()
        reason = "DEADLINE_EXCEEDED"
    else:
        path = os.path.join(sockdir, "plain-file")
        Path(path).write_text("")
        reason = "is not a unix socket"
    snap = asyncio.run(collector(path, FakeProvider(4), timeout_s=0.3).collect([]))
    assert snap.gpus_up == 4
    assert {owner(l) for l in gpu_series(snap, c.GPU_UP)} == {("", "", "")}
    assert self_metric(snap, c.EXPORTER_GPU_POD_MAPPING_UP) == 0
    (line,) = [line for line in events.lines if "event=gpu_pod_mapping_unavailable" in line]
    assert reason in line


def test_off_and_no_gpus_ask_no_kubelet(kubelet) -> None:
    kubelet.answer = fleet_answer()
    snap = asyncio.run(collector("off", FakeProvider(4)).collect([]))
    assert self_metric(snap, c.EXPORTER_GPU_POD_MAPPING_UP) is None
    assert {owner(l) for l in gpu_series(snap, c.GPU_UP)} == {("", "", "")}
    snap = asyncio.run(collector(kubelet.path, FakeProvider(0)).collect([]))
    assert kubelet.calls == 0 and self_metric(snap, c.EXPORTER_GPU_POD_MAPPING_UP) is None


def test_what_the_kubelet_says_is_bounded() -> None:
    long = "p" * 1000
    response = pb.ListPodResourcesResponse(pod_resources=[
        pb.PodResources(name=long, namespace="n" * 400, containers=[pb.ContainerResources(name="c" * 300, devices=[
            pb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[f"GPU-{i}" for i in range(MAX_DEVICES + 50)]),
        ])]),
    ])
    owners = owners_from_response(response)
    assert len(owners) == MAX_DEVICES
    first = owners["GPU-0"]
    assert len(first.pod) == len(first.namespace) == len(first.container) == MAX_NAME_CHARS


def test_cli_once_labels_gpus_with_their_pods(kubelet, capsys) -> None:
    kubelet.answer = fleet_answer()
    assert cli.main(["--once", "--gpu", "fake:4", "--pod-resources-socket", kubelet.path]) == 0
    page = capsys.readouterr().out
    assert page.count('container="vllm"') >= 4 and "llm_exporter_gpu_pod_mapping_up 1" in page


def test_cli_refuses_a_relative_socket_path(capsys) -> None:
    assert cli.main(["--once", "--gpu", "fake:1", "--pod-resources-socket", "kubelet.sock"]) == cli.EXIT_CONFIG
    err = capsys.readouterr().err
    assert "--pod-resources-socket" in err and "absolute path" in err and "(fix: " in err


def test_committed_stubs_are_what_the_proto_makes(tmp_path) -> None:
    gpu = REPO / "exporter" / "gpu"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{gpu}", f"--python_out={tmp_path}",
                    str(gpu / "podresources.proto")], check=True)
    made = (tmp_path / "podresources_pb2.py").read_text()
    committed = (gpu / "podresources_pb2.py").read_text()
    # The descriptor is the proto; the runtime-version lines around it follow whichever protoc ran.
    descriptor = lambda text: [l for l in text.splitlines() if l.startswith("DESCRIPTOR = ")]  # noqa: E731
    assert descriptor(made) == descriptor(committed) and len(descriptor(made)) == 1
