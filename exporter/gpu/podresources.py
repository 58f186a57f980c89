"""The kubelet's pod-resources API, read once per cycle: which container holds which GPU.

One unary gRPC call (`v1.PodResourcesLister/List`) over the kubelet's unix socket, with a deadline
and a cap on the answer's size, as dcgm-exporter makes it. The messages are the subset of the
kubelet's API in podresources.proto (podresources_pb2.py is protoc's output for it). gRPC and
protobuf are imported only once the socket exists: a node without a kubelet pays nothing.

`PodMapper` keeps the state between cycles: the channel, whether the last listing worked (the
self-metric `llm_exporter_gpu_pod_mapping_up`), and the log lines, written when mapping stops or
starts working, never every cycle.
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Any, Protocol

from exporter.gpu.owners import MAX_DEVICES, NVIDIA_ID_PREFIXES, DeviceOwner, DeviceOwners
from exporter.logs import event
from exporter.model import NormSample
from llmslo import conventions as c

LIST_METHOD = "/v1.PodResourcesLister/List"
MAX_RESPONSE_BYTES = 16 * 2**20  # the kubelet's own cap on a pod-resources message


class PodResourcesError(Exception):
    """Why no listing came back (socket missing, refused, deadline, a malformed answer)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def owners_from_response(response: Any) -> DeviceOwners:
    """Device ID -> owning container, for NVIDIA device IDs only, at most MAX_DEVICES of them."""
    owners: DeviceOwners = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                for device_id in devices.device_ids:
                    if not device_id.startswith(NVIDIA_ID_PREFIXES) or device_id in owners:
                        continue
                    if len(owners) >= MAX_DEVICES:
                        return owners
                    owners[device_id] = DeviceOwner.of(pod.name, pod.namespace, container.name)
    return owners


class OwnersClient(Protocol):
    """Where a listing comes from: the kubelet's socket here, or the node's relay (exporter/gpu/podmap.py)."""

    source: str

    def list_owners(self) -> DeviceOwners: ...

    def close(self) -> None: ...


class PodResourcesClient:
    """A channel to the kubelet's socket, opened on the first call and kept (gRPC reconnects it)."""

    def __init__(self, socket_path: str, timeout_s: float) -> None:
        self.socket_path = self.source = socket_path
        self.timeout_s = timeout_s
        self._channel: Any = None
        self._list: Any = None

    def list_owners(self) -> DeviceOwners:
        """One listing. Raises PodResourcesError with a reason an operator can act on."""
        try:
            mode = os.stat(self.socket_path).st_mode
        except FileNotFoundError:
            raise PodResourcesError(f"no kubelet pod-resources socket at {self.socket_path}") from None
        except OSError as exc:
            raise PodResourcesError(f"cannot reach {self.socket_path}: {exc.strerror or exc}") from None
        if not stat.S_ISSOCK(mode):
            raise PodResourcesError(f"{self.socket_path} is not a unix socket")
        import grpc  # only here: a node without the socket never loads gRPC

        if self._list is None:
            from exporter.gpu import podresources_pb2 as pb

            self._channel = grpc.insecure_channel(
                f"unix://{os.path.abspath(self.socket_path)}",
                options=[("grpc.max_receive_message_length", MAX_RESPONSE_BYTES), ("grpc.enable_http_proxy", 0)],
            )
            self._list = self._channel.unary_unary(
                LIST_METHOD,
                request_serializer=pb.ListPodResourcesRequest.SerializeToString,
                response_deserializer=pb.ListPodResourcesResponse.FromString,
            )
            self._request = pb.ListPodResourcesRequest()
        try:
            response = self._list(self._request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if callable(getattr(exc, "code", None)) else None
            details = exc.details() if callable(getattr(exc, "details", None)) else ""
            name = code.name if code is not None else "UNKNOWN"
            raise PodResourcesError(f"List failed: {name}: {(details or '')[:200]}") from None
        return owners_from_response(response)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._list = None


class PodMapper:
    """The mapping for one cycle, the self-metric, and a log line per change of state."""

    def __init__(self, client: OwnersClient) -> None:
        self.client = client
        self.up: bool | None = None  # None until the first refresh
        self.reason = ""
        self.mapped = 0

    def refresh(self) -> DeviceOwners:
        """This cycle's owners; {} (empty labels) when the kubelet cannot be read. Never raises."""
        try:
            owners = self.client.list_owners()
        except PodResourcesError as exc:
            return self._failed(exc.reason)
        except Exception as exc:  # a client bug must not stop GPU metrics
            return self._failed(f"unexpected error: {exc!r}"[:200])
        if self.up is not True:
            event("gpu_pod_mapping_up", source=self.client.source, devices=len(owners))
        self.up, self.reason, self.mapped = True, "", len(owners)
        return owners

    def _failed(self, reason: str) -> DeviceOwners:
        if self.up is not False:  # once when it stops working (or never worked), not every cycle
            event("gpu_pod_mapping_unavailable", logging.WARNING, source=self.client.source, reason=reason,
                  note="GPU series carry empty pod, namespace and container labels")
        self.up, self.reason, self.mapped = False, reason, 0
        return {}

    def samples(self) -> list[NormSample]:
        if self.up is None:
            return []
        return [NormSample(c.EXPORTER_GPU_POD_MAPPING_UP, {}, 1.0 if self.up else 0.0),
                NormSample(c.EXPORTER_GPU_POD_MAPPED_DEVICES, {}, float(self.mapped))]

    def close(self) -> None:
        self.client.close()
