"""GPU readings -> normalized samples with dcgm-exporter's label names, one cycle at a time.

Labels are dcgm-exporter's (`gpu`, `UUID`, `pci_bus_id`, `hostname`, and for a MIG instance
`GPU_I_ID` and `GPU_I_PROFILE`, empty on whole-GPU series) and the `pod`, `namespace` and `container`
that hold the device (from the kubelet, see podresources.py; empty when none does) so dashboards built on DCGM_FI_*
series join ours on the same labels; its `modelName` is `model_name` here, as promtool's lint
rejects camelCase label names. A field the provider did not report produces
no sample. A lost GPU reports `llm_gpu_up 0` with its identity labels and the others carry on.

XID errors arrive as events, not as a counter NVML keeps, so the collector counts them; the
counts live as long as the provider does (see `collect_gpus`).
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from collections.abc import Iterable

from exporter.gpu.owners import DeviceOwners, owner_of
from exporter.gpu.provider import (
    CLOCK_EVENT_REASONS,
    GpuError,
    GpuInfo,
    GpuProvider,
    GpuReading,
    GpuUnavailable,
    MemoryReading,
    MigInfo,
    ProcessMemory,
)
from exporter.logs import event
from exporter.model import NormSample
from llmslo import conventions as c
from llmslo.conventions import MetricDef

ECC_CORRECTED = "corrected"
ECC_UNCORRECTED = "uncorrected"


def gpu_labels(
    info: GpuInfo, hostname: str, mig: MigInfo | None = None, owners: DeviceOwners | None = None
) -> dict[str, str]:
    """The label set every GPU series carries: identity, host, the MIG instance if any, and its owner.

    The owner labels are always there, empty when unknown: with the PodMonitor's honorLabels, an absent
    `pod` would be filled in with the exporter's own pod, naming the wrong workload.
    """
    owner = owner_of(owners, info, mig)
    return {
        c.LABEL_GPU: str(info.index),
        c.LABEL_UUID: info.uuid,
        c.LABEL_MODEL_NAME: info.name,
        c.LABEL_PCI_BUS_ID: info.pci_bus_id,
        c.LABEL_HOSTNAME: hostname,
        c.LABEL_GPU_INSTANCE_ID: "" if mig is None else str(mig.gpu_instance_id),
        c.LABEL_GPU_INSTANCE_PROFILE: "" if mig is None else mig.profile,
        c.LABEL_POD: owner.pod,
        c.LABEL_NAMESPACE: owner.namespace,
        c.LABEL_CONTAINER: owner.container,
    }


class GpuCollector:
    """Reads every GPU once per `collect()`; keeps XID counts and who is down between cycles."""

    def __init__(self, provider: GpuProvider, hostname: str) -> None:
        self.provider = provider
        self.hostname = hostname
        self.xid_counts: Counter[tuple[int, int]] = Counter()  # (gpu index, xid) -> events seen
        self.down: dict[int, str] = {}  # gpu index -> why it reported llm_gpu_up 0 last cycle

    def collect(self, owners: DeviceOwners | None = None) -> list[NormSample]:
        """One cycle, labelled with `owners` (device ID -> container). Never raises: whatever breaks
        becomes `llm_gpu_up 0` and a logged reason."""
        try:
            indexes = [info.index for info in self.provider.devices()]
            unavailable = self._poll_xids()
            outcomes = {index: unavailable or self._read(index) for index in indexes}
            # Asked again: a GPU lost since start-up tells the provider who it is once it answers.
            devices = self.provider.devices()
        except Exception as exc:  # a provider bug must not take the exporter down
            event("gpu_devices_failed", logging.WARNING, provider=self.provider.name, reason=repr(exc))
            return []
        samples: list[NormSample] = []
        for info in devices:
            labels = gpu_labels(info, self.hostname, owners=owners)
            outcome = outcomes.get(info.index, "GPU appeared during the cycle")
            if isinstance(outcome, GpuReading):
                samples.extend(reading_samples(outcome, info, self.hostname, owners))
            reason = "" if isinstance(outcome, GpuReading) else outcome
            samples.append(NormSample(c.GPU_UP, dict(labels), 0.0 if reason else 1.0))
            self._note(info, reason)
            for (index, xid), count in sorted(self.xid_counts.items()):
                if index == info.index:
                    samples.append(NormSample(c.GPU_XID_ERRORS, {**labels, c.LABEL_XID: str(xid)}, float(count)))
        return samples

    def _poll_xids(self) -> str:
        """Count new XID events; return a reason when NVML as a whole is gone."""
        try:
            events = self.provider.poll_xid_events()
        except GpuUnavailable as exc:
            return exc.reason
        except Exception as exc:
            event("gpu_xid_poll_failed", logging.WARNING, provider=self.provider.name, reason=repr(exc))
            return ""
        for xid in events:
            self.xid_counts[(xid.index, xid.code)] += 1
            event("gpu_xid", logging.WARNING, gpu=xid.index, xid=xid.code)
        return ""

    def _read(self, index: int) -> GpuReading | str:
        """The GPU's reading, or why there is none."""
        try:
            return self.provider.read(index)
        except GpuError as exc:  # GpuLost (this GPU) or GpuUnavailable (NVML as a whole)
            return exc.reason
        except Exception as exc:
            return f"unexpected provider error: {exc!r}"

    def _note(self, info: GpuInfo, reason: str) -> None:
        """Log a GPU going down or coming back once, not every cycle."""
        previous = self.down.get(info.index)
        if reason:
            if previous is None:  # the reason may vary by the call that failed; log the transition only
                event("gpu_down", logging.WARNING, gpu=info.index, uuid=info.uuid, reason=reason)
            self.down[info.index] = reason
        elif not reason and previous is not None:
            event("gpu_up", gpu=info.index, uuid=info.uuid)
            del self.down[info.index]


def reading_samples(
    reading: GpuReading, info: GpuInfo, hostname: str, owners: DeviceOwners | None = None
) -> list[NormSample]:
    """Map one reading to samples; fields that are None produce nothing."""
    labels = gpu_labels(info, hostname, owners=owners)
    out: list[NormSample] = []

    def put(metric: MetricDef, value: float | int | None, extra: dict[str, str] | None = None) -> None:
        if value is not None:
            out.append(NormSample(metric, {**labels, **(extra or {})}, float(value)))

    _memory_samples(out, reading.memory, labels)
    put(c.GPU_UTILIZATION, reading.gpu_utilization_ratio)
    put(c.GPU_MEMORY_UTILIZATION, reading.memory_utilization_ratio)
    put(c.GPU_POWER, reading.power_watts)
    put(c.GPU_ENERGY, reading.energy_joules)
    put(c.GPU_TEMPERATURE, reading.temperature_celsius)
    put(c.GPU_SM_CLOCK, reading.sm_clock_hertz)
    put(c.GPU_MEMORY_CLOCK, reading.memory_clock_hertz)
    if reading.clock_event_reasons is not None:
        for bit, name in CLOCK_EVENT_REASONS.items():
            put(c.GPU_CLOCK_EVENT, 1 if reading.clock_event_reasons & bit else 0, {c.LABEL_CLOCK_EVENT: name})
    put(c.GPU_ECC_ERRORS, reading.ecc_corrected_total, {c.LABEL_ECC_TYPE: ECC_CORRECTED})
    put(c.GPU_ECC_ERRORS, reading.ecc_uncorrected_total, {c.LABEL_ECC_TYPE: ECC_UNCORRECTED})
    put(c.GPU_PCIE_REPLAYS, reading.pcie_replays_total)
    _process_samples(out, reading.processes, labels)
    for instance in reading.mig:
        mig_labels = gpu_labels(info, hostname, instance.info, owners)
        _memory_samples(out, instance.memory, mig_labels)
        _process_samples(out, instance.processes, mig_labels)
    return out


def _memory_samples(out: list[NormSample], memory: MemoryReading, labels: dict[str, str]) -> None:
    for metric, value in (
        (c.GPU_MEMORY_TOTAL, memory.total_bytes),
        (c.GPU_MEMORY_USED, memory.used_bytes),
        (c.GPU_MEMORY_FREE, memory.free_bytes),
        (c.GPU_MEMORY_RESERVED, memory.reserved_bytes),
    ):
        if value is not None:
            out.append(NormSample(metric, dict(labels), float(value)))


def _process_samples(out: list[NormSample], processes: Iterable[ProcessMemory] | None, labels: dict[str, str]) -> None:
    for proc in processes or ():
        out.append(NormSample(c.GPU_PROCESS_MEMORY, {**labels, c.LABEL_PID: str(proc.pid)}, float(proc.used_bytes)))


# One collector per live provider: contract 3 is a plain function, yet XID counts must outlive
# a cycle. Keyed weakly, so closing and dropping a provider drops its counts too.
_collectors: "weakref.WeakKeyDictionary[object, GpuCollector]" = weakref.WeakKeyDictionary()


def collect_gpus(provider: GpuProvider, hostname: str, owners: DeviceOwners | None = None) -> list[NormSample]:
    """Samples for every GPU the provider knows, with `hostname` as dcgm-exporter's label and each
    device's owner from `owners`. Never raises."""
    try:
        collector = _collectors.get(provider)
        if collector is None or collector.hostname != hostname:
            collector = _collectors[provider] = GpuCollector(provider, hostname)
    except TypeError:  # a provider that cannot be weakly referenced: no memory between cycles
        collector = GpuCollector(provider, hostname)
    return collector.collect(owners)
