"""`--gpu fake:N`: H100-like GPUs for the demo and the tests, with faults on demand.

Readings follow one seeded random stream per GPU, so two providers with the same seed, read
in the same order under the same clock, give the same numbers. Energy integrates power over
the clock, as NVML's counter does. Faults are injected the way NVML shows them: a lost GPU
raises GpuLost until restored; XIDs arrive as events; ECC counters only go up; a MIG-enabled
GPU refuses whole-GPU utilisation and processes, and reports them per instance instead.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from exporter.gpu.provider import (
    GpuInfo,
    GpuLost,
    GpuReading,
    MemoryReading,
    MigInfo,
    MigReading,
    ProcessMemory,
    XidEvent,
)
from exporter.gpu.spec import MAX_FAKE_GPUS

MODEL_NAME = "NVIDIA H100 80GB HBM3"
TOTAL_BYTES = 85_899_345_920  # 80 GiB
RESERVED_BYTES = 536_870_912  # driver and firmware
CONTEXT_BYTES = 536_870_912  # CUDA contexts, outside any process's attributed memory
SM_CLOCK_MHZ = 1980
SM_CLOCK_CAPPED_MHZ = 1755
MEMORY_CLOCK_MHZ = 2619
POWER_MIN_W, POWER_MAX_W = 300.0, 700.0
POWER_CAP_THRESHOLD_W = 680.0
POWER_CAP_BIT = 0x004
# A 4g + 3g split of one H100, as `nvidia-smi mig -cgi 5,9` makes it.
MIG_LAYOUT = ((1, "4g.40gb", 42_949_672_960), (2, "3g.40gb", 42_949_672_960))
_READING_FIELDS = frozenset(f.name for f in dataclasses.fields(GpuReading))


def fake_uuid(prefix: str, *parts: object) -> str:
    """A stable UUID in NVML's text form ('GPU-...' or 'MIG-...') from the parts."""
    digest = hashlib.sha256(":".join(str(p) for p in ("llmslo-fake", prefix, *parts)).encode()).digest()
    return f"{prefix}-{uuid.UUID(bytes=digest[:16])}"


@dataclass
class _FakeGpu:
    info: GpuInfo
    rng: random.Random
    energy_joules: float
    pid: int
    last_time: float | None = None
    lost: bool = False
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    pcie_replays: int = 0
    unsupported: set[str] = field(default_factory=set)
    mig: tuple[MigInfo, ...] = ()


class FakeProvider:
    """`count` H100-80GB-like GPUs; `mig_index` puts one of them in MIG mode."""

    name = "fake"

    def __init__(
        self,
        count: int,
        seed: int = 0,
        mig_index: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 <= count <= MAX_FAKE_GPUS:
            raise ValueError(f"fake GPU count must be 0..{MAX_FAKE_GPUS}, got {count}")
        if mig_index is not None and not 0 <= mig_index < count:
            raise ValueError(f"mig_index {mig_index} is not one of the {count} fake GPUs")
        self.reason = ""
        self._clock = clock
        self._pending_xids: list[XidEvent] = []
        self._gpus: list[_FakeGpu] = []
        for index in range(count):
            rng = random.Random(f"{seed}:{index}")
            info = GpuInfo(
                index=index,
                uuid=fake_uuid("GPU", index),
                name=MODEL_NAME,
                pci_bus_id=f"00000000:{0x10 + index:02X}:00.0",
            )
            gpu = _FakeGpu(info, rng, energy_joules=rng.uniform(1e7, 5e7), pid=rng.randint(1000, 60000))
            if index == mig_index:
                gpu.mig = tuple(
                    MigInfo(gi, profile, fake_uuid("MIG", index, gi), compute_instance_id=0)
                    for gi, profile, _ in MIG_LAYOUT
                )
            self._gpus.append(gpu)

    # ---- GpuProvider ----------------------------------------------------------------------
    def devices(self) -> list[GpuInfo]:
        return [gpu.info for gpu in self._gpus]

    def read(self, index: int) -> GpuReading:
        if not 0 <= index < len(self._gpus):
            raise GpuLost(index, f"no fake GPU with index {index}")
        gpu = self._gpus[index]
        if gpu.lost:
            raise GpuLost(index, "GPU is lost (injected)")
        rng = gpu.rng
        util_percent = rng.randint(55, 100)
        power = min(POWER_MAX_W, max(POWER_MIN_W, 300.0 + 4.0 * util_percent + rng.uniform(-15.0, 15.0)))
        now = self._clock()
        if gpu.last_time is not None:
            gpu.energy_joules += power * max(0.0, now - gpu.last_time)
        gpu.last_time = now
        capped = power >= POWER_CAP_THRESHOLD_W
        reading = GpuReading(
            memory=self._memory(gpu),
            gpu_utilization_ratio=None if gpu.mig else util_percent / 100,
            memory_utilization_ratio=None if gpu.mig else max(0, util_percent * 6 // 10 + rng.randint(-5, 5)) / 100,
            power_watts=round(power, 3),
            energy_joules=round(gpu.energy_joules, 3),
            temperature_celsius=float(round(38.0 + power * 0.055 + rng.uniform(-1.0, 1.0))),
            sm_clock_hertz=(SM_CLOCK_CAPPED_MHZ if capped else SM_CLOCK_MHZ) * 1e6,
            memory_clock_hertz=MEMORY_CLOCK_MHZ * 1e6,
            clock_event_reasons=POWER_CAP_BIT if capped else 0,
            ecc_corrected_total=gpu.ecc_corrected,
            ecc_uncorrected_total=gpu.ecc_uncorrected,
            pcie_replays_total=gpu.pcie_replays,
            processes=None if gpu.mig else (ProcessMemory(gpu.pid, _process_bytes(TOTAL_BYTES)),),
            mig=self._mig(gpu),
        )
        if gpu.unsupported:
            unsupported: dict[str, Any] = {name: _unsupported(name) for name in gpu.unsupported}
            reading = dataclasses.replace(reading, **unsupported)
        return reading

    def poll_xid_events(self) -> list[XidEvent]:
        events, self._pending_xids = self._pending_xids, []
        return events

    def close(self) -> None:
        pass

    # ---- fault injection ----------------------------------------------------------------------
    def lose(self, index: int) -> None:
        """The GPU falls off the bus: reads raise GpuLost (as NVMLError_GpuIsLost) until restore()."""
        self._gpu(index).lost = True

    def restore(self, index: int) -> None:
        self._gpu(index).lost = False

    def inject_xid(self, index: int, code: int) -> None:
        """Queue one XID event for the next poll, as NVML's event set would deliver it."""
        self._gpu(index)
        self._pending_xids.append(XidEvent(index, code))

    def inject_ecc(self, index: int, corrected: int = 0, uncorrected: int = 0) -> None:
        gpu = self._gpu(index)
        if corrected < 0 or uncorrected < 0:
            raise ValueError("ECC error counts only go up")
        gpu.ecc_corrected += corrected
        gpu.ecc_uncorrected += uncorrected

    def set_unsupported(self, index: int, *fields: str) -> None:
        """Make fields of GpuReading read as NVMLError_NotSupported on this GPU."""
        unknown = set(fields) - _READING_FIELDS
        if unknown:
            raise ValueError(f"not GpuReading fields: {sorted(unknown)}; choose from {sorted(_READING_FIELDS)}")
        self._gpu(index).unsupported.update(fields)

    # ---- helpers ------------------------------------------------------------------------------------
    def _gpu(self, index: int) -> _FakeGpu:
        if not 0 <= index < len(self._gpus):
            raise IndexError(f"no fake GPU with index {index}; there are {len(self._gpus)}")
        return self._gpus[index]

    def _memory(self, gpu: _FakeGpu) -> MemoryReading:
        if gpu.mig:
            used = sum(_process_bytes(size) + CONTEXT_BYTES for _, _, size in MIG_LAYOUT)
        else:
            used = _process_bytes(TOTAL_BYTES) + CONTEXT_BYTES
        return MemoryReading(TOTAL_BYTES, used, TOTAL_BYTES - RESERVED_BYTES - used, RESERVED_BYTES)

    def _mig(self, gpu: _FakeGpu) -> tuple[MigReading, ...]:
        readings = []
        for info, (gi, _, size) in zip(gpu.mig, MIG_LAYOUT, strict=False):  # a GPU out of MIG mode has none
            used = _process_bytes(size) + CONTEXT_BYTES
            # NVML reports no reserved bytes per MIG instance: that field stays None, as on hardware.
            memory = MemoryReading(total_bytes=size, used_bytes=used, free_bytes=size - used)
            readings.append(MigReading(info, memory, (ProcessMemory(gpu.pid + gi, _process_bytes(size)),)))
        return tuple(readings)


def _process_bytes(total: int) -> int:
    """What vLLM holds at its default gpu_memory_utilization=0.9, rounded down to whole MiB."""
    return int(total * 0.9) // 2**20 * 2**20


def _unsupported(name: str) -> object:
    if name == "memory":
        return MemoryReading()
    if name == "mig":
        return ()
    return None
