"""The NVML provider through the pynvml stand-in: the mapping to base units, NVML's failures, the fallback without
NVML, XID events and MIG instances."""

from __future__ import annotations

import inspect
import logging
import re
import sys
from pathlib import Path
from typing import Any

import pynvml as real_nvml
import pytest

from exporter.gpu import EmptyProvider, FakeProvider, GpuCollector, NvmlProvider, collect_gpus, open_provider
from exporter.gpu.nvml import MAX_XID_EVENTS_PER_POLL, mig_profile_from_name
from llmslo import conventions as c
from tests.exporter.fake_nvml import FakeMig, FakeNvml, GiB, ManualClock, names_for_gpu, pick, two_gpus, value

REPO = Path(__file__).resolve().parents[2]


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
