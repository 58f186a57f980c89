"""GPU smoke test: the exporter with real NVML against `nvidia-smi`, on a machine with an NVIDIA GPU.

`scripts/gpu-smoke.sh` runs `python -m tools.gpu_smoke`, from a checkout: the image ships only what runs in
production. First it makes every NVML call the exporter makes, through the exporter's own provider
(tools/nvml_trace.py: one line per call, with what came back and the series it feeds). Then it starts
`llmslo-exporter --gpu nvml` on a loopback port, waits for a few collection cycles, scrapes `/metrics` twice,
the second time between two `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` readings, and compares
per GPU (matched by UUID): memory (total, used, free, reserved), utilisation (GPU and memory), power, temperature,
SM and memory clocks, volatile ECC error counts (here), identity labels, clock-event reasons, energy, PCIe
replays, per-process memory and MIG instances (tools/gpu_smoke_series.py, with `nvidia-smi -q`, `-L` and
`--query-compute-apps`), and XID errors (against the kernel log, when it is readable). It checks the page with
`promtool check metrics` and prints one line per check and a verdict.

Exit codes: 0 every check passed; 1 a check failed (or the exporter did not start); 77 skipped: no
NVIDIA driver, no GPU, or nothing to compare with (the code automake and meson use for "skipped").

Values that move (utilisation, power, clocks, memory in use) pass when the exporter's value lies within
the two nvidia-smi readings taken around the scrape, widened by a tolerance; fixed ones (memory total,
ECC counts, identity) must match. A field nvidia-smi reports as `[N/A]` or `[Not Supported]` is skipped,
and the exporter must then have no series for it either (a warning otherwise, not a failure).

The parsing and comparing live here, apart from the processes, so the tests run them on recorded
nvidia-smi output: `parse_smi_csv`, `gpus_on_page`, `compare`, `xid_lines`, `render_report`.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from exporter import promtext
from llmslo import conventions as c
from tools import gpu_smoke_series as series
from tools import nvml_trace
from tools.gpu_smoke_report import EXIT_FAIL, EXIT_SKIPPED, FAIL, PASS, SKIP, WARN, Check, PageGpu, gpus_on_page
from tools.gpu_smoke_report import EXIT_PASS as EXIT_PASS  # re-exported: the tests and callers read them here
from tools.gpu_smoke_report import render_report as render_report

MIB = 1024 * 1024

# nvidia-smi --query-gpu fields, in order. Optional ones are left out (and their checks skipped) on drivers
# that do not know them: nvidia-smi rejects the whole query for one unknown field.
SMI_FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used", "memory.free", "memory.reserved",
    "utilization.gpu", "utilization.memory", "power.draw", "temperature.gpu", "clocks.sm", "clocks.mem",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total", "mig.mode.current",
    "clocks_event_reasons.active",  # driver 535 and later; gpu_smoke_series.compare_clock_events
)
OPTIONAL_FIELDS = ("memory.reserved", "mig.mode.current", "clocks_event_reasons.active")
_NOT_A_VALUE = re.compile(r"^\[?(n/?a|not supported|unknown error|insufficient permissions|gpu requires reset)\]?$",
                          re.IGNORECASE)


@dataclass(frozen=True)
class Comparison:
    """One exporter series against one nvidia-smi field."""

    what: str
    metric: str  # llm_gpu_* name
    field: str  # nvidia-smi field
    to_exporter: float  # nvidia-smi's unit -> the exporter's
    tolerance_abs: float  # in the exporter's unit
    tolerance_rel: float = 0.0  # of the nvidia-smi value
    moving: bool = False  # a value that changes between readings
    labels: tuple[tuple[str, str], ...] = ()


COMPARISONS = (
    Comparison("memory total", c.GPU_MEMORY_TOTAL.name, "memory.total", MIB, MIB),
    # used/free: nvidia-smi and NVML v2 both leave reserved memory out; 256 MiB covers allocations between readings.
    Comparison("memory used", c.GPU_MEMORY_USED.name, "memory.used", MIB, 256 * MIB, moving=True),
    Comparison("memory free", c.GPU_MEMORY_FREE.name, "memory.free", MIB, 256 * MIB, moving=True),
    Comparison("memory reserved", c.GPU_MEMORY_RESERVED.name, "memory.reserved", MIB, MIB),
    Comparison("utilisation", c.GPU_UTILIZATION.name, "utilization.gpu", 0.01, 0.15, moving=True),
    Comparison("memory utilisation", c.GPU_MEMORY_UTILIZATION.name, "utilization.memory", 0.01, 0.15, moving=True),
    Comparison("power", c.GPU_POWER.name, "power.draw", 1.0, 25.0, 0.2, moving=True),
    Comparison("temperature", c.GPU_TEMPERATURE.name, "temperature.gpu", 1.0, 3.0, moving=True),
    Comparison("SM clock", c.GPU_SM_CLOCK.name, "clocks.sm", 1e6, 0.0, 0.1, moving=True),
    Comparison("memory clock", c.GPU_MEMORY_CLOCK.name, "clocks.mem", 1e6, 0.0, 0.1, moving=True),
    Comparison("ECC corrected (volatile)", c.GPU_ECC_ERRORS.name, "ecc.errors.corrected.volatile.total", 1.0, 0.0,
               labels=((c.LABEL_ECC_TYPE, "corrected"),)),
    Comparison("ECC uncorrected (volatile)", c.GPU_ECC_ERRORS.name, "ecc.errors.uncorrected.volatile.total", 1.0, 0.0,
               labels=((c.LABEL_ECC_TYPE, "uncorrected"),)),
)

# --------------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------------
def smi_value(text: str) -> float | str | None:
    """A CSV cell: a number, None for N/A-like answers, else the text."""
    text = text.strip()
    if not text or _NOT_A_VALUE.match(text):
        return None
    try:
        return float(text)
    except ValueError:
        return text


def parse_smi_csv(text: str, fields: Sequence[str]) -> list[dict[str, float | str | None]]:
    """Rows of `nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`, each a field -> value map."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(fields):
            # A GPU name never holds a comma today; refuse rather than shift every column.
            raise ValueError(f"nvidia-smi row has {len(cells)} cells for {len(fields)} fields: {line!r}")
        rows.append({f: (cell if f in ("uuid", "name", "pci.bus_id") else smi_value(cell)) for f, cell in zip(fields, cells, strict=True)})
    return rows


def xid_lines(kernel_log: str) -> dict[str, int]:
    """XID codes in kernel log lines (`NVRM: Xid (PCI:0000:17:00): 79, pid=...`), counted per code."""
    counts: dict[str, int] = {}
    for m in re.finditer(r"NVRM: Xid \(PCI:[^)]*\): (\d+)", kernel_log):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


# --------------------------------------------------------------------------------------------------------
# Comparing
# --------------------------------------------------------------------------------------------------------
def _fmt(value: float, metric: str) -> str:
    if metric.endswith("_bytes"):
        return f"{value / MIB:,.0f} MiB"
    if metric.endswith("_hertz"):
        return f"{value / 1e6:,.0f} MHz"
    if metric.endswith("_ratio"):
        return f"{value * 100:.0f}%"
    return f"{value:g}"


@dataclass(frozen=True)
class Earlier:
    """A scrape before the compared one, and nvidia-smi's other answers, for tools/gpu_smoke_series.py."""

    page: str
    seconds: float  # between this scrape and the compared one
    extra: dict  # "apps" (parse_compute_apps), "replays" (parse_replays), "migs" (parse_mig_list)


def compare(before: list[dict], after: list[dict], page: str, earlier: Earlier | None = None) -> list[Check]:
    """Every comparison for every GPU nvidia-smi lists, from two nvidia-smi readings around one scrape; with
    `earlier`, the series of tools/gpu_smoke_series.py too."""
    checks: list[Check] = []
    gpus = gpus_on_page(page)
    first = gpus_on_page(earlier.page) if earlier else {}
    after_by_uuid = {str(r["uuid"]): r for r in after}
    for row in before:
        uuid = str(row["uuid"])
        index = f"{row['index']:.0f}" if isinstance(row["index"], float) else str(row["index"])
        name = f"{index} {uuid}"
        gpu = gpus.get(uuid)
        if gpu is None:
            checks.append(Check(name, "present on /metrics", FAIL, "nvidia-smi lists this GPU, the exporter does not"))
            continue
        checks.append(Check(name, "identity (index, UUID)", PASS if gpu.index == index else FAIL,
                            f"exporter gpu={gpu.index}, nvidia-smi index={index}"))
        checks.append(Check(name, "llm_gpu_up", PASS if gpu.up == 1 else FAIL, f"llm_gpu_up {gpu.up}"))
        later = after_by_uuid.get(uuid, row)
        mig = str(row.get("mig.mode.current") or "").lower() == "enabled"
        for comp in COMPARISONS:
            checks.append(_compare_one(name, comp, row, later, gpu, mig))
        if earlier is not None:
            checks += series.more_checks(name, gpu, first.get(uuid), earlier.seconds, (row, later), earlier.extra)
    listed = {str(r["uuid"]) for r in before}
    for uuid, gpu in gpus.items():
        if uuid not in listed:
            checks.append(Check(f"{gpu.index} {uuid}", "listed by nvidia-smi", FAIL,
                                "the exporter reports a GPU nvidia-smi does not list"))
    return checks


def _compare_one(name: str, comp: Comparison, row: dict, later: dict, gpu: PageGpu, mig: bool) -> Check:
    ours = gpu.value(comp.metric, comp.labels)
    readings = [r.get(comp.field) for r in (row, later)]
    numbers = [v * comp.to_exporter for v in readings if isinstance(v, float)]
    if comp.field not in row:
        return Check(name, comp.what, SKIP, f"this driver's nvidia-smi has no {comp.field}")
    if not numbers:
        if ours is None:
            why = " (MIG mode)" if mig and comp.field.startswith("utilization") else ""
            return Check(name, comp.what, SKIP, f"not reported by nvidia-smi nor the exporter{why}")
        return Check(name, comp.what, WARN, f"nvidia-smi: {readings[0]}; the exporter reports {_fmt(ours, comp.metric)}")
    if ours is None:
        return Check(name, comp.what, FAIL, f"nvidia-smi reports {_fmt(numbers[0], comp.metric)}; "
                                            f"the exporter has no {comp.metric}")
    low, high = min(numbers), max(numbers)
    if not comp.moving:
        high = low = numbers[0]
    slack = max(comp.tolerance_abs, comp.tolerance_rel * high)
    ok = low - slack <= ours <= high + slack
    seen = _fmt(low, comp.metric) if low == high else f"{_fmt(low, comp.metric)}..{_fmt(high, comp.metric)}"
    return Check(name, comp.what, PASS if ok else FAIL,
                 f"exporter {_fmt(ours, comp.metric)}, nvidia-smi {seen} (tolerance {_fmt(slack, comp.metric)})")


def compare_xids(page: str, kernel_log: str | None, since_note: str) -> list[Check]:
    """XID counts the exporter saw against the kernel log's Xid lines since it started (when readable)."""
    ours: dict[str, float] = {}
    for gpu in gpus_on_page(page).values():
        for code, n in gpu.xids.items():
            ours[code] = ours.get(code, 0) + n
    seen = ", ".join(f"xid {k}: {v:g}" for k, v in sorted(ours.items())) or "none"
    if kernel_log is None:
        return [Check("", "XID errors", SKIP, f"exporter counted {seen}; kernel log not readable ({since_note})")]
    logged = xid_lines(kernel_log)
    same = {k: float(v) for k, v in logged.items()} == ours
    theirs = ", ".join(f"xid {k}: {v}" for k, v in sorted(logged.items())) or "none"
    return [Check("", "XID errors", PASS if same else FAIL, f"exporter {seen}; kernel log {theirs} ({since_note})")]


# --------------------------------------------------------------------------------------------------------
# Running it (the parts that need a GPU machine)
# --------------------------------------------------------------------------------------------------------
class Skipped(Exception):
    """Nothing to test on this machine; the message says why."""


def query_smi(fields: Sequence[str], smi: str = "nvidia-smi") -> tuple[list[dict], list[str]]:
    """Rows of nvidia-smi's query, and the fields it ran with (optional ones dropped if the driver lacks them)."""
    fields = list(fields)
    while True:
        done = subprocess.run([smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30)
        if done.returncode == 0:
            return parse_smi_csv(done.stdout, fields), fields
        unknown = [f for f in OPTIONAL_FIELDS if f in fields and f in (done.stdout + done.stderr)]
        if not unknown:
            raise Skipped(f"nvidia-smi --query-gpu failed (exit {done.returncode}): "
                          f"{(done.stderr or done.stdout).strip()[:300]}")
        fields = [f for f in fields if f not in unknown]


def check_driver(smi: str | None) -> str:
    """nvidia-smi's path; Skipped unless it exists and lists at least one GPU."""
    if smi is None:
        raise Skipped("nvidia-smi not found on PATH: no NVIDIA driver on this machine")
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Skipped(f"nvidia-smi -L did not run: {exc}") from None
    if done.returncode != 0:
        raise Skipped(f"nvidia-smi -L failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[:300]}")
    if not re.search(r"^GPU \d+:", done.stdout, re.M):
        raise Skipped("nvidia-smi -L lists no GPU")
    return smi


class Exporter:
    """`llmslo-exporter --gpu nvml` on a free loopback port, GPUs only."""

    def __init__(self, interval_s: float):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "exporter", "--listen", "127.0.0.1:0", "--gpu", "nvml",
             "--interval", f"{interval_s:g}", "--node-name", "gpu-smoke"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self.log: list[str] = []
        self.port = 0
        self.last_page = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.stderr is not None  # stderr=PIPE
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line.rstrip())
            m = re.search(r"event=listening address=\S+?:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if not self.port:
            self.stop()
            raise RuntimeError("the exporter did not start listening:\n" + "\n".join(self.log[-20:]))

    def scrape(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            self.last_page = r.read().decode()
        return self.last_page

    def stop(self) -> list[str]:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                _, rest = self.proc.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                _, rest = self.proc.communicate()
            self.log += (rest or "").splitlines()
        return self.log


def cycles(page: str) -> float:
    fam = promtext.parse_page(page, {c.EXPORTER_CYCLES.name.removesuffix("_total")}).families.get(
        c.EXPORTER_CYCLES.name.removesuffix("_total"))
    return max((s.value for s in fam.samples), default=0.0) if fam else 0.0


def promtool_check(page: str, promtool: str | None) -> Check:
    if promtool is None:
        return Check("", "promtool check metrics", SKIP, "promtool not found on PATH")
    done = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True, timeout=60)
    problems = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    if done.returncode == 0 and not problems:
        return Check("", "promtool check metrics", PASS, "no problems")
    return Check("", "promtool check metrics", FAIL, f"exit {done.returncode}: " + "; ".join(problems[:5]))


def read_kernel_log(started_wall: float) -> tuple[str | None, str]:
    """Kernel messages since the exporter started, from journalctl -k or dmesg; None when neither is readable."""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started_wall - 1))
    for argv in (["journalctl", "-k", "--no-pager", "-q", "--since", since], ["dmesg", "--time-format", "iso"]):
        if shutil.which(argv[0]) is None:
            continue
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0 and done.stdout.strip():
            text = done.stdout
            if argv[0] == "dmesg":  # keep the lines since the start: ISO stamps sort as text
                start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started_wall - 1))
                text = "\n".join(ln for ln in text.splitlines() if ln[:19] >= start)
            return text, f"{argv[0]} since {since}"
    return None, "journalctl -k and dmesg gave nothing (run as root to include this check)"


def query_extra(smi: str) -> dict:
    """nvidia-smi's answers beyond --query-gpu: compute processes, `-q` (PCIe replays), `-L` (MIG instances);
    one that fails leaves its key out (its checks skip)."""
    extra: dict = {}
    for key, argv, parse in (
        ("apps", [f"--query-compute-apps={','.join(series.COMPUTE_APPS)}", "--format=csv,noheader,nounits"],
         series.parse_compute_apps),
        ("replays", ["-q"], series.parse_replays),
        ("migs", ["-L"], series.parse_mig_list),
    ):
        try:
            done = subprocess.run([smi, *argv], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            extra[key] = parse(done.stdout)
    return extra


def _wait_for_cycles(exporter: Exporter, cycles_wanted: int, interval_s: float) -> tuple[str, float]:
    """The first page with `cycles_wanted` cycles done, and when it was read; ("", 0) on time-out."""
    deadline = time.monotonic() + 30 + cycles_wanted * interval_s * 3
    while time.monotonic() < deadline:
        try:
            page = exporter.scrape()
        except OSError:
            page = ""
        if page and cycles(page) >= cycles_wanted:
            return page, time.monotonic()
        time.sleep(min(0.5, interval_s))
    return "", 0.0


def _against_smi(smi: str, exporter: Exporter, cycles_wanted: int, interval_s: float) -> list[Check]:
    """Two scrapes two cycles apart; nvidia-smi read around the second. Raises Skipped, RuntimeError."""
    first, first_at = _wait_for_cycles(exporter, cycles_wanted, interval_s)
    if not first:
        raise RuntimeError(f"the exporter did not complete {cycles_wanted} cycles in time")
    time.sleep(2 * interval_s)  # so the energy counter moves between the two scrapes
    before, fields = query_smi(SMI_FIELDS, smi)
    page, page_at = exporter.scrape(), time.monotonic()
    after, _ = query_smi(fields, smi)
    checks = compare(before, after, page, Earlier(first, page_at - first_at, query_extra(smi)))
    checks.append(promtool_check(page, shutil.which("promtool")))
    return checks


def run(cycles_wanted: int, interval_s: float, out: Callable[[str], None] = print) -> int:
    try:
        smi = check_driver(shutil.which("nvidia-smi"))
    except Skipped as exc:
        out(f"SKIPPED: {exc}")
        return EXIT_SKIPPED
    checks = nvml_trace.run_trace(lambda: importlib.import_module("pynvml"))  # every NVML call, in-process
    started_wall = time.time()
    try:
        exporter = Exporter(interval_s)
    except RuntimeError as exc:
        out(f"FAIL: {exc}")
        return EXIT_FAIL
    try:
        checks += _against_smi(smi, exporter, cycles_wanted, interval_s)
    except Skipped as exc:
        out(f"SKIPPED: {exc}")
        return EXIT_SKIPPED
    except RuntimeError as exc:
        out(f"FAIL: {exc}")
        return EXIT_FAIL
    finally:
        log = exporter.stop()
    kernel_log, note = read_kernel_log(started_wall)
    checks += compare_xids(exporter.last_page, kernel_log, note)
    unavailable = [ln for ln in log if "gpu_nvml_unavailable" in ln or "gpu_down" in ln]
    checks.append(Check("", "exporter log", FAIL if unavailable else PASS,
                        "; ".join(unavailable[:3]) if unavailable else "no gpu_nvml_unavailable or gpu_down event"))
    report, code = render_report(checks)
    out(report)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu-smoke.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("--cycles", type=int, default=3, help="collection cycles to wait for (default 3)")
    p.add_argument("--interval", type=float, default=1.0, help="the exporter's interval in seconds (default 1)")
    args = p.parse_args(argv)
    return run(args.cycles, args.interval)


if __name__ == "__main__":
    sys.exit(main())
