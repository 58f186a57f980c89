"""A scripted stand-in for the pynvml module (the only way to test NVML's mapping without a GPU), and small
helpers over the samples a GPU collector returns."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as real_nvml

from exporter.model import NormSample
from llmslo import conventions as c

GiB = 2**30
XID_EVENT = real_nvml.nvmlEventTypeXidCriticalError


# ------------------------------------------------------------------------------------------------
# A scripted stand-in for the pynvml module: the real binding's error classes and constants,
# devices whose every call can be made to fail the way NVML fails.
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Handle:
    gpu: int
    mig_slot: int | None = None


@dataclass
class FakeMig:
    gpu_instance_id: int
    profile: str
    total: int
    used: int
    procs: list[tuple[int, int | None]] = field(default_factory=list)


@dataclass
class FakeDevice:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    bus_id: bytes = b"00000000:18:00.0"
    total: int = 80 * GiB
    reserved: int = GiB // 2
    used: int = 70 * GiB
    util_gpu: int = 87
    util_mem: int = 40
    power_mw: int = 350_123
    energy_mj: int = 123_456_789
    temp_c: int = 61
    sm_mhz: int = 1980
    mem_mhz: int = 2619
    reasons: int = 0x4 | 0x20
    ecc: tuple[int, int] = (3, 1)
    replays: int = 7
    procs: list[tuple[int, int | None]] = field(default_factory=lambda: [(4242, 60 * GiB), (4343, None)])
    migs: list[FakeMig] = field(default_factory=list)
    lost: bool = False
    errors: dict[str, type] = field(default_factory=dict)  # pynvml function name -> NVMLError subclass


class FakeNvml:
    """Implements the pynvml calls the provider makes; constants and errors are the real binding's."""

    def __init__(self, devices: list[FakeDevice], init_error: Exception | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.events: list[SimpleNamespace] = []
        self.calls: Counter[str] = Counter()
        self.wait_timeouts: list[int] = []
        self.shut_down = False

    def __getattr__(self, name: str) -> Any:
        value = getattr(real_nvml, name)
        if name.startswith("nvml") and callable(value) and not isinstance(value, type):
            raise AttributeError(name)  # a call this stand-in does not implement
        return value

    # -- library ----------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._device("nvmlDeviceGetHandleByIndex", Handle(index))
        return Handle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Handle:
        for index, device in enumerate(self.devices):
            if device.uuid == uuid:
                self._device("nvmlDeviceGetHandleByUUID", Handle(index))
                return Handle(index)
        raise real_nvml.NVMLError_NotFound()

    # -- one device ---------------------------------------------------------------------------------
    def _device(self, fn: str, handle: Handle) -> FakeDevice:
        self.calls[fn] += 1
        device = self.devices[handle.gpu]
        if device.lost:
            raise real_nvml.NVMLError_GpuIsLost()
        if fn in device.errors:
            raise device.errors[fn]()
        return device

    def _mig(self, fn: str, handle: Handle) -> FakeMig:
        return self._device(fn, handle).migs[handle.mig_slot]

    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        if h.mig_slot is not None:
            return f"MIG-{self._mig('nvmlDeviceGetUUID', h).gpu_instance_id}"
        return self._device("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h: Handle) -> str:
        name = self._device("nvmlDeviceGetName", h).name
        return f"{name} MIG {self._mig('nvmlDeviceGetName', h).profile}" if h.mig_slot is not None else name

    def nvmlDeviceGetPciInfo(self, h: Handle) -> SimpleNamespace:
        return SimpleNamespace(busId=self._device("nvmlDeviceGetPciInfo", h).bus_id)

    def nvmlDeviceGetMemoryInfo(self, h: Handle, version: int | None = None) -> SimpleNamespace:
        if h.mig_slot is not None:
            if version is not None:  # as on hardware that has no v2 for MIG instances
                raise real_nvml.NVMLError_NotSupported()
            m = self._mig("nvmlDeviceGetMemoryInfo", h)
            return SimpleNamespace(total=m.total, used=m.used, free=m.total - m.used)
        fn = "nvmlDeviceGetMemoryInfo_v2" if version is not None else "nvmlDeviceGetMemoryInfo"
        d = self._device(fn, h)
        free = d.total - d.reserved - d.used
        if version is not None:
            assert version == real_nvml.nvmlMemory_v2
            return SimpleNamespace(version=version, total=d.total, reserved=d.reserved, free=free, used=d.used)
        return SimpleNamespace(total=d.total, free=free, used=d.used + d.reserved)  # v1 counts reserved as used

    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> SimpleNamespace:
        d = self._device("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=d.util_gpu, memory=d.util_mem)

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        return self._device("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Handle) -> int:
        return self._device("nvmlDeviceGetTotalEnergyConsumption", h).energy_mj

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        assert sensor == real_nvml.NVML_TEMPERATURE_GPU
        return self._device("nvmlDeviceGetTemperature", h).temp_c

    def nvmlDeviceGetClockInfo(self, h: Handle, clock: int) -> int:
        d = self._device("nvmlDeviceGetClockInfo", h)
        return {real_nvml.NVML_CLOCK_SM: d.sm_mhz, real_nvml.NVML_CLOCK_MEM: d.mem_mhz}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Handle) -> int:
        return self._device("nvmlDeviceGetCurrentClocksEventReasons", h).reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Handle) -> int:
        return self._device("nvmlDeviceGetCurrentClocksThrottleReasons", h).reasons

    def nvmlDeviceGetTotalEccErrors(self, h: Handle, error_type: int, counter_type: int) -> int:
        assert counter_type == real_nvml.NVML_VOLATILE_ECC
        corrected, uncorrected = self._device("nvmlDeviceGetTotalEccErrors", h).ecc
        return corrected if error_type == real_nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else uncorrected

    def nvmlDeviceGetPcieReplayCounter(self, h: Handle) -> int:
        return self._device("nvmlDeviceGetPcieReplayCounter", h).replays

    def nvmlDeviceGetComputeRunningProcesses(self, h: Handle) -> list[SimpleNamespace]:
        procs = (
            self._mig("nvmlDeviceGetComputeRunningProcesses", h).procs
            if h.mig_slot is not None
            else self._device("nvmlDeviceGetComputeRunningProcesses", h).procs
        )
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in procs]

    # -- MIG -------------------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, h: Handle) -> list[int]:
        on = bool(self._device("nvmlDeviceGetMigMode", h).migs)
        return [int(on), int(on)]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Handle) -> int:
        self._device("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Handle, slot: int) -> Handle:
        if slot >= len(self._device("nvmlDeviceGetMigDeviceHandleByIndex", h).migs):
            raise real_nvml.NVMLError_NotFound()
        return Handle(h.gpu, slot)

    def nvmlDeviceGetGpuInstanceId(self, h: Handle) -> int:
        return self._mig("nvmlDeviceGetGpuInstanceId", h).gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, h: Handle) -> int:
        self._mig("nvmlDeviceGetComputeInstanceId", h)
        return 0

    # -- events ---------------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceGetSupportedEventTypes(self, h: Handle) -> int:
        self._device("nvmlDeviceGetSupportedEventTypes", h)
        return real_nvml.nvmlEventTypeAll

    def nvmlDeviceRegisterEvents(self, h: Handle, types: int, event_set: str) -> None:
        assert types & XID_EVENT and event_set == "event-set"
        self._device("nvmlDeviceRegisterEvents", h)

    def nvmlEventSetWait(self, event_set: str, timeout_ms: int) -> SimpleNamespace:
        self.wait_timeouts.append(timeout_ms)
        if not self.events:
            raise real_nvml.NVMLError_Timeout()
        return self.events.pop(0)

    def nvmlEventSetFree(self, event_set: str) -> None:
        pass

    def queue_xid(self, gpu: int, code: int, event_type: int = XID_EVENT) -> None:
        self.events.append(SimpleNamespace(device=Handle(gpu), eventType=event_type, eventData=code,
                                           gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF))


def two_gpus() -> FakeNvml:
    return FakeNvml([
        FakeDevice(uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000"),
        FakeDevice(uuid="GPU-bbbbbbbb-1111-1111-1111-111111111111", bus_id=b"00000000:2A:00.0", power_mw=650_000),
    ])


# ------------------------------------------------------------------------------------------------
# Helpers over samples
# ------------------------------------------------------------------------------------------------
def pick(samples: list[NormSample], metric: c.MetricDef, **labels: str) -> list[NormSample]:
    return [s for s in samples if s.metric is metric and all(s.labels.get(k) == v for k, v in labels.items())]


def value(samples: list[NormSample], metric: c.MetricDef, **labels: str) -> float:
    found = pick(samples, metric, **labels)
    assert len(found) == 1, f"{metric.name} {labels}: {len(found)} samples"
    return found[0].value


def names_for_gpu(samples: list[NormSample], gpu: str) -> set[str]:
    return {s.name for s in samples if s.labels[c.LABEL_GPU] == gpu}


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now
