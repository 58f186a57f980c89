"""Every NVML call the exporter makes, made once through the exporter's own provider and reported (the GPU
smoke test's first half, `scripts/gpu-smoke.sh`).

The provider (exporter/gpu/nvml.py) is opened over a tracing wrapper of pynvml: each `nvml*` function it
calls is counted with its outcome (returned, or which NVMLError). The calls the exporter makes only after a
GPU was lost (`nvmlDeviceGetHandleByUUID`) or on drivers before 535 (`...ClocksThrottleReasons`) are then
made directly, so the first real run covers them too. `NVML_CALLS` names, for every call, what it feeds;
tests/exporter/test_gpu_smoke_nvml.py checks that it lists exactly the calls exporter/gpu/nvml.py makes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.gpu.nvml import NvmlProvider
from exporter.gpu.provider import GpuLost, GpuUnavailable
from llmslo import conventions as c
from tools.gpu_smoke_report import FAIL, PASS, SKIP, WARN, Check

_MIG = "MIG instances (GPU_I_ID, GPU_I_PROFILE labels)"
# NVML function -> what the exporter makes of it (series, labels, or its own bookkeeping).
NVML_CALLS: dict[str, str] = {
    "nvmlInit": "opening NVML (llm_gpu_up for every GPU when it fails)",
    "nvmlShutdown": "closing NVML",
    "nvmlDeviceGetCount": "the GPUs listed",
    "nvmlDeviceGetHandleByIndex": "each GPU's handle",
    "nvmlDeviceGetHandleByUUID": "the handle again after a GPU was lost",
    "nvmlDeviceGetUUID": "UUID label",
    "nvmlDeviceGetName": "model_name label; a MIG instance's GPU_I_PROFILE",
    "nvmlDeviceGetPciInfo": "pci_bus_id label",
    "nvmlDeviceGetMemoryInfo": f"{c.GPU_MEMORY_TOTAL.name}, _used, _free, _reserved",
    "nvmlDeviceGetUtilizationRates": f"{c.GPU_UTILIZATION.name}, {c.GPU_MEMORY_UTILIZATION.name}",
    "nvmlDeviceGetPowerUsage": c.GPU_POWER.name,
    "nvmlDeviceGetTotalEnergyConsumption": c.GPU_ENERGY.name,
    "nvmlDeviceGetTemperature": c.GPU_TEMPERATURE.name,
    "nvmlDeviceGetClockInfo": f"{c.GPU_SM_CLOCK.name}, {c.GPU_MEMORY_CLOCK.name}",
    "nvmlDeviceGetCurrentClocksEventReasons": c.GPU_CLOCK_EVENT.name,
    "nvmlDeviceGetCurrentClocksThrottleReasons": f"{c.GPU_CLOCK_EVENT.name} (drivers before 535)",
    "nvmlDeviceGetTotalEccErrors": c.GPU_ECC_ERRORS.name,
    "nvmlDeviceGetPcieReplayCounter": c.GPU_PCIE_REPLAYS.name,
    "nvmlDeviceGetComputeRunningProcesses": c.GPU_PROCESS_MEMORY.name,
    "nvmlDeviceGetMigMode": _MIG,
    "nvmlDeviceGetMaxMigDeviceCount": _MIG,
    "nvmlDeviceGetMigDeviceHandleByIndex": _MIG,
    "nvmlDeviceGetGpuInstanceId": _MIG,
    "nvmlDeviceGetComputeInstanceId": _MIG,
    "nvmlEventSetCreate": f"{c.GPU_XID_ERRORS.name} (event set)",
    "nvmlDeviceGetSupportedEventTypes": f"{c.GPU_XID_ERRORS.name} (does the GPU report XIDs)",
    "nvmlDeviceRegisterEvents": f"{c.GPU_XID_ERRORS.name} (registration)",
    "nvmlEventSetWait": c.GPU_XID_ERRORS.name,
    "nvmlEventSetFree": f"{c.GPU_XID_ERRORS.name} (closing)",
}
# nvml* names exporter/gpu/nvml.py uses that are not calls: a struct version and an event mask.
NVML_CONSTANTS = frozenset({"nvmlMemory_v2", "nvmlEventTypeXidCriticalError"})
# Errors that are an answer, not a fault: nothing pending, an empty MIG slot.
_EXPECTED = {"nvmlEventSetWait": {"NVMLError_Timeout"}, "nvmlDeviceGetMigDeviceHandleByIndex": {"NVMLError_NotFound"}}
# Asked again another way when refused: v2 memory info (none on MIG instances) falls back to v1.
_RETRIED = frozenset({"nvmlDeviceGetMemoryInfo"})
# A field this GPU or driver does not have: the exporter leaves the series out (a warning here).
_ABSENT = {"NVMLError_NotSupported", "NVMLError_FunctionNotFound"}
OPENED = "NVML opened by the exporter's provider"
_MIG_CALLS = ("nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId",
              "nvmlDeviceGetComputeInstanceId")


def nvml_names(source: str) -> set[str]:
    """Every `nvml*` name a source text mentions (calls, and the constants read with getattr)."""
    return set(re.findall(r"\bnvml[A-Z][A-Za-z0-9_]*", source))


@dataclass
class CallRecord:
    calls: int = 0
    returned: int = 0
    errors: dict[str, int] = field(default_factory=dict)


class TracingNvml:
    """pynvml, with every `nvml*` function counted; constants and error classes pass through unchanged."""

    def __init__(self, nvml: Any) -> None:
        self._nv = nvml
        self.records: dict[str, CallRecord] = {}
        self.missing: set[str] = set()  # functions this nvidia-ml-py does not have

    def __getattr__(self, name: str) -> Any:
        try:
            value = getattr(self._nv, name)
        except AttributeError:
            if name.startswith("nvml"):
                self.missing.add(name)
            raise
        if not name.startswith("nvml") or not callable(value) or isinstance(value, type):
            return value
        record = self.records.setdefault(name, CallRecord())

        def traced(*args: Any, **kwargs: Any) -> Any:
            record.calls += 1
            try:
                result = value(*args, **kwargs)
            except Exception as exc:
                kind = type(exc).__name__
                record.errors[kind] = record.errors.get(kind, 0) + 1
                raise
            record.returned += 1
            return result
        return traced


def _exercise(tracer: TracingNvml, provider: NvmlProvider) -> list[Check]:
    """Read every GPU as a cycle does, poll XIDs, then make the calls of the rarer paths directly."""
    problems: list[Check] = []
    for info in provider.devices():
        try:
            provider.read(info.index)
        except GpuLost as exc:
            problems.append(Check(f"{info.index} {info.uuid}", "NVML read", FAIL, f"GPU lost: {exc.reason}"))
    provider.poll_xid_events()
    nv_error = tracer.NVMLError
    for info in provider.devices():
        if not info.uuid:
            continue
        for function, args in (("nvmlDeviceGetHandleByUUID", (info.uuid,)),
                               ("nvmlDeviceGetCurrentClocksThrottleReasons", None)):
            fn = getattr(tracer, function, None)
            try:
                handle = tracer.nvmlDeviceGetHandleByIndex(info.index)
                if fn is not None:
                    fn(*(args if args is not None else (handle,)))
            except nv_error:
                pass  # recorded by the tracer
    return problems


def trace(nvml: Any) -> tuple[TracingNvml, list[Check]]:
    """Open the exporter's NVML provider over `nvml` (pynvml or a stand-in), make every call, close it."""
    tracer = TracingNvml(nvml)
    try:
        provider = NvmlProvider(tracer)
    except GpuUnavailable as exc:
        return tracer, [Check("", OPENED, FAIL, str(exc))]
    try:
        problems = _exercise(tracer, provider)
    except GpuUnavailable as exc:
        problems = [Check("", "NVML while reading", FAIL, str(exc))]
    finally:
        provider.close()
    return tracer, problems


def _mig_enabled(tracer: TracingNvml) -> bool:
    record = tracer.records.get("nvmlDeviceGetMaxMigDeviceCount")
    return record is not None and record.calls > 0


def call_checks(tracer: TracingNvml, problems: list[Check]) -> list[Check]:
    """One line per NVML call in NVML_CALLS: how often it ran, what came back, what it feeds."""
    checks = list(problems)
    for function, feeds in NVML_CALLS.items():
        record = tracer.records.get(function)
        what = function
        if function in tracer.missing and (record is None or record.calls == 0):
            checks.append(Check("", what, WARN, f"not in this nvidia-ml-py; the exporter skips it ({feeds})"))
            continue
        if record is None or record.calls == 0:
            if function in _MIG_CALLS:
                why = "MIG mode on, but no instance created" if _mig_enabled(tracer) else "no GPU in MIG mode"
                checks.append(Check("", what, SKIP, f"{why} ({feeds})"))
            else:
                checks.append(Check("", what, FAIL, f"never reached ({feeds})"))
            continue
        errors = {k: v for k, v in record.errors.items() if k not in _EXPECTED.get(function, set())}
        detail = f"{record.calls} calls, {record.returned} returned" + (
            "; " + ", ".join(f"{k} x{v}" for k, v in sorted(record.errors.items())) if record.errors else "")
        if not errors:
            outcome = PASS
        elif not set(errors) <= _ABSENT:
            outcome = FAIL
        elif function in _RETRIED and record.returned:
            outcome = PASS
        else:
            outcome = WARN
            detail += "; the exporter leaves it out" + (" for some GPUs" if record.returned else "")
        checks.append(Check("", what, outcome, f"{detail} -> {feeds}"))
    return checks


def run_trace(load: Callable[[], Any]) -> list[Check]:
    """The whole first half: `load` returns the pynvml module (or raises ImportError)."""
    try:
        nvml = load()
    except ImportError as exc:
        return [Check("", "pynvml importable", FAIL, f"{exc}: install nvidia-ml-py (make deps)")]
    tracer, problems = trace(nvml)
    if problems and problems[0].what == OPENED:
        return problems  # no call past nvmlInit could run: one line, not one per call
    return call_checks(tracer, problems)
