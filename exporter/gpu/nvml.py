"""The real GPU provider, over pynvml (the nvidia-ml-py distribution).

NVML refuses queries one at a time, so each field is read on its own: a refusal
(NotSupported, NoPermission, FunctionNotFound on an older driver, ...) leaves that field None
and the rest of the reading stands. Only three kinds of error change what the collector does:
- the device is gone (GpuIsLost, Unknown, ResetRequired) -> GpuLost for that GPU;
- NVML itself is gone (Uninitialized, DriverNotLoaded, LibraryNotFound, version mismatch)
  -> GpuUnavailable, every GPU reports down;
- anything at open time that stops NVML from starting -> GpuUnavailable with a reason, which
  `open_provider("nvml")` turns into an empty provider.

NVML calls block for microseconds to a few milliseconds each; run `read` off the event loop.
"""

from __future__ import annotations

import ctypes
from types import ModuleType
from typing import Any

from exporter.gpu.provider import (
    GpuInfo,
    GpuLost,
    GpuReading,
    GpuUnavailable,
    MemoryReading,
    MigInfo,
    MigReading,
    ProcessMemory,
    XidEvent,
)
from exporter.logs import event

# Error classes by pynvml's names; looked up with getattr so an older binding lacking one still works.
_LOST_ERRORS = ("NVMLError_GpuIsLost", "NVMLError_Unknown", "NVMLError_ResetRequired")
_GONE_ERRORS = (
    "NVMLError_Uninitialized",
    "NVMLError_DriverNotLoaded",
    "NVMLError_LibraryNotFound",
    "NVMLError_LibRmVersionMismatch",
)
# A flood of XIDs (a GPU in a fault loop) must not stall a collection cycle.
MAX_XID_EVENTS_PER_POLL = 256
_MHZ = 1e6


def import_pynvml() -> ModuleType:
    """Import pynvml (nvidia-ml-py); importing never loads libnvidia-ml, nvmlInit does."""
    try:
        import pynvml
    except ImportError as exc:  # the distribution is a dependency, but say so plainly if it is missing
        raise GpuUnavailable(f"pynvml not importable ({exc}); install nvidia-ml-py") from exc
    return pynvml


def _describe(exc: BaseException) -> str:
    """NVMLError.__str__ may call into the library; never let describing an error raise."""
    try:
        return str(exc)
    except Exception:
        return f"NVML error {getattr(exc, 'value', '?')}"


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("ascii", "replace")
    return str(value)


def _handle_key(handle: Any) -> Any:
    """A comparable key for a device handle: its address for ctypes pointers, itself otherwise."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


def mig_profile_from_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3 MIG 3g.40gb' -> '3g.40gb', dcgm-exporter's GPU_I_PROFILE value."""
    marker = " MIG "
    pos = name.rfind(marker)
    return name[pos + len(marker):].strip() if pos >= 0 else ""


def _scaled(value: Any, factor: float) -> float | None:
    return None if value is None else float(value) * factor


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


class NvmlProvider:
    """NVML, initialised once at construction; raises GpuUnavailable when NVML cannot start."""

    name = "nvml"

    def __init__(self, nvml: ModuleType | Any | None = None) -> None:
        self._nv = nvml if nvml is not None else import_pynvml()
        self.reason = ""
        self._lost_errors = tuple(getattr(self._nv, n) for n in _LOST_ERRORS if hasattr(self._nv, n))
        self._gone_errors = tuple(getattr(self._nv, n) for n in _GONE_ERRORS if hasattr(self._nv, n))
        self._xid_type = int(getattr(self._nv, "nvmlEventTypeXidCriticalError", 0x8))
        self._infos: dict[int, GpuInfo] = {}
        self._handles: dict[int, Any] = {}
        self._lost: set[int] = set()
        self._event_set: Any = None
        self._start()

    # ---- opening -----------------------------------------------------------------------
    def _start(self) -> None:
        nv = self._nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise GpuUnavailable(self._init_failure(exc)) from exc
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            self._shutdown()
            raise GpuUnavailable(f"NVML could not count GPUs: {_describe(exc)}") from exc
        self._event_set = self._create_event_set()
        try:
            for index in range(count):
                self._open_device(index)
        except GpuUnavailable:  # the driver went away while we enumerated
            self.close()
            raise
        if count == 0:
            self.reason = "NVML found no GPUs on this node"
        event("gpu_nvml_opened", gpus=count, lost=len(self._lost), xid_events=self._event_set is not None)

    def _init_failure(self, exc: Exception) -> str:
        nv = self._nv
        if isinstance(exc, getattr(nv, "NVMLError_LibraryNotFound", ())):
            return "NVML library not found: libnvidia-ml.so.1 (no NVIDIA driver, or the container lacks the NVIDIA runtime)"
        if isinstance(exc, getattr(nv, "NVMLError_DriverNotLoaded", ())):
            return "NVIDIA driver not loaded"
        if isinstance(exc, getattr(nv, "NVMLError_NoPermission", ())):
            return "no permission to open the NVIDIA device files"
        return f"NVML init failed: {_describe(exc)}"

    def _open_device(self, index: int) -> None:
        """Record one GPU's identity; a GPU lost at start keeps an entry (blank identity) and reports down."""
        self._infos[index] = GpuInfo(index, "", "", "")
        try:
            handle = self._call(index, "nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                raise GpuLost(index, "NVML returned no handle")
            self._handles[index] = handle
            self._infos[index] = self._identity(index, handle)
            self._register_xid(index, handle)
        except GpuLost as exc:
            self._lost.add(index)
            event("gpu_lost_at_start", gpu=index, reason=exc.reason)

    def _identity(self, index: int, handle: Any) -> GpuInfo:
        pci = self._call(index, "nvmlDeviceGetPciInfo", handle)
        return GpuInfo(
            index=index,
            uuid=_text(self._call(index, "nvmlDeviceGetUUID", handle)),
            name=_text(self._call(index, "nvmlDeviceGetName", handle)),
            pci_bus_id=_text(getattr(pci, "busId", None)),
        )

    def _create_event_set(self) -> Any:
        nv = self._nv
        try:
            return nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            event("gpu_xid_events_unavailable", reason=_describe(exc))
            return None

    def _register_xid(self, index: int, handle: Any) -> None:
        if self._event_set is None:
            return
        supported = self._call(index, "nvmlDeviceGetSupportedEventTypes", handle)
        if supported is None or not int(supported) & self._xid_type:
            event("gpu_xid_events_unsupported", gpu=index)
            return
        self._call(index, "nvmlDeviceRegisterEvents", handle, self._xid_type, self._event_set)

    # ---- one NVML call ---------------------------------------------------------------------
    def _call(self, index: int, function: str, *args: Any, **kwargs: Any) -> Any:
        """Call one pynvml function; None when the device or binding does not offer it."""
        nv = self._nv
        fn = getattr(nv, function, None)
        if fn is None:  # an older nvidia-ml-py without this call
            return None
        try:
            return fn(*args, **kwargs)
        except nv.NVMLError as exc:
            if self._lost_errors and isinstance(exc, self._lost_errors):
                raise GpuLost(index, f"{function}: {_describe(exc)}") from exc
            if self._gone_errors and isinstance(exc, self._gone_errors):
                raise GpuUnavailable(f"{function}: {_describe(exc)}") from exc
            return None  # NotSupported, NoPermission, FunctionNotFound, NotFound, ...
        except (TypeError, ValueError, AttributeError, getattr(nv, "NVMLLibraryMismatchError", TypeError)):
            return None  # a binding/driver version mismatch for this one call

    # ---- reading -----------------------------------------------------------------------------
    def devices(self) -> list[GpuInfo]:
        return [self._infos[i] for i in sorted(self._infos)]

    def read(self, index: int) -> GpuReading:
        if index not in self._infos:
            raise GpuLost(index, f"no GPU with index {index}")
        try:
            handle = self._live_handle(index)
            reading = self._read(index, handle)
        except GpuLost:
            self._lost.add(index)
            raise
        if index in self._lost:
            self._lost.discard(index)
            event("gpu_recovered", gpu=index, uuid=self._infos[index].uuid)
        return reading

    def _live_handle(self, index: int) -> Any:
        """The device handle, looked up again after a loss (a reset GPU gets a new one)."""
        if index not in self._lost and index in self._handles:
            return self._handles[index]
        uuid = self._infos[index].uuid
        if uuid:
            handle = self._call(index, "nvmlDeviceGetHandleByUUID", uuid)
        else:
            handle = self._call(index, "nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            raise GpuLost(index, "GPU not found again after it was lost")
        self._handles[index] = handle
        if not uuid:
            self._infos[index] = self._identity(index, handle)
        self._register_xid(index, handle)
        return handle

    def _read(self, index: int, handle: Any) -> GpuReading:
        nv = self._nv
        util = self._call(index, "nvmlDeviceGetUtilizationRates", handle)
        return GpuReading(
            memory=self._memory(index, handle),
            gpu_utilization_ratio=_scaled(getattr(util, "gpu", None), 0.01),
            memory_utilization_ratio=_scaled(getattr(util, "memory", None), 0.01),
            power_watts=_scaled(self._call(index, "nvmlDeviceGetPowerUsage", handle), 1e-3),  # mW
            energy_joules=_scaled(self._call(index, "nvmlDeviceGetTotalEnergyConsumption", handle), 1e-3),  # mJ
            temperature_celsius=_scaled(
                self._call(index, "nvmlDeviceGetTemperature", handle, nv.NVML_TEMPERATURE_GPU), 1.0
            ),
            sm_clock_hertz=_scaled(self._call(index, "nvmlDeviceGetClockInfo", handle, nv.NVML_CLOCK_SM), _MHZ),
            memory_clock_hertz=_scaled(self._call(index, "nvmlDeviceGetClockInfo", handle, nv.NVML_CLOCK_MEM), _MHZ),
            clock_event_reasons=_int(self._clock_event_reasons(index, handle)),
            ecc_corrected_total=_int(
                self._call(
                    index, "nvmlDeviceGetTotalEccErrors", handle,
                    nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC,
                )
            ),
            ecc_uncorrected_total=_int(
                self._call(
                    index, "nvmlDeviceGetTotalEccErrors", handle,
                    nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC,
                )
            ),
            pcie_replays_total=_int(self._call(index, "nvmlDeviceGetPcieReplayCounter", handle)),
            processes=self._processes(index, handle),
            mig=self._mig(index, handle),
        )

    def _memory(self, index: int, handle: Any) -> MemoryReading:
        """v2 memory info carries `reserved` (and `used` without it); fall back to v1 on older drivers."""
        info = None
        version = getattr(self._nv, "nvmlMemory_v2", None)
        if version is not None:
            info = self._call(index, "nvmlDeviceGetMemoryInfo", handle, version=version)
        reserved = getattr(info, "reserved", None)
        if info is None:
            info = self._call(index, "nvmlDeviceGetMemoryInfo", handle)
        if info is None:
            return MemoryReading()
        return MemoryReading(
            total_bytes=_int(getattr(info, "total", None)),
            used_bytes=_int(getattr(info, "used", None)),
            free_bytes=_int(getattr(info, "free", None)),
            reserved_bytes=_int(reserved),
        )

    def _clock_event_reasons(self, index: int, handle: Any) -> Any:
        """`...ClocksEventReasons` (driver >= 535); older drivers only know `...ThrottleReasons`."""
        reasons = self._call(index, "nvmlDeviceGetCurrentClocksEventReasons", handle)
        if reasons is None:
            reasons = self._call(index, "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return reasons

    def _processes(self, index: int, handle: Any) -> tuple[ProcessMemory, ...] | None:
        procs = self._call(index, "nvmlDeviceGetComputeRunningProcesses", handle)
        if procs is None:
            return None
        # usedGpuMemory is None where NVML cannot attribute memory (e.g. WDDM, some MIG setups).
        return tuple(
            ProcessMemory(int(p.pid), int(p.usedGpuMemory))
            for p in procs
            if getattr(p, "usedGpuMemory", None) is not None
        )

    def _mig(self, index: int, handle: Any) -> tuple[MigReading, ...]:
        mode = self._call(index, "nvmlDeviceGetMigMode", handle)
        if not mode or mode[0] != getattr(self._nv, "NVML_DEVICE_MIG_ENABLE", 1):
            return ()
        slots = self._call(index, "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        instances = []
        for slot in range(int(slots)):
            mig = self._call(index, "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
            if mig is None:  # NVMLError_NotFound: an empty slot
                continue
            gpu_instance_id = self._call(index, "nvmlDeviceGetGpuInstanceId", mig)
            if gpu_instance_id is None:
                continue
            info = MigInfo(
                gpu_instance_id=int(gpu_instance_id),
                profile=mig_profile_from_name(_text(self._call(index, "nvmlDeviceGetName", mig))),
                uuid=_text(self._call(index, "nvmlDeviceGetUUID", mig)),
                compute_instance_id=_int(self._call(index, "nvmlDeviceGetComputeInstanceId", mig)),
            )
            instances.append(MigReading(info, self._memory(index, mig), self._processes(index, mig)))
        return tuple(instances)

    # ---- XID events ----------------------------------------------------------------------------
    def poll_xid_events(self) -> list[XidEvent]:
        nv = self._nv
        if self._event_set is None:
            return []
        timeout_error = getattr(nv, "NVMLError_Timeout", ())
        events: list[XidEvent] = []
        for _ in range(MAX_XID_EVENTS_PER_POLL):
            try:
                data = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError as exc:
                if isinstance(exc, timeout_error):
                    break  # nothing pending: the normal end of a poll
                if self._gone_errors and isinstance(exc, self._gone_errors):
                    raise GpuUnavailable(f"nvmlEventSetWait: {_describe(exc)}") from exc
                event("gpu_xid_poll_failed", reason=_describe(exc))
                break
            if not int(data.eventType) & self._xid_type:
                continue
            index = self._index_of(data.device)
            if index is not None:
                events.append(XidEvent(index, int(data.eventData)))
        return events

    def _index_of(self, device: Any) -> int | None:
        key = _handle_key(device)
        for index, handle in self._handles.items():
            if _handle_key(handle) == key:
                return index
        return None

    # ---- closing -------------------------------------------------------------------------------
    def close(self) -> None:
        nv = self._nv
        if self._event_set is not None:
            try:
                nv.nvmlEventSetFree(self._event_set)
            except nv.NVMLError:
                pass
            self._event_set = None
        self._shutdown()

    def _shutdown(self) -> None:
        nv = self._nv
        try:
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
