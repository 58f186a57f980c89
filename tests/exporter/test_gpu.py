"""GPU provider and collector: NVML's mapping (through a scripted stand-in for the pynvml
module, the only way without a GPU), the fake provider, faults, and dcgm-exporter compatibility.
"""

from __future__ import annotations

import inspect
import logging
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml as real_nvml
import pytest

from exporter.exposition import render
from exporter.gpu import (
    EmptyProvider,
    FakeProvider,
    GpuCollector,
    NvmlProvider,
    collect_gpus,
    open_provider,
)
from exporter.gpu.nvml import MAX_XID_EVENTS_PER_POLL, mig_profile_from_name
from exporter.gpu.spec import parse_spec
from exporter.model import NormSample
from llmslo import conventions as c
from tests.helpers.needs import shared_dir

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / ".." / "shared"
DCGM = SHARED / "peers" / "dcgm"
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


def test_provider_calls_only_real_pynvml_functions_and_the_stand_in_matches_them() -> None:
    """The stand-in proves nothing if it and the provider agree on a name or arity pynvml lacks."""
    source = (REPO / "exporter" / "gpu" / "nvml.py").read_text()
    named = set(re.findall(r'"(nvml[A-Za-z0-9_]+)"', source))  # getattr names and _call's function names
    called = set(re.findall(r'_call\(\s*index,\s*"(nvml[A-Za-z0-9_]+)"', source))
    called |= set(re.findall(r"nv\.(nvml[A-Za-z0-9_]+)\(", source))
    assert len(called) > 20
    for name in named | called:
        assert hasattr(real_nvml, name), f"pynvml has no {name}"
    for name in called:
        assert callable(getattr(real_nvml, name)), f"pynvml's {name} is not a function"
    for name in dir(FakeNvml):
        if name.startswith("nvml"):
            real_params = list(inspect.signature(getattr(real_nvml, name)).parameters)
            fake_params = list(inspect.signature(getattr(FakeNvml, name)).parameters)[1:]  # without self
            assert len(fake_params) == len(real_params), f"{name}: {fake_params} vs pynvml's {real_params}"
    assert "version" in inspect.signature(real_nvml.nvmlDeviceGetMemoryInfo).parameters


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


@pytest.fixture
def events() -> list[str]:
    """Exporter log lines, captured on the exporter's own logger (which may not propagate)."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger("llmslo.exporter")
    handler, old_level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


# ------------------------------------------------------------------------------------------------
# NVML provider: mapping and units
# ------------------------------------------------------------------------------------------------
def test_nvml_reading_maps_every_field_to_base_units() -> None:
    nv = two_gpus()
    samples = GpuCollector(NvmlProvider(nv), "node-a").collect()
    g0 = {"gpu": "0"}
    labels = pick(samples, c.GPU_UP, **g0)[0].labels
    assert labels == {
        "gpu": "0", "UUID": "GPU-aaaaaaaa-0000-0000-0000-000000000000", "model_name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:18:00.0", "hostname": "node-a", "GPU_I_ID": "", "GPU_I_PROFILE": "",
        "pod": "", "namespace": "", "container": "",  # no owner map given: empty, never absent
    }
    assert value(samples, c.GPU_UP, **g0) == 1
    # Memory stays in bytes (dcgm-exporter reports MiB); v2 gives reserved and used without it.
    assert value(samples, c.GPU_MEMORY_TOTAL, **g0) == 80 * GiB
    assert value(samples, c.GPU_MEMORY_USED, **g0) == 70 * GiB
    assert value(samples, c.GPU_MEMORY_RESERVED, **g0) == GiB // 2
    assert value(samples, c.GPU_MEMORY_FREE, **g0) == 80 * GiB - 70 * GiB - GiB // 2
    assert value(samples, c.GPU_UTILIZATION, **g0) == pytest.approx(0.87)  # percent -> ratio
    assert value(samples, c.GPU_MEMORY_UTILIZATION, **g0) == pytest.approx(0.40)
    assert value(samples, c.GPU_POWER, **g0) == pytest.approx(350.123)  # mW -> W
    assert value(samples, c.GPU_POWER, gpu="1") == pytest.approx(650.0)
    assert value(samples, c.GPU_ENERGY, **g0) == pytest.approx(123_456.789)  # mJ -> J
    assert value(samples, c.GPU_TEMPERATURE, **g0) == 61
    assert value(samples, c.GPU_SM_CLOCK, **g0) == 1_980_000_000  # MHz -> Hz
    assert value(samples, c.GPU_MEMORY_CLOCK, **g0) == 2_619_000_000
    active = {s.labels[c.LABEL_CLOCK_EVENT] for s in pick(samples, c.GPU_CLOCK_EVENT, **g0) if s.value == 1}
    assert active == {"power_cap", "sw_thermal"}  # bits 0x4 and 0x20
    assert len(pick(samples, c.GPU_CLOCK_EVENT, **g0)) == 11  # every known reason, 0 when inactive
    assert value(samples, c.GPU_ECC_ERRORS, gpu="0", type="corrected") == 3
    assert value(samples, c.GPU_ECC_ERRORS, gpu="0", type="uncorrected") == 1
    assert value(samples, c.GPU_PCIE_REPLAYS, **g0) == 7
    # One process with attributable memory; the one NVML reports without (None) is left out.
    procs = pick(samples, c.GPU_PROCESS_MEMORY, **g0)
    assert [(s.labels[c.LABEL_PID], s.value) for s in procs] == [("4242", 60 * GiB)]


def test_nvml_not_supported_fields_are_omitted_not_zeroed() -> None:
    nv = two_gpus()
    nv.devices[1].errors = {
        name: real_nvml.NVMLError_NotSupported
        for name in (
            "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTotalEccErrors",
            "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
        )
    } | {"nvmlDeviceGetComputeRunningProcesses": real_nvml.NVMLError_NoPermission}
    samples = GpuCollector(NvmlProvider(nv), "node-a").collect()
    missing = {
        c.GPU_POWER.name, c.GPU_ENERGY.name, c.GPU_ECC_ERRORS.name, c.GPU_PCIE_REPLAYS.name, c.GPU_UTILIZATION.name,
        c.GPU_MEMORY_UTILIZATION.name, c.GPU_CLOCK_EVENT.name, c.GPU_PROCESS_MEMORY.name,
    }
    assert not names_for_gpu(samples, "1") & missing
    assert missing <= names_for_gpu(samples, "0")  # the other GPU still reports all of them
    assert value(samples, c.GPU_UP, gpu="1") == 1  # refusing a query is not being down
    assert value(samples, c.GPU_TEMPERATURE, gpu="1") == 61
    assert value(samples, c.GPU_MEMORY_USED, gpu="1") == 70 * GiB


def test_nvml_older_driver_fallbacks() -> None:
    """No nvmlDeviceGetMemoryInfo_v2 -> v1 (no reserved); no ...ClocksEventReasons -> ...ThrottleReasons."""
    nv = two_gpus()
    nv.devices[0].errors = {
        "nvmlDeviceGetMemoryInfo_v2": real_nvml.NVMLError_FunctionNotFound,
        "nvmlDeviceGetCurrentClocksEventReasons": real_nvml.NVMLError_FunctionNotFound,
    }
    nv.devices[0].reasons = 0x8
    samples = GpuCollector(NvmlProvider(nv), "n").collect()
    assert not pick(samples, c.GPU_MEMORY_RESERVED, gpu="0")
    assert value(samples, c.GPU_MEMORY_USED, gpu="0") == 70 * GiB + GiB // 2  # v1's used includes reserved
    assert value(samples, c.GPU_MEMORY_TOTAL, gpu="0") == 80 * GiB
    assert nv.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1
    assert value(samples, c.GPU_CLOCK_EVENT, gpu="0", clock_event="hw_slowdown") == 1


def test_nvml_gpu_lost_mid_run_then_recovered(events: list[str]) -> None:
    nv = two_gpus()
    collector = GpuCollector(NvmlProvider(nv), "node-a")
    full = names_for_gpu(collector.collect(), "1")
    assert c.GPU_POWER.name in full

    nv.devices[1].lost = True  # every call for it now raises NVMLError_GpuIsLost
    for _ in range(2):
        samples = collector.collect()
        assert value(samples, c.GPU_UP, gpu="1") == 0
        assert names_for_gpu(samples, "1") == {c.GPU_UP.name}
        lost_labels = pick(samples, c.GPU_UP, gpu="1")[0].labels
        assert lost_labels[c.LABEL_UUID] == "GPU-bbbbbbbb-1111-1111-1111-111111111111"  # still joinable
        assert value(samples, c.GPU_UP, gpu="0") == 1
        assert value(samples, c.GPU_POWER, gpu="0") == pytest.approx(350.123)
    assert "GPU is lost" in collector.down[1]
    down_lines = [line for line in events if "event=gpu_down" in line]
    assert len(down_lines) == 1 and "gpu=1" in down_lines[0]  # logged once, not every cycle

    nv.devices[1].lost = False
    samples = collector.collect()
    assert value(samples, c.GPU_UP, gpu="1") == 1
    assert names_for_gpu(samples, "1") == full
    # A lost GPU's handle is looked up again each cycle after the loss: once in vain, once found.
    assert nv.calls["nvmlDeviceGetHandleByUUID"] == 2
    assert collector.down == {}
    assert any("event=gpu_up" in line and "gpu=1" in line for line in events)


def test_nvml_unknown_error_marks_only_that_gpu_down() -> None:
    nv = two_gpus()
    nv.devices[0].errors = {"nvmlDeviceGetPowerUsage": real_nvml.NVMLError_Unknown}
    samples = collect_gpus(NvmlProvider(nv), "n")
    assert value(samples, c.GPU_UP, gpu="0") == 0
    assert value(samples, c.GPU_UP, gpu="1") == 1


def test_nvml_driver_gone_mid_run_marks_every_gpu_down() -> None:
    nv = two_gpus()
    collector = GpuCollector(NvmlProvider(nv), "n")
    assert [s.value for s in pick(collector.collect(), c.GPU_UP)] == [1, 1]
    for device in nv.devices:
        device.errors = {"nvmlDeviceGetMemoryInfo_v2": real_nvml.NVMLError_DriverNotLoaded}
    samples = collector.collect()
    assert [s.value for s in pick(samples, c.GPU_UP)] == [0, 0]
    assert {s.name for s in samples} == {c.GPU_UP.name}
    assert "Driver Not Loaded" in collector.down[0]


def test_nvml_gpu_lost_at_start_reports_down_with_index() -> None:
    nv = two_gpus()
    nv.devices[1].lost = True
    provider = NvmlProvider(nv)
    samples = collect_gpus(provider, "n")
    assert value(samples, c.GPU_UP, gpu="1") == 0
    assert pick(samples, c.GPU_UP, gpu="1")[0].labels[c.LABEL_UUID] == ""  # never answered: no identity yet
    nv.devices[1].lost = False
    samples = collect_gpus(provider, "n")
    assert value(samples, c.GPU_UP, gpu="1") == 1
    assert pick(samples, c.GPU_UP, gpu="1")[0].labels[c.LABEL_UUID] == "GPU-bbbbbbbb-1111-1111-1111-111111111111"


# ------------------------------------------------------------------------------------------------
# No NVML: open_provider("nvml") falls back with a reason
# ------------------------------------------------------------------------------------------------
def test_open_nvml_without_library_falls_back_with_reason(monkeypatch: pytest.MonkeyPatch, events: list[str]) -> None:
    """The real binding, made unable to load libnvidia-ml.so.1 whatever this machine has."""

    def no_library(name: str, *args: Any, **kwargs: Any) -> Any:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(real_nvml, "nvmlLib", None)
    monkeypatch.setattr(real_nvml, "CDLL", no_library)
    provider = open_provider("nvml")
    assert isinstance(provider, EmptyProvider)
    assert provider.name == "nvml"
    assert provider.reason.startswith("NVML library not found: libnvidia-ml.so.1")
    assert any("event=gpu_nvml_unavailable" in line and "libnvidia-ml.so.1" in line for line in events)
    assert collect_gpus(provider, "n") == []


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (real_nvml.NVMLError_LibraryNotFound, "NVML library not found: libnvidia-ml.so.1"),
        (real_nvml.NVMLError_DriverNotLoaded, "NVIDIA driver not loaded"),
        (real_nvml.NVMLError_NoPermission, "no permission to open the NVIDIA device files"),
    ],
)
def test_open_nvml_init_failures(monkeypatch: pytest.MonkeyPatch, error: type, reason: str) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], init_error=error()))
    provider = open_provider("nvml")
    assert isinstance(provider, EmptyProvider) and provider.reason.startswith(reason)


def test_open_nvml_without_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    provider = open_provider("nvml")
    assert isinstance(provider, EmptyProvider) and "nvidia-ml-py" in provider.reason


def test_open_nvml_with_gpus_uses_the_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = two_gpus()
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    provider = open_provider("nvml")
    assert isinstance(provider, NvmlProvider)
    assert [d.uuid for d in provider.devices()] == [d.uuid for d in nv.devices]
    provider.close()
    assert nv.shut_down


# ------------------------------------------------------------------------------------------------
# XID events
# ------------------------------------------------------------------------------------------------
def test_nvml_xid_events_accumulate_across_cycles() -> None:
    nv = two_gpus()
    collector = GpuCollector(NvmlProvider(nv), "n")
    assert not pick(collector.collect(), c.GPU_XID_ERRORS)  # no series before the first XID
    nv.queue_xid(0, 79)
    nv.queue_xid(0, 79)
    nv.queue_xid(1, 48)
    nv.queue_xid(1, 13, event_type=real_nvml.nvmlEventTypeSingleBitEccError)  # not an XID event
    samples = collector.collect()
    assert value(samples, c.GPU_XID_ERRORS, gpu="0", xid="79") == 2
    assert value(samples, c.GPU_XID_ERRORS, gpu="1", xid="48") == 1
    assert len(pick(samples, c.GPU_XID_ERRORS)) == 2
    nv.queue_xid(0, 79)
    nv.devices[0].lost = True  # XID 79: fallen off the bus; its counter keeps being reported
    samples = collector.collect()
    assert value(samples, c.GPU_XID_ERRORS, gpu="0", xid="79") == 3
    assert value(samples, c.GPU_UP, gpu="0") == 0
    assert value(samples, c.GPU_XID_ERRORS, gpu="1", xid="48") == 1
    assert set(nv.wait_timeouts) == {0}  # never blocks


def test_nvml_xid_flood_is_drained_over_cycles() -> None:
    nv = two_gpus()
    collector = GpuCollector(NvmlProvider(nv), "n")
    for _ in range(MAX_XID_EVENTS_PER_POLL + 10):
        nv.queue_xid(1, 31)
    assert value(collector.collect(), c.GPU_XID_ERRORS, gpu="1", xid="31") == MAX_XID_EVENTS_PER_POLL
    assert value(collector.collect(), c.GPU_XID_ERRORS, gpu="1", xid="31") == MAX_XID_EVENTS_PER_POLL + 10


def test_collect_gpus_keeps_xid_counts_per_provider() -> None:
    provider = FakeProvider(2, clock=ManualClock())
    provider.inject_xid(1, 94)
    assert value(collect_gpus(provider, "n"), c.GPU_XID_ERRORS, gpu="1", xid="94") == 1
    provider.inject_xid(1, 94)
    assert value(collect_gpus(provider, "n"), c.GPU_XID_ERRORS, gpu="1", xid="94") == 2
    other = FakeProvider(2, clock=ManualClock())
    assert not pick(collect_gpus(other, "n"), c.GPU_XID_ERRORS)


# ------------------------------------------------------------------------------------------------
# MIG
# ------------------------------------------------------------------------------------------------
def test_nvml_mig_instances_have_their_own_memory_and_dcgm_labels() -> None:
    nv = two_gpus()
    nv.devices[0].migs = [
        FakeMig(1, "4g.40gb", 40 * GiB, 30 * GiB, [(5001, 29 * GiB)]),
        FakeMig(2, "3g.40gb", 40 * GiB, 10 * GiB, [(5002, 9 * GiB)]),
    ]
    nv.devices[0].errors = {"nvmlDeviceGetUtilizationRates": real_nvml.NVMLError_NotSupported}
    samples = GpuCollector(NvmlProvider(nv), "n").collect()
    for gi, profile, used in (("1", "4g.40gb", 30 * GiB), ("2", "3g.40gb", 10 * GiB)):
        mig = {"gpu": "0", "GPU_I_ID": gi, "GPU_I_PROFILE": profile}
        assert value(samples, c.GPU_MEMORY_TOTAL, **mig) == 40 * GiB
        assert value(samples, c.GPU_MEMORY_USED, **mig) == used
        assert value(samples, c.GPU_MEMORY_FREE, **mig) == 40 * GiB - used
        assert not pick(samples, c.GPU_MEMORY_RESERVED, **mig)  # v2 refused on MIG: omitted
        # dcgm-exporter labels MIG series with the parent GPU's UUID, index and bus id.
        assert pick(samples, c.GPU_MEMORY_USED, **mig)[0].labels[c.LABEL_UUID] == nv.devices[0].uuid
    assert value(samples, c.GPU_PROCESS_MEMORY, GPU_I_ID="2", pid="5002") == 9 * GiB
    assert not pick(samples, c.GPU_UTILIZATION, gpu="0")
    assert value(samples, c.GPU_MEMORY_USED, gpu="0", GPU_I_ID="") == 70 * GiB  # the whole GPU too
    assert nv.calls["nvmlDeviceGetMigDeviceHandleByIndex"] == 7  # all slots tried; empty ones skipped


def test_mig_profile_from_device_name() -> None:
    assert mig_profile_from_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb") == "1g.10gb"
    assert mig_profile_from_name("NVIDIA A100-SXM4-40GB MIG 3g.20gb") == "3g.20gb"
    assert mig_profile_from_name("NVIDIA H100 80GB HBM3") == ""


def test_fake_mig_device() -> None:
    provider = FakeProvider(2, mig_index=1, clock=ManualClock())
    samples = collect_gpus(provider, "n")
    profiles = {s.labels["GPU_I_PROFILE"] for s in pick(samples, c.GPU_MEMORY_USED, gpu="1")}
    assert profiles == {"", "4g.40gb", "3g.40gb"}
    assert not pick(samples, c.GPU_UTILIZATION, gpu="1")  # NVML refuses it on a MIG-enabled parent
    assert pick(samples, c.GPU_UTILIZATION, gpu="0")
    parent_used = value(samples, c.GPU_MEMORY_USED, gpu="1", GPU_I_ID="")
    assert parent_used == sum(s.value for s in pick(samples, c.GPU_MEMORY_USED, gpu="1") if s.labels["GPU_I_ID"])
    assert len(pick(samples, c.GPU_PROCESS_MEMORY, gpu="1")) == 2  # one per instance, none on the parent


# ------------------------------------------------------------------------------------------------
# The fake provider
# ------------------------------------------------------------------------------------------------
def run_cycles(provider: FakeProvider, clock: ManualClock, cycles: int) -> list[list[tuple]]:
    out = []
    for _ in range(cycles):
        clock.now += 15
        out.append([(s.name, sorted(s.labels.items()), s.value) for s in collect_gpus(provider, "n")])
    return out


def test_fake_is_deterministic_per_seed() -> None:
    clocks = [ManualClock() for _ in range(3)]
    a = run_cycles(FakeProvider(4, seed=7, clock=clocks[0]), clocks[0], 3)
    b = run_cycles(FakeProvider(4, seed=7, clock=clocks[1]), clocks[1], 3)
    other = run_cycles(FakeProvider(4, seed=8, clock=clocks[2]), clocks[2], 3)
    assert a == b
    assert a != other
    assert a[0] != a[1]  # readings move between cycles
    uuids = [d.uuid for d in FakeProvider(4, seed=7).devices()]
    assert uuids == [d.uuid for d in FakeProvider(4, seed=99).devices()]  # identity depends on the index only
    assert len(set(uuids)) == 4


def test_fake_looks_like_an_h100() -> None:
    clock = ManualClock()
    provider = FakeProvider(8, clock=clock)
    for info in provider.devices():
        assert info.name == "NVIDIA H100 80GB HBM3"
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", info.uuid)
        assert re.fullmatch(r"00000000:1[0-9A-F]:00\.0", info.pci_bus_id)
    powers, capped = [], 0
    for _ in range(50):
        first = provider.read(3)
        clock.now += 10.0
        second = provider.read(3)
        m = second.memory
        assert m.total_bytes == 85_899_345_920
        assert m.total_bytes == m.used_bytes + m.free_bytes + m.reserved_bytes
        assert 300 <= second.power_watts <= 700
        assert 40 <= second.temperature_celsius <= 85
        # Energy integrates power over the clock: 10 s at the second reading's power.
        assert second.energy_joules - first.energy_joules == pytest.approx(10.0 * second.power_watts, abs=0.01)
        assert second.memory_clock_hertz == 2_619_000_000
        if second.clock_event_reasons:
            capped += 1
            assert second.sm_clock_hertz < 1_980_000_000
        else:
            assert second.sm_clock_hertz == 1_980_000_000
        assert second.processes and second.processes[0].used_bytes < m.used_bytes
        powers.append(second.power_watts)
    assert 0 < capped < 50  # occasional power-cap clock events
    assert max(powers) - min(powers) > 50


def test_fake_fault_injection_through_the_collector() -> None:
    provider = FakeProvider(3, clock=ManualClock())
    collector = GpuCollector(provider, "n")
    full = names_for_gpu(collector.collect(), "1")
    provider.lose(1)
    samples = collector.collect()
    assert value(samples, c.GPU_UP, gpu="1") == 0 and names_for_gpu(samples, "1") == {c.GPU_UP.name}
    assert names_for_gpu(samples, "0") == full and names_for_gpu(samples, "2") == full
    assert collector.down == {1: "GPU is lost (injected)"}
    provider.restore(1)
    provider.inject_ecc(2, corrected=5)
    provider.inject_ecc(2, corrected=1, uncorrected=2)
    provider.set_unsupported(0, "power_watts", "energy_joules")
    samples = collector.collect()
    assert value(samples, c.GPU_UP, gpu="1") == 1
    assert value(samples, c.GPU_ECC_ERRORS, gpu="2", type="corrected") == 6
    assert value(samples, c.GPU_ECC_ERRORS, gpu="2", type="uncorrected") == 2
    assert value(samples, c.GPU_ECC_ERRORS, gpu="0", type="uncorrected") == 0
    assert names_for_gpu(samples, "0") == full - {c.GPU_POWER.name, c.GPU_ENERGY.name}
    with pytest.raises(ValueError, match="not GpuReading fields"):
        provider.set_unsupported(0, "wattage")
    with pytest.raises(ValueError, match="only go up"):
        provider.inject_ecc(0, corrected=-1)
    with pytest.raises(IndexError, match="no fake GPU with index 3"):
        provider.lose(3)


def test_collector_survives_a_broken_provider() -> None:
    class Broken(FakeProvider):
        def read(self, index: int):  # type: ignore[override]
            raise RuntimeError("bug in a provider")

        def poll_xid_events(self):  # type: ignore[override]
            raise RuntimeError("bug in event polling")

    samples = collect_gpus(Broken(2, clock=ManualClock()), "n")
    assert [s.value for s in pick(samples, c.GPU_UP)] == [0, 0]


# ------------------------------------------------------------------------------------------------
# open_provider specs
# ------------------------------------------------------------------------------------------------
def test_open_provider_specs() -> None:
    assert len(open_provider("fake:3").devices()) == 3
    assert open_provider("fake:0").devices() == []
    off = open_provider("off")
    assert isinstance(off, EmptyProvider) and "off" in off.reason and collect_gpus(off, "n") == []
    assert parse_spec(" NVML ") == ("nvml", 0)
    for bad in ("nvm", "fake", "fake:x", "fake:65", "fake:-1", ""):
        with pytest.raises(ValueError, match=r"use nvml, fake:N \(N = 0\.\.64\) or off"):
            open_provider(bad)


# ------------------------------------------------------------------------------------------------
# dcgm-exporter compatibility, checked against its files in ../shared
# ------------------------------------------------------------------------------------------------
def dcgm_rows() -> dict[str, tuple[str, str]]:
    """DCGM field -> (prometheus type, help) from default-counters.csv, commented-out rows included."""
    shared_dir(DCGM, "peers/dcgm")
    rows = {}
    for line in (DCGM / "default-counters.csv").read_text().splitlines():
        text = line.lstrip("# ").strip()
        parts = [p.strip() for p in text.split(",", 2)]
        if len(parts) == 3 and re.fullmatch(r"DCGM_(FI|EXP)_[A-Z0-9_]+", parts[0]):
            rows[parts[0]] = (parts[1], parts[2])
    return rows


def test_labels_match_dcgm_exporter() -> None:
    shared_dir(DCGM, "peers/dcgm")
    provenance = (DCGM / "PROVENANCE.md").read_text()
    # The pinned dcgm-exporter commit is the one that renamed Hostname to hostname.
    assert "Rename Hostname label to hostname" in provenance
    assert c.LABEL_HOSTNAME == "hostname"
    samples = collect_gpus(FakeProvider(2, mig_index=0, clock=ManualClock()), "gpu-node-7")
    # dcgm-exporter's GPU template: gpu, UUID, pci_bus_id, device, modelName [, GPU_I_PROFILE, GPU_I_ID], hostname;
    # modelName is written model_name here (its NVLink template's spelling) because promtool rejects camelCase.
    for s in samples:
        assert {"gpu", "UUID", "pci_bus_id", "model_name", "hostname", "GPU_I_ID", "GPU_I_PROFILE"} <= s.labels.keys()
        assert s.labels["hostname"] == "gpu-node-7"
    mig = [s for s in samples if s.labels["GPU_I_ID"]]
    assert {s.labels["GPU_I_ID"] for s in mig} == {"1", "2"}
    assert all(re.fullmatch(r"\d+g\.\d+gb", s.labels["GPU_I_PROFILE"]) for s in mig)


def metrics_doc_rows() -> dict[str, str]:
    """The table rows of docs/metrics.md's GPU section, keyed by metric name."""
    section = (REPO / "docs" / "metrics.md").read_text().split("\n## GPU (NVML)\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`(llm_gpu_[a-z_]+)`", line)
        if m:
            rows[m.group(1)] = line
    return rows


def test_docs_list_every_gpu_metric_with_real_nvml_calls() -> None:
    rows = metrics_doc_rows()
    assert set(rows) == {m.name for m in c.GPU_METRICS}
    for name, row in rows.items():
        calls = re.findall(r"`(nvml[A-Za-z_0-9]+)`", row)
        assert calls, f"{name}: no NVML source call named"
        for call in calls:
            assert hasattr(real_nvml, call), f"{name}: pynvml has no {call}"


def test_docs_dcgm_equivalents_exist_with_their_units() -> None:
    dcgm = dcgm_rows()
    checked = 0
    for name, row in metrics_doc_rows().items():
        for field_name, unit in re.findall(r"`(DCGM_(?:FI|EXP)_[A-Z0-9_]+)`(?: \(([^)]+)\))?", row):
            assert field_name in dcgm, f"{name}: {field_name} is not in dcgm-exporter's counter list"
            if unit:  # the unit the doc quotes is the one dcgm-exporter's help text gives
                assert f"(in {unit})" in dcgm[field_name][1], f"{field_name}: dcgm says {dcgm[field_name][1]!r}"
                checked += 1
    assert checked >= 8  # memory (MiB), power (W), energy (mJ), clocks (MHz), utilisation (%), temperature (C)


# ------------------------------------------------------------------------------------------------
# The rendered page passes promtool
# ------------------------------------------------------------------------------------------------
def test_rendered_gpu_page_passes_promtool(tmp_path: Path) -> None:
    provider = FakeProvider(2, mig_index=1, clock=ManualClock())
    provider.inject_xid(0, 79)
    provider.inject_ecc(0, corrected=1)
    collect_gpus(provider, "n")
    provider.lose(0)
    page = render(collect_gpus(provider, "node-a"))
    assert b'llm_gpu_up{GPU_I_ID="",GPU_I_PROFILE="",UUID="GPU-' in page
    result = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert result.stdout.decode().strip() == "" and result.stderr.decode().strip() == ""
