"""GPU metrics: a provider (NVML, a fake, or none) behind one interface, and the collector.

`open_provider(spec)` never fails for `nvml`: without a driver it logs why and returns an
empty provider, so the same DaemonSet runs on CPU-only nodes. `collect_gpus` never raises.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from exporter.gpu.spec import parse_spec
from exporter.logs import event

if TYPE_CHECKING:
    from exporter.gpu.provider import GpuProvider

# Everything else is imported on first use (PEP 562).
_LAZY = {
    "GpuCollector": "collector", "collect_gpus": "collector",
    "FakeProvider": "fake",
    "NvmlProvider": "nvml",
    **{name: "provider" for name in (
        "EmptyProvider", "GpuError", "GpuInfo", "GpuLost", "GpuProvider", "GpuReading", "GpuUnavailable",
        "MemoryReading", "MigInfo", "MigReading", "ProcessMemory", "XidEvent",
    )},
}

__all__ = [
    "EmptyProvider", "FakeProvider", "GpuCollector", "GpuError", "GpuInfo", "GpuLost", "GpuProvider", "GpuReading",
    "GpuUnavailable", "MemoryReading", "MigInfo", "MigReading", "NvmlProvider", "ProcessMemory", "XidEvent",
    "collect_gpus", "open_provider",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def open_provider(spec: str) -> GpuProvider:
    """The provider `--gpu SPEC` names; `nvml` falls back to an empty provider with a logged reason."""
    from exporter.gpu.provider import EmptyProvider, GpuUnavailable

    kind, count = parse_spec(spec)
    if kind == "off":
        return EmptyProvider("GPU metrics turned off (--gpu off)")
    if kind == "fake":
        from exporter.gpu.fake import FakeProvider

        return FakeProvider(count)
    from exporter.gpu.nvml import NvmlProvider

    try:
        return NvmlProvider()
    except GpuUnavailable as exc:
        event("gpu_nvml_unavailable", logging.WARNING, reason=exc.reason)
        return EmptyProvider(exc.reason, name="nvml")
