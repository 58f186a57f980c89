"""The GPU smoke test's logic (issue #14, item 6), without a GPU.

No NVIDIA driver here, so `scripts/gpu-smoke.sh` has never run against one. What can be tested is tested:
parsing nvidia-smi's CSV (written below in the format of `--format=csv,noheader,nounits`, with the
`[N/A]` and `[Not Supported]` answers nvidia-smi gives for fields a board or MIG mode lacks; written for
these tests, not captured from a machine), comparing it with an exporter page rendered by the exporter's
own GPU collector, the verdict, the fallback for drivers that reject a field, and the script's skip and
failure paths with stand-in nvidia-smi programs.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from exporter.exposition import render
from exporter.gpu.collector import gpu_labels, reading_samples
from exporter.gpu.provider import GpuInfo, GpuReading, MemoryReading
from exporter.model import NormSample
from llmslo import conventions as c
from tests.exporter.test_cli import REPO
from tools import gpu_smoke as smoke

FIELDS = list(smoke.SMI_FIELDS)
MIB = 1024 * 1024
H100 = "NVIDIA H100 80GB HBM3"
GPUS = (
    (0, "GPU-8c4f6c8e-2c1a-7d33-5a0e-0b1f2d3c4e5f", "00000000:18:00.0"),
    (1, "GPU-1d2e3f40-5a6b-7c8d-9e0f-a1b2c3d4e5f6", "00000000:2A:00.0"),
)
UUID0, UUID1 = GPUS[0][1], GPUS[1][1]
# Two H100s: GPU 0 busy, ECC on; GPU 1 in MIG mode (no utilisation) and without ECC counters.
SMI_CSV = textwrap.dedent(f"""\
    0, {UUID0}, {H100}, 00000000:18:00.0, 81559, 71234, 9792, 532, 87, 41, 612.47, 58, 1980, 2619, 3, 0, Disabled, 0x0000000000000004
    1, {UUID1}, {H100}, 00000000:2A:00.0, 81559, 1024, 80003, 532, [N/A], [N/A], 98.20, 33, 1980, 2619, [Not Supported], [Not Supported], Enabled, 0x0000000000000001
""")
# The readings the exporter's NVML provider would make of the same GPUs.
READINGS = {
    0: GpuReading(
        memory=MemoryReading(81559 * MIB, 71234 * MIB, 9792 * MIB, 532 * MIB), gpu_utilization_ratio=0.87,
        memory_utilization_ratio=0.41, power_watts=612.47, temperature_celsius=58, sm_clock_hertz=1980e6,
        memory_clock_hertz=2619e6, ecc_corrected_total=3, ecc_uncorrected_total=0,
    ),
    1: GpuReading(
        memory=MemoryReading(81559 * MIB, 1024 * MIB, 80003 * MIB, 532 * MIB), power_watts=98.2,
        temperature_celsius=33, sm_clock_hertz=1980e6, memory_clock_hertz=2619e6,
    ),
}


def exporter_page(override: dict[int, dict] | None = None, up: float = 1.0, gpus=GPUS, xids=()) -> str:
    """The page the exporter would serve for READINGS (with `override` fields changed per GPU index)."""
    samples: list[NormSample] = []
    for index, uuid, bus in gpus:
        reading = READINGS[index]
        for name, value in (override or {}).get(index, {}).items():
            if name.startswith("memory."):
                reading = dataclasses.replace(reading, memory=dataclasses.replace(reading.memory, **{name[7:]: value}))
            else:
                reading = dataclasses.replace(reading, **{name: value})
        info = GpuInfo(index, uuid, H100, bus)
        samples += reading_samples(reading, info, "node-a")
        samples.append(NormSample(c.GPU_UP, gpu_labels(info, "node-a"), up))
        for code, count in xids:
            samples.append(NormSample(c.GPU_XID_ERRORS, {**gpu_labels(info, "node-a"), c.LABEL_XID: code}, count))
    return render(samples).decode()


def outcomes(checks: list[smoke.Check]) -> dict[tuple[str, str], str]:
    return {(ch.gpu.split()[0] if ch.gpu else "", ch.what): ch.outcome for ch in checks}


# --------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------
def test_parse_smi_csv():
    rows = smoke.parse_smi_csv(SMI_CSV, FIELDS)
    assert [r["uuid"] for r in rows] == [UUID0, UUID1]
    assert rows[0]["memory.total"] == 81559.0 and rows[0]["power.draw"] == 612.47
    assert rows[0]["name"] == H100 and rows[0]["mig.mode.current"] == "Disabled"
    assert rows[1]["utilization.gpu"] is None and rows[1]["ecc.errors.corrected.volatile.total"] is None
    with pytest.raises(ValueError, match="18 fields"):
        smoke.parse_smi_csv("0, GPU-x, name\n", FIELDS)


def test_gpus_on_page_reads_whole_gpu_series_by_uuid():
    gpus = smoke.gpus_on_page(exporter_page())
    assert set(gpus) == {UUID0, UUID1}
    assert gpus[UUID0].index == "0" and gpus[UUID0].up == 1
    assert gpus[UUID0].value(c.GPU_MEMORY_TOTAL.name) == 81559 * MIB
    assert gpus[UUID0].value(c.GPU_ECC_ERRORS.name, (("type", "corrected"),)) == 3
    assert gpus[UUID1].value(c.GPU_UTILIZATION.name) is None


# --------------------------------------------------------------------------------------
# Comparing
# --------------------------------------------------------------------------------------
def test_an_exporter_that_agrees_with_nvidia_smi_passes():
    rows = smoke.parse_smi_csv(SMI_CSV, FIELDS)
    checks = smoke.compare(rows, rows, exporter_page())
    got = outcomes(checks)
    assert got[("0", "memory total")] == got[("0", "power")] == got[("0", "ECC corrected (volatile)")] == "PASS"
    assert got[("1", "utilisation")] == "SKIP"  # MIG mode: neither reports it
    assert got[("1", "ECC corrected (volatile)")] == "SKIP"
    assert set(got.values()) == {"PASS", "SKIP"}
    report, code = smoke.render_report(checks)
    assert code == smoke.EXIT_PASS and "VERDICT: PASS" in report


@pytest.mark.parametrize(("override", "check"), [
    ({0: {"memory.total_bytes": 80559 * MIB}}, ("0", "memory total")),  # 1 GiB off
    ({0: {"memory.used_bytes": 70000 * MIB}}, ("0", "memory used")),  # 1.2 GiB off
    ({0: {"temperature_celsius": 65}}, ("0", "temperature")),  # 7 C off
    ({0: {"power_watts": None}}, ("0", "power")),  # nvidia-smi has it, the exporter not
    ({0: {"ecc_uncorrected_total": 2}}, ("0", "ECC uncorrected (volatile)")),
    ({0: {"gpu_utilization_ratio": 0.5}}, ("0", "utilisation")),
    ({1: {"sm_clock_hertz": 1410e6}}, ("1", "SM clock")),
])
def test_a_disagreement_fails_that_check_and_the_verdict(override, check):
    rows = smoke.parse_smi_csv(SMI_CSV, FIELDS)
    checks = smoke.compare(rows, rows, exporter_page(override))
    got = outcomes(checks)
    assert [k for k, v in got.items() if v == "FAIL"] == [check]
    report, code = smoke.render_report(checks)
    assert code == smoke.EXIT_FAIL and "VERDICT: FAIL (1 failed" in report


def test_a_series_nvidia_smi_cannot_report_is_a_warning():
    rows = smoke.parse_smi_csv(SMI_CSV, FIELDS)
    checks = smoke.compare(rows, rows, exporter_page({1: {"ecc_corrected_total": 0}}))
    assert outcomes(checks)[("1", "ECC corrected (volatile)")] == "WARN"
    assert smoke.render_report(checks)[1] == smoke.EXIT_PASS


def test_moving_values_pass_between_the_two_readings():
    before = smoke.parse_smi_csv(SMI_CSV, FIELDS)
    after = smoke.parse_smi_csv(SMI_CSV.replace(", 87, 41, 612.47,", ", 40, 41, 300.0,"), FIELDS)
    inside = smoke.compare(before, after, exporter_page({0: {"gpu_utilization_ratio": 0.6, "power_watts": 450.0}}))
    assert outcomes(inside)[("0", "utilisation")] == outcomes(inside)[("0", "power")] == "PASS"
    beyond = smoke.compare(before, after, exporter_page({0: {"gpu_utilization_ratio": 0.2}}))
    assert outcomes(beyond)[("0", "utilisation")] == "FAIL"  # 20% is under 40% - 15 points


def test_missing_extra_or_down_gpus_fail():
    rows = smoke.parse_smi_csv(SMI_CSV, FIELDS)
    one = outcomes(smoke.compare(rows, rows, exporter_page(gpus=GPUS[:1])))
    assert one[("1", "present on /metrics")] == "FAIL"
    extra = outcomes(smoke.compare(rows[:1], rows[:1], exporter_page()))
    assert extra[("1", "listed by nvidia-smi")] == "FAIL"
    down = outcomes(smoke.compare(rows, rows, exporter_page(up=0.0)))
    assert down[("0", "llm_gpu_up")] == down[("1", "llm_gpu_up")] == "FAIL"


def test_xids_against_the_kernel_log():
    log = ("2026-12-01T05:00:01 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus.\n"
           "2026-12-01T05:00:02 kernel: NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, DBE\n")
    assert smoke.xid_lines(log) == {"79": 1, "48": 1}
    page = exporter_page(gpus=GPUS[:1], xids=(("79", 1.0), ("48", 1.0)))
    assert smoke.compare_xids(page, log, "test")[0].outcome == "PASS"
    assert smoke.compare_xids(exporter_page(), log, "test")[0].outcome == "FAIL"
    assert smoke.compare_xids(exporter_page(), "", "test")[0].outcome == "PASS"  # none, none
    assert smoke.compare_xids(exporter_page(), None, "not readable")[0].outcome == "SKIP"


# --------------------------------------------------------------------------------------
# Running it, with stand-in nvidia-smi programs
# --------------------------------------------------------------------------------------
FAKE_SMI = """\
#!{python}
import sys
ROWS = {rows!r}
FIELDS = {fields!r}
args = sys.argv[1:]
if args == ["-L"]:
    print({listing!r})
    sys.exit({list_exit})
query = [a for a in args if a.startswith("--query-gpu=")][0].split("=", 1)[1].split(",")
for name in {rejected!r}:
    if name in query:
        print(f'Field "{{name}}" is not a valid field to query.')
        sys.exit(2)
for row in ROWS:
    cells = dict(zip(FIELDS, row.split(", ")))
    print(", ".join(cells[f] for f in query))
"""


def fake_smi(tmp_path: Path, *, listing: str = "", list_exit: int = 0, rejected: tuple[str, ...] = ()) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    listing = listing or "\n".join(f"GPU {i}: {H100} (UUID: {u})" for i, u, _ in GPUS)
    smi.write_text(FAKE_SMI.format(python=sys.executable, rows=SMI_CSV.splitlines(), fields=FIELDS, listing=listing,
                                   list_exit=list_exit, rejected=list(rejected)))
    smi.chmod(0o755)
    return smi


def test_a_driver_that_rejects_a_field_is_queried_without_it(tmp_path):
    smi = fake_smi(tmp_path, rejected=("memory.reserved",))
    rows, fields = smoke.query_smi(smoke.SMI_FIELDS, str(smi))
    assert "memory.reserved" not in fields and len(rows) == 2
    checks = smoke.compare(rows, rows, exporter_page())
    assert outcomes(checks)[("0", "memory reserved")] == "SKIP"
    assert outcomes(checks)[("0", "memory total")] == "PASS"


def script(tmp_path: Path, path: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu-smoke.sh"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_without_nvidia_smi_the_script_says_so_and_skips(tmp_path):
    done = script(tmp_path, "/usr/bin:/bin")
    assert done.returncode == smoke.EXIT_SKIPPED
    assert "SKIPPED: nvidia-smi not found" in done.stderr


def test_a_driver_that_cannot_talk_to_the_gpu_skips_with_its_words(tmp_path):
    smi = fake_smi(tmp_path, listing="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
                   list_exit=9)
    done = script(tmp_path, f"{smi.parent}:/usr/bin:/bin")
    assert done.returncode == smoke.EXIT_SKIPPED
    assert "SKIPPED: nvidia-smi -L failed (exit 9): NVIDIA-SMI has failed" in done.stdout


def test_nvidia_smi_without_nvml_for_the_exporter_fails_and_says_why(tmp_path):
    """The whole run: the exporter starts with --gpu nvml, which cannot load NVML here, so the GPUs nvidia-smi
    lists are missing from /metrics; the verdict must be FAIL, never PASS."""
    smi = fake_smi(tmp_path)
    done = script(tmp_path, f"{smi.parent}:{os.environ['PATH']}", "--cycles", "1", "--interval", "0.5")
    assert done.returncode == smoke.EXIT_FAIL, done.stdout + done.stderr
    assert "present on /metrics" in done.stdout and "VERDICT: FAIL" in done.stdout
    assert "gpu_nvml_unavailable" in done.stdout  # the exporter's own reason, from its log


def test_the_smoke_tool_is_not_shipped() -> None:
    """The image and the package hold what runs in production; the smoke test runs from a checkout."""
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ") and "--from" not in line}
    assert "tools" not in copied and not any(c.startswith("tools") for c in copied)
    assert not any(p.name == "smoke.py" for p in (REPO / "exporter").rglob("*.py"))
    packaged = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert packaged and not any(p.startswith("tools") for p in packaged)
