"""The fake GPU provider (deterministic, H100-like, faults through the collector), `--gpu` specs, and dcgm-exporter
compatibility: its labels and units, the docs' table, and a rendered page that promtool accepts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pynvml as real_nvml
import pytest

from exporter.exposition import render
from exporter.gpu import EmptyProvider, FakeProvider, GpuCollector, collect_gpus, open_provider
from exporter.gpu.spec import parse_spec
from llmslo import conventions as c
from tests.exporter.fake_nvml import ManualClock, names_for_gpu, pick, value
from tests.helpers.needs import shared_dir

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO / ".." / "shared"
DCGM = SHARED / "peers" / "dcgm"


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
