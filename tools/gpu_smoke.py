"""GPU smoke test: the exporter with real NVML against `nvidia-smi`, on a machine with an NVIDIA GPU.

`scripts/gpu-smoke.sh` runs `python -m tools.gpu_smoke`, from a checkout: the image ships only what runs in
production. It starts `llmslo-exporter --gpu nvml` on a loopback port, waits for a few collection cycles,
scrapes `/metrics` between two `nvidia-smi --query-gpu=... --format=csv,noheader,nounits` readings, and compares
per GPU (matched by UUID): memory (total, used, free, reserved), utilisation (GPU and memory), power, temperature, SM and memory
clocks, volatile ECC error counts, and XID errors (against the kernel log, when it is readable). It checks
the page with `promtool check metrics` and prints one line per check and a verdict.

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
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from exporter import promtext
from llmslo import conventions as c

EXIT_PASS, EXIT_FAIL, EXIT_SKIPPED = 0, 1, 77
MIB = 1024 * 1024

# nvidia-smi --query-gpu fields, in order. Optional ones are left out (and their checks skipped) on drivers
# that do not know them: nvidia-smi rejects the whole query for one unknown field.
SMI_FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "memory.total", "memory.used", "memory.free", "memory.reserved",
    "utilization.gpu", "utilization.memory", "power.draw", "temperature.gpu", "clocks.sm", "clocks.mem",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total", "mig.mode.current",
)
OPTIONAL_FIELDS = ("memory.reserved", "mig.mode.current")
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

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"


@dataclass(frozen=True)
class Check:
    gpu: str  # "0 GPU-8c4f..." or "" for checks of the whole run
    what: str
    outcome: str  # PASS | FAIL | WARN | SKIP
    detail: str


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


@dataclass
class PageGpu:
    """The exporter's whole-GPU series of one GPU (MIG instances' series are left aside)."""

    index: str
    uuid: str
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    up: float | None = None
    xids: dict[str, float] = field(default_factory=dict)

    def value(self, metric: str, labels: tuple[tuple[str, str], ...] = ()) -> float | None:
        return self.values.get((metric, labels))


def gpus_on_page(page: str) -> dict[str, PageGpu]:
    """The exporter's GPUs by UUID, from a /metrics page."""
    out: dict[str, PageGpu] = {}
    extra_labels = {c.LABEL_ECC_TYPE}
    for fam in promtext.parse_page(page).families.values():
        for s in fam.samples:
            uuid = s.labels.get(c.LABEL_UUID)
            if not s.name.startswith("llm_gpu_") or not uuid or s.labels.get(c.LABEL_GPU_INSTANCE_ID):
                continue
            gpu = out.setdefault(uuid, PageGpu(s.labels.get(c.LABEL_GPU, ""), uuid))
            if s.name == c.GPU_UP.name:
                gpu.up = s.value
            elif s.name == c.GPU_XID_ERRORS.name:
                gpu.xids[s.labels.get(c.LABEL_XID, "")] = s.value
            else:
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k in extra_labels))
                gpu.values[(s.name, key)] = s.value
    return out


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


def compare(before: list[dict], after: list[dict], page: str) -> list[Check]:
    """Every comparison for every GPU nvidia-smi lists, from two nvidia-smi readings around one scrape."""
    checks: list[Check] = []
    gpus = gpus_on_page(page)
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


def render_report(checks: list[Check]) -> tuple[str, int]:
    """The table and the verdict line, and the exit code."""
    lines = [f"{ch.outcome:4}  {ch.gpu or '-':<46}  {ch.what:<28}  {ch.detail}" for ch in checks]
    failed = [ch for ch in checks if ch.outcome == FAIL]
    passed = [ch for ch in checks if ch.outcome == PASS]
    warned = [ch for ch in checks if ch.outcome == WARN]
    if failed:
        verdict, code = f"VERDICT: FAIL ({len(failed)} failed, {len(passed)} passed, {len(warned)} warnings)", EXIT_FAIL
    elif not passed:
        verdict, code = "VERDICT: SKIPPED (nothing could be compared)", EXIT_SKIPPED
    else:
        verdict, code = f"VERDICT: PASS ({len(passed)} checks passed, {len(warned)} warnings)", EXIT_PASS
    return "\n".join(lines + ["", verdict]), code


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
            return r.read().decode()

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


def run(cycles_wanted: int, interval_s: float, out: Callable[[str], None] = print) -> int:
    try:
        smi = check_driver(shutil.which("nvidia-smi"))
    except Skipped as exc:
        out(f"SKIPPED: {exc}")
        return EXIT_SKIPPED
    started_wall = time.time()
    try:
        exporter = Exporter(interval_s)
    except RuntimeError as exc:
        out(f"FAIL: {exc}")
        return EXIT_FAIL
    try:
        deadline = time.monotonic() + 30 + cycles_wanted * interval_s * 3
        page = ""
        while time.monotonic() < deadline:
            try:
                page = exporter.scrape()
            except OSError:
                page = ""
            if page and cycles(page) >= cycles_wanted:
                break
            time.sleep(min(0.5, interval_s))
        else:
            out(f"FAIL: the exporter did not complete {cycles_wanted} cycles in time")
            return EXIT_FAIL
        before, fields = query_smi(SMI_FIELDS, smi)
        page = exporter.scrape()
        after, _ = query_smi(fields, smi)
    except Skipped as exc:
        out(f"SKIPPED: {exc}")
        return EXIT_SKIPPED
    finally:
        log = exporter.stop()
    checks = compare(before, after, page)
    checks.append(promtool_check(page, shutil.which("promtool")))
    kernel_log, note = read_kernel_log(started_wall)
    checks += compare_xids(page, kernel_log, note)
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
