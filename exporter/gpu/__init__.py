"""GPU metrics: a provider (NVML, a fake, or none) behind one interface, and the collector.

`open_provider(spec)` never fails for `nvml`: without a driver it logs why and returns an
empty provider, so the same DaemonSet runs on CPU-only nodes. `collect_gpus` never raises.
"""

from __future__ import annotations

import logging

from exporter.gpu.collector import GpuCollector, collect_gpus
from exporter.gpu.fake import MAX_FAKE_GPUS, FakeProvider
from exporter.gpu.nvml import NvmlProvider
from exporter.gpu.provider import (
    EmptyProvider,
    GpuError,
    GpuInfo,
    GpuLost,
    GpuProvider,
    GpuReading,
    GpuUnavailable,
    MemoryReading,
    MigInfo,
    MigReading,
    ProcessMemory,
    XidEvent,
)
from exporter.logs import event

SPEC_HELP = f"use nvml, fake:N (N = 0..{MAX_FAKE_GPUS}) or off"

__all__ = [
    "EmptyProvider", "FakeProvider", "GpuCollector", "GpuError", "GpuInfo", "GpuLost", "GpuProvider", "GpuReading",
    "GpuUnavailable", "MemoryReading", "MigInfo", "MigReading", "NvmlProvider", "ProcessMemory", "XidEvent",
    "collect_gpus", "open_provider", "parse_spec",
]


def parse_spec(spec: str) -> tuple[str, int]:
    """'nvml' -> ('nvml', 0); 'fake:4' -> ('fake', 4); 'off' -> ('off', 0). ValueError says what to write."""
    text = spec.strip().lower()
    if text in ("nvml", "off"):
        return text, 0
    if text.startswith("fake:"):
        count = text.removeprefix("fake:")
        if count.isdigit() and int(count) <= MAX_FAKE_GPUS:
            return "fake", int(count)
    raise ValueError(f"GPU provider {spec!r} not understood: {SPEC_HELP}")


def open_provider(spec: str) -> GpuProvider:
    """The provider `--gpu SPEC` names; `nvml` falls back to an empty provider with a logged reason."""
    kind, count = parse_spec(spec)
    if kind == "off":
        return EmptyProvider("GPU metrics turned off (--gpu off)")
    if kind == "fake":
        return FakeProvider(count)
    try:
        return NvmlProvider()
    except GpuUnavailable as exc:
        event("gpu_nvml_unavailable", logging.WARNING, reason=exc.reason)
        return EmptyProvider(exc.reason, name="nvml")
