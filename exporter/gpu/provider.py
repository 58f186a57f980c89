"""What a GPU provider hands the collector: typed identities and readings, in base units.

NVML answers each query on its own and refuses many of them per device (NVMLError_NotSupported:
no ECC on a consumer card, no utilisation on a MIG-enabled parent, no energy counter before
Volta), so every reading field is independently optional. `None` means "not reported" and the
collector omits the series; it never becomes a zero that would lie on a dashboard.

Providers convert NVML's units (mW, mJ, MHz, percent) into the base units named by each
field (W, J, Hz, ratio; memory is bytes already), so the collector only maps fields to names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


class GpuError(Exception):
    """Base of the provider-level failures the collector turns into `llm_gpu_up 0`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class GpuLost(GpuError):
    """One GPU stopped answering (NVMLError_GpuIsLost, _Unknown, _ResetRequired). Others still work."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index


class GpuUnavailable(GpuError):
    """NVML as a whole is unusable: library missing, driver not loaded, not initialised."""


# NVML clock-event (formerly "throttle") reason bits, named as dcgm-exporter names them
# (DCGM_EXP_CLOCK_EVENTS_COUNT's clock_event label). The last two exist only in NVML's
# throttle-reason list and dcgm-exporter does not name them; we use NVML's words.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "clocks_setting",
    0x004: "power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal",
    0x040: "hw_thermal",
    0x080: "hw_power_brake",
    0x100: "display_clocks",
    0x200: "board_limit",
    0x400: "reliability",
}


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """A physical GPU's identity: what dcgm-exporter puts in its labels.

    MIG instances are not part of identity: operators re-partition a GPU without reloading
    the driver, so the provider enumerates them on every read (see `GpuReading.mig`).
    """

    index: int
    uuid: str  # "GPU-..."
    name: str  # "NVIDIA H100 80GB HBM3"
    pci_bus_id: str  # "00000000:18:00.0"


@dataclass(frozen=True, slots=True)
class MigInfo:
    """A MIG instance's identity, labelled like dcgm-exporter (GPU_I_ID, GPU_I_PROFILE)."""

    gpu_instance_id: int
    profile: str  # "3g.40gb"
    uuid: str = ""  # "MIG-..."
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class MemoryReading:
    """HBM in bytes. With NVML's v2 memory info, total = used + free + reserved."""

    total_bytes: int | None = None
    used_bytes: int | None = None
    free_bytes: int | None = None
    reserved_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """HBM held by one process (a host PID; in a container it is only meaningful with hostPID)."""

    pid: int
    used_bytes: int


@dataclass(frozen=True, slots=True)
class MigReading:
    """One MIG instance's own memory and processes (utilisation and power are per GPU only)."""

    info: MigInfo
    memory: MemoryReading = field(default_factory=MemoryReading)
    processes: tuple[ProcessMemory, ...] | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU read once. Every field is None when the device does not report it."""

    memory: MemoryReading = field(default_factory=MemoryReading)
    gpu_utilization_ratio: float | None = None  # 0..1
    memory_utilization_ratio: float | None = None  # 0..1, memory controller busy time
    power_watts: float | None = None
    energy_joules: float | None = None  # since the driver loaded
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    clock_event_reasons: int | None = None  # bitmask, keys of CLOCK_EVENT_REASONS
    ecc_corrected_total: int | None = None  # volatile: since the driver loaded
    ecc_uncorrected_total: int | None = None
    pcie_replays_total: int | None = None
    processes: tuple[ProcessMemory, ...] | None = None
    mig: tuple[MigReading, ...] = ()


@dataclass(frozen=True, slots=True)
class XidEvent:
    """One XID (driver-reported GPU error) event, e.g. 79 = fallen off the bus, 48 = double-bit ECC."""

    index: int
    code: int


@runtime_checkable
class GpuProvider(Protocol):
    """The seam between the NVML (or fake) world and the collector.

    `devices()` is cheap and returns the GPUs found when the provider opened, lost ones
    included, so a lost GPU keeps its labels while it reports `llm_gpu_up 0`. `read()` may
    raise GpuLost (that GPU) or GpuUnavailable (all of them), never an NVML error.
    """

    name: str  # "nvml" | "fake" | "off"
    reason: str  # why the provider has no GPUs ("" when it has or should have them)

    def devices(self) -> list[GpuInfo]: ...

    def read(self, index: int) -> GpuReading: ...

    def poll_xid_events(self) -> list[XidEvent]:
        """XID events since the last poll; never blocks (NVML event wait with a 0 ms timeout)."""
        ...

    def close(self) -> None: ...


class EmptyProvider:
    """No GPUs: `--gpu off`, or NVML unavailable (the reason says which)."""

    def __init__(self, reason: str, name: str = "off") -> None:
        self.name = name
        self.reason = reason

    def devices(self) -> list[GpuInfo]:
        return []

    def read(self, index: int) -> GpuReading:
        raise GpuUnavailable(self.reason)

    def poll_xid_events(self) -> list[XidEvent]:
        return []

    def close(self) -> None:
        pass
