"""Which pod, namespace and container hold a GPU or a MIG instance: the labels dcgm-exporter adds.

The kubelet names allocated devices by the IDs its device plugin gave them; NVIDIA's plugin uses
the GPU UUID (`GPU-...`) for a whole GPU and, for a MIG instance, the MIG UUID (`MIG-...`; drivers
before R470 wrote `MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>`). `DeviceOwners` keeps
only NVIDIA device IDs (`GPU-`, `MIG-`), at most MAX_DEVICES of them, so what the kubelet lists cannot
grow the exporter's memory or its series.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.gpu.provider import GpuInfo, MigInfo

# Kubernetes object names are at most 253 characters (pods), 63 (namespaces, containers); a value
# longer than the longest legal one is cut, so nothing the kubelet says can grow a label unboundedly.
MAX_NAME_CHARS = 253
MAX_DEVICES = 1024  # NVIDIA device IDs kept from one listing (a node has at most a few dozen GPUs and MIG instances)
NVIDIA_ID_PREFIXES = ("GPU-", "MIG-")


@dataclass(frozen=True, slots=True)
class DeviceOwner:
    """The container a device is allocated to."""

    pod: str
    namespace: str
    container: str

    @classmethod
    def of(cls, pod: str, namespace: str, container: str) -> DeviceOwner:
        return cls(pod[:MAX_NAME_CHARS], namespace[:MAX_NAME_CHARS], container[:MAX_NAME_CHARS])


NO_OWNER = DeviceOwner("", "", "")

DeviceOwners = dict[str, DeviceOwner]  # device ID (GPU or MIG UUID, or the legacy MIG path) -> owner


def device_ids(info: GpuInfo, mig: MigInfo | None = None) -> tuple[str, ...]:
    """The IDs a device plugin may give this GPU, or this MIG instance of it."""
    if mig is None:
        return (info.uuid,)
    ids = [mig.uuid] if mig.uuid else []
    ci = mig.compute_instance_id if mig.compute_instance_id is not None else 0
    ids.append(f"MIG-{info.uuid}/{mig.gpu_instance_id}/{ci}")
    return tuple(ids)


def owner_of(owners: DeviceOwners | None, info: GpuInfo, mig: MigInfo | None = None) -> DeviceOwner:
    """The device's owner, or NO_OWNER (empty labels) when no container holds it or nothing is known."""
    if owners:
        for device_id in device_ids(info, mig):
            owner = owners.get(device_id)
            if owner is not None:
                return owner
    return NO_OWNER

