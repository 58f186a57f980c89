"""The GPU smoke test covers every NVML call and every GPU series (issue #38, part 4), without a GPU.

The exporter's own NVML provider runs over the scripted pynvml stand-in (tests/exporter/fake_nvml.py): the
trace must see every call exporter/gpu/nvml.py makes, and the page the provider's readings render must
agree, series by series, with nvidia-smi output recorded for the same GPUs (written for these tests in
the format of `--query-gpu ... --format=csv,noheader,nounits`, `--query-compute-apps`, `-q` and `-L`;
not captured from a machine: the first real run is `scripts/gpu-smoke.sh` on one).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pynvml as real_nvml
import pytest

from exporter.exposition import render
from exporter.gpu import NvmlProvider, collect_gpus
from llmslo import conventions as c
from tests.exporter.fake_nvml import FakeDevice, FakeMig, FakeNvml, GiB
from tools import gpu_smoke as smoke
from tools import gpu_smoke_series as series
from tools import nvml_trace

REPO = Path(__file__).resolve().parents[2]
UUID0, UUID1 = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-1111-1111-1111-111111111111"
H100 = "NVIDIA H100 80GB HBM3"


def devices() -> list[FakeDevice]:
    """GPU 0 busy (power cap and SW thermal active, one process with memory, one without); GPU 1 in MIG mode."""
    return [
        FakeDevice(uuid=UUID0),
        FakeDevice(uuid=UUID1, bus_id=b"00000000:2A:00.0", used=2 * GiB, power_mw=98_200, reasons=0x1, replays=0,
                   procs=[], migs=[FakeMig(1, "3g.40gb", 40 * GiB, GiB, [(5151, GiB)]),
                                   FakeMig(2, "3g.40gb", 40 * GiB, 0)]),
    ]


# What nvidia-smi says of the same two GPUs (MiB: 80 GiB total, 512 MiB reserved).
SMI_CSV = textwrap.dedent(f"""\
    0, {UUID0}, {H100}, 00000000:18:00.0, 81920, 71680, 9728, 512, 87, 40, 350.12, 61, 1980, 2619, 3, 1, Disabled, 0x0000000000000024
    1, {UUID1}, {H100}, 00000000:2A:00.0, 81920, 2048, 79360, 512, [N/A], [N/A], 98.20, 61, 1980, 2619, 3, 1, Enabled, 0x0000000000000001
""")
APPS = f"{UUID0}, 4242, 61440\n{UUID0}, 4343, [N/A]\n"
SMI_Q = textwrap.dedent("""\
    ==============NVSMI LOG==============
    Attached GPUs                             : 2
    GPU 00000000:18:00.0
        Product Name                          : NVIDIA H100 80GB HBM3
        PCI
            Bus Id                            : 00000000:18:00.0
            Replays Since Reset               : 7
            Replay Number Rollovers           : 0
    GPU 00000000:2A:00.0
        PCI
            Replays Since Reset               : 0
""")
SMI_L = textwrap.dedent(f"""\
    GPU 0: {H100} (UUID: {UUID0})
    GPU 1: {H100} (UUID: {UUID1})
      MIG 3g.40gb     Device  0: (UUID: MIG-11111111-2222-3333-4444-555555555555)
      MIG 3g.40gb     Device  1: (UUID: MIG-66666666-7777-8888-9999-000000000000)
""")


def page_of(nvml: FakeNvml) -> str:
    provider = NvmlProvider(nvml)
    try:
        return render(collect_gpus(provider, "node-a")).decode()
    finally:
        provider.close()


def rows(text: str = SMI_CSV) -> list[dict]:
    return smoke.parse_smi_csv(text, list(smoke.SMI_FIELDS))


def extra(apps: str = APPS, q: str = SMI_Q, listing: str = SMI_L) -> dict:
    return {"apps": series.parse_compute_apps(apps), "replays": series.parse_replays(q),
            "migs": series.parse_mig_list(listing)}


def run_compare(first: FakeNvml, second: FakeNvml, seconds: float = 5.0, **kw) -> dict[tuple[str, str], str]:
    earlier = smoke.Earlier(page_of(first), seconds, extra(**kw))
    checks = smoke.compare(rows(), rows(), page_of(second), earlier)
    return {(ch.gpu.split()[0] if ch.gpu else "", ch.what): ch.outcome for ch in checks}


def later(energy_j_added: float = 5 * 350.0) -> FakeNvml:
    """The same GPUs a scrape later: GPU 0's energy counter moved by `energy_j_added`."""
    devs = devices()
    devs[0].energy_mj += int(energy_j_added * 1000)
    devs[1].energy_mj += 5 * 98_200
    return FakeNvml(devs)


# ---- every NVML call ----------------------------------------------------------------------------------
def test_the_call_table_names_exactly_the_calls_the_provider_makes():
    source = (REPO / "exporter" / "gpu" / "nvml.py").read_text()
    assert nvml_trace.nvml_names(source) - nvml_trace.NVML_CONSTANTS == set(nvml_trace.NVML_CALLS)
    assert nvml_trace.NVML_CONSTANTS <= nvml_trace.nvml_names(source)


def test_the_trace_makes_every_call_through_the_exporters_provider():
    nvml = FakeNvml(devices())
    tracer, problems = nvml_trace.trace(nvml)
    assert problems == []
    assert {n for n, r in tracer.records.items() if r.calls} == set(nvml_trace.NVML_CALLS)
    checks = nvml_trace.call_checks(tracer, problems)
    assert [ch.what for ch in checks] == list(nvml_trace.NVML_CALLS)
    assert {ch.outcome for ch in checks} == {"PASS"}, [ch for ch in checks if ch.outcome != "PASS"]
    wait = next(ch for ch in checks if ch.what == "nvmlEventSetWait")
    assert "NVMLError_Timeout" in wait.detail and c.GPU_XID_ERRORS.name in wait.detail
    assert nvml.shut_down


def test_unsupported_fields_warn_and_other_errors_fail():
    devs = devices()
    devs[0].errors = {"nvmlDeviceGetPcieReplayCounter": real_nvml.NVMLError_NotSupported,
                      "nvmlDeviceGetPowerUsage": real_nvml.NVMLError_NoPermission}
    tracer, problems = nvml_trace.trace(FakeNvml(devs))
    got = {ch.what: ch for ch in nvml_trace.call_checks(tracer, problems)}
    assert got["nvmlDeviceGetPcieReplayCounter"].outcome == "WARN"
    assert "leaves it out" in got["nvmlDeviceGetPcieReplayCounter"].detail
    assert got["nvmlDeviceGetPowerUsage"].outcome == "FAIL"
    assert "NVMLError_NoPermission x" in got["nvmlDeviceGetPowerUsage"].detail


def test_without_mig_the_mig_calls_skip_and_a_call_the_binding_lacks_warns():
    class OldBinding(FakeNvml):
        def __getattribute__(self, name):
            if name == "nvmlDeviceGetCurrentClocksEventReasons":
                raise AttributeError(name)  # nvidia-ml-py before 12.535
            return super().__getattribute__(name)

    tracer, problems = nvml_trace.trace(OldBinding([FakeDevice(uuid=UUID0)]))
    got = {ch.what: ch.outcome for ch in nvml_trace.call_checks(tracer, problems)}
    assert got["nvmlDeviceGetCurrentClocksEventReasons"] == "WARN"
    assert got["nvmlDeviceGetCurrentClocksThrottleReasons"] == "PASS"  # the exporter's fallback
    assert got["nvmlDeviceGetMigMode"] == "PASS"
    assert {got[f] for f in ("nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetGpuInstanceId")} == {"SKIP"}


def test_nvml_that_cannot_open_is_one_failure():
    checks = nvml_trace.run_trace(lambda: FakeNvml([], init_error=real_nvml.NVMLError_DriverNotLoaded()))
    assert [(ch.what, ch.outcome) for ch in checks] == [(nvml_trace.OPENED, "FAIL")]
    assert "NVIDIA driver not loaded" in checks[0].detail
    assert smoke.render_report(checks)[1] == smoke.EXIT_FAIL


# ---- every series beside nvidia-smi ------------------------------------------------------------------------
def test_every_gpu_series_has_a_counterpart_or_says_it_has_none():
    compared = {comp.metric for comp in smoke.COMPARISONS} | set(series.SERIES_COUNTERPARTS)
    assert compared == {m.name for m in c.GPU_METRICS}
    assert series.SERIES_COUNTERPARTS[c.GPU_ENERGY.name].startswith(series.NO_EQUIVALENT)


def test_the_fake_nvml_page_agrees_with_the_recorded_nvidia_smi_output():
    got = run_compare(FakeNvml(devices()), later())
    for gpu in ("0", "1"):
        for what in ("memory total", "memory used", "memory free", "memory reserved", "power", "temperature",
                     "SM clock", "identity (name, PCI bus)", "clock-event reasons", "energy (counter)", "PCIe replays"):
            assert got[(gpu, what)] == "PASS", (gpu, what, got)
    assert got[("0", "MIG instances")] == "SKIP" and got[("1", "MIG instances")] == "PASS"
    assert got[("0", "process memory")] == "PASS"  # pid 4343: nvidia-smi [N/A], NVML no usedGpuMemory: agreed
    assert got[("1", "process memory")] == "SKIP"  # MIG: per instance
    assert "FAIL" not in got.values()


@pytest.mark.parametrize(("change", "check", "outcome"), [
    (lambda d: setattr(d[0], "reasons", 0x8), "clock-event reasons", "WARN"),  # reasons move within ms
    (lambda d: setattr(d[0], "replays", 9), "PCIe replays", "FAIL"),  # more than nvidia-smi read after
    (lambda d: setattr(d[0], "replays", 5), "PCIe replays", "WARN"),  # a replay between the two
    (lambda d: setattr(d[0], "procs", [(4242, 50 * GiB)]), "process memory", "FAIL"),
    (lambda d: setattr(d[0], "procs", [(4242, 60 * GiB), (4343, GiB)]), "process memory", "WARN"),  # one has a figure
    (lambda d: setattr(d[0], "bus_id", b"00000000:19:00.0"), "identity (name, PCI bus)", "FAIL"),
])
def test_a_disagreement_is_reported(change, check, outcome):
    devs = devices()
    change(devs)
    second = later()
    change(second.devices)
    got = run_compare(FakeNvml(devs), second)
    assert got[("0", check)] == outcome, got


def test_mig_instances_against_nvidia_smi_list():
    got = run_compare(FakeNvml(devices()), later(), listing=SMI_L.replace("MIG 3g.40gb     Device  1", "MIG 1g.10gb     Device  1"))
    assert got[("1", "MIG instances")] == "FAIL"


def test_energy_going_back_fails_and_a_far_rate_warns():
    assert run_compare(FakeNvml(devices()), later(-10.0))[("0", "energy (counter)")] == "FAIL"
    assert run_compare(FakeNvml(devices()), later(5 * 2000.0))[("0", "energy (counter)")] == "WARN"


def test_nvidia_smi_answers_are_parsed():
    assert series.parse_compute_apps(APPS) == [(UUID0, "4242", 61440.0), (UUID0, "4343", None)]
    assert series.parse_replays(SMI_Q) == {"0:18:00.0": 7, "0:2a:00.0": 0}
    assert series.parse_mig_list(SMI_L) == {UUID0: [], UUID1: ["3g.40gb", "3g.40gb"]}
    assert series.bus_key("0000:2A:00.0") == series.bus_key("00000000:2a:00.0")
