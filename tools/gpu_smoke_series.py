"""The GPU series tools/gpu_smoke.py's table of fields does not cover, each beside what nvidia-smi says of it.

Clock-event reasons (`clocks_event_reasons.active`), PCIe replays (`nvidia-smi -q`: "Replays Since Reset"),
per-process memory (`--query-compute-apps`), MIG instances (`nvidia-smi -L`), the identity labels (name,
PCI bus); energy and XIDs have no nvidia-smi counterpart: energy is checked against itself (a counter that
never goes back) and against power.draw (its rate over the scrapes), XIDs against the kernel log
(tools/gpu_smoke.py). `SERIES_COUNTERPARTS` says, for each of these series, what it is compared with;
tests/exporter/test_gpu_smoke_nvml.py checks that with gpu_smoke.COMPARISONS it names every GPU series.
nvidia-smi's field names were read from its manual page (nvidia-smi 610.43, man.archlinux.org) and
`--help-query-gpu` as used by drivers 535 and later; none of its code is used.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from exporter.gpu.provider import CLOCK_EVENT_REASONS
from llmslo import conventions as c
from tools.gpu_smoke_report import FAIL, PASS, SKIP, WARN, Check, PageGpu

MIB = 1024 * 1024
NO_EQUIVALENT = "no nvidia-smi equivalent"
CLOCK_FIELD = "clocks_event_reasons.active"
COMPUTE_APPS = ("gpu_uuid", "pid", "used_memory")  # --query-compute-apps fields, in order
PROCESS_TOLERANCE = 256 * MIB  # allocations between the scrape and the query

SERIES_COUNTERPARTS: dict[str, str] = {
    c.GPU_UP.name: "nvidia-smi -L lists the GPU",
    c.GPU_CLOCK_EVENT.name: f"--query-gpu={CLOCK_FIELD} (bitmask)",
    c.GPU_PCIE_REPLAYS.name: "nvidia-smi -q: PCI, Replays Since Reset",
    c.GPU_PROCESS_MEMORY.name: "--query-compute-apps=gpu_uuid,pid,used_memory",
    c.GPU_ENERGY.name: f"{NO_EQUIVALENT}: never decreasing, its rate beside power.draw",
    c.GPU_XID_ERRORS.name: f"{NO_EQUIVALENT}: the kernel log's NVRM: Xid lines",
}


def _known_bits(mask: int) -> int:
    return mask & sum(CLOCK_EVENT_REASONS)


def _mask(cell: object) -> int | None:
    if isinstance(cell, str):
        try:
            return int(cell, 16)
        except ValueError:
            return None
    return int(cell) if isinstance(cell, float) else None


def compare_clock_events(name: str, gpu: PageGpu, readings: Sequence[dict]) -> Check:
    """The exporter's active reasons (a bitmask rebuilt from its 0/1 series) against nvidia-smi's two readings;
    reasons change within milliseconds, so a mismatch warns."""
    what = "clock-event reasons"
    if CLOCK_FIELD not in readings[0]:
        return Check(name, what, SKIP, f"this driver's nvidia-smi has no {CLOCK_FIELD}")
    theirs = [m for m in (_mask(r.get(CLOCK_FIELD)) for r in readings) if m is not None]
    active = gpu.labelled(c.GPU_CLOCK_EVENT.name, c.LABEL_CLOCK_EVENT)
    if not theirs:
        return Check(name, what, SKIP if not active else WARN, f"nvidia-smi: {readings[0].get(CLOCK_FIELD)}")
    if not active:
        return Check(name, what, FAIL, f"nvidia-smi reports {theirs[0]:#x}; the exporter has no {c.GPU_CLOCK_EVENT.name}")
    ours = sum(bit for bit, reason in CLOCK_EVENT_REASONS.items() if active.get(reason) == 1)
    names = ",".join(r for bit, r in CLOCK_EVENT_REASONS.items() if ours & bit) or "none"
    seen = "..".join(f"{_known_bits(m):#x}" for m in dict.fromkeys(theirs))
    ok = any(_known_bits(m) == ours for m in theirs)
    return Check(name, what, PASS if ok else WARN, f"exporter {ours:#x} ({names}), nvidia-smi {seen}")


def compare_energy(name: str, first: PageGpu | None, second: PageGpu, seconds: float, readings: Sequence[dict]) -> Check:
    """The energy counter over two scrapes `seconds` apart: never decreasing; its rate beside power.draw."""
    what = "energy (counter)"
    a = first.value(c.GPU_ENERGY.name) if first else None
    b = second.value(c.GPU_ENERGY.name)
    if b is None:
        return Check(name, what, SKIP, f"the exporter has no {c.GPU_ENERGY.name} ({NO_EQUIVALENT}; NVML: NotSupported)")
    if a is None or seconds <= 0:
        return Check(name, what, WARN, f"exporter {b:,.0f} J, seen once ({NO_EQUIVALENT})")
    if b < a:
        return Check(name, what, FAIL, f"went back from {a:,.0f} J to {b:,.0f} J in {seconds:.1f} s")
    rate = (b - a) / seconds
    watts = [r["power.draw"] for r in readings if isinstance(r.get("power.draw"), float)]
    if not watts:
        return Check(name, what, PASS, f"{rate:,.0f} W over {seconds:.1f} s; nvidia-smi has no power.draw here")
    low, high = min(watts), max(watts)
    near = 0.5 * low - 25 <= rate <= 1.5 * high + 25  # an average over the interval, beside two instants
    return Check(name, what, PASS if near else WARN,
                 f"{rate:,.0f} W over {seconds:.1f} s ({NO_EQUIVALENT}); nvidia-smi power.draw {low:g}..{high:g} W")


def parse_compute_apps(text: str) -> list[tuple[str, str, float | None]]:
    """(GPU UUID, pid, MiB or None) per line of `--query-compute-apps=gpu_uuid,pid,used_memory
    --format=csv,noheader,nounits`."""
    out = []
    for line in text.splitlines():
        cells = [x.strip() for x in line.split(",")]
        if len(cells) != len(COMPUTE_APPS):
            continue
        try:
            mib: float | None = float(cells[2])
        except ValueError:
            mib = None  # [N/A]: another PID namespace, or no permission
        out.append((cells[0], cells[1], mib))
    return out


def compare_processes(name: str, gpu: PageGpu, apps: list[tuple[str, str, float | None]]) -> Check:
    what = "process memory"
    ours = gpu.labelled(c.GPU_PROCESS_MEMORY.name, c.LABEL_PID)
    theirs = {pid: mib for uuid, pid, mib in apps if uuid == gpu.uuid}
    if gpu.migs:
        return Check(name, what, SKIP, "MIG mode: the exporter reports processes per instance")
    if not ours and not theirs:
        return Check(name, what, SKIP, "no compute process on this GPU (run a workload to compare)")
    parts, outcome = [], PASS
    for pid in sorted(set(ours) | set(theirs), key=lambda p: int(p) if p.isdigit() else 0):
        mine, smi = ours.get(pid), theirs.get(pid)
        if mine is None and smi is None:  # neither has a memory figure for it (another PID namespace, WDDM)
            parts.append(f"pid {pid}: no memory figure from either")
            continue
        if mine is None or (pid in theirs and smi is None):
            outcome = WARN if outcome == PASS else outcome
            parts.append(f"pid {pid}: exporter {'-' if mine is None else f'{mine / MIB:,.0f} MiB'}, "
                         f"nvidia-smi {'-' if smi is None else f'{smi:,.0f} MiB'}")
            continue
        if smi is None:  # listed by the exporter only: the process may have ended between the two
            outcome = WARN if outcome == PASS else outcome
            parts.append(f"pid {pid}: exporter {mine / MIB:,.0f} MiB, not listed by nvidia-smi")
            continue
        if abs(mine - smi * MIB) > PROCESS_TOLERANCE:
            outcome = FAIL
        parts.append(f"pid {pid}: exporter {mine / MIB:,.0f} MiB, nvidia-smi {smi:,.0f} MiB")
    return Check(name, what, outcome, "; ".join(parts))


def parse_replays(text: str) -> dict[str, int]:
    """Normalised PCI bus id -> "Replays Since Reset", from `nvidia-smi -q` (GPU sections start `GPU <bus id>`)."""
    out: dict[str, int] = {}
    bus = ""
    for line in text.splitlines():
        head = re.match(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f])\s*$", line)
        if head:
            bus = bus_key(head.group(1))
            continue
        m = re.match(r"^\s+Replays Since Reset\s*:\s*(\d+)\s*$", line)
        if m and bus:
            out[bus] = int(m.group(1))
    return out


def bus_key(bus_id: str) -> str:
    """'00000000:18:00.0' and '0000:18:00.0' alike: domain without leading zeros, lower case."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):x}:{rest}" if domain and rest else bus_id.strip().lower()


def compare_replays(name: str, gpu: PageGpu, replays: dict[str, int] | None) -> Check:
    what = "PCIe replays"
    ours = gpu.value(c.GPU_PCIE_REPLAYS.name)
    theirs = None if replays is None else replays.get(bus_key(gpu.bus_id))
    if theirs is None:
        return Check(name, what, SKIP, "nvidia-smi -q prints no Replays Since Reset for this GPU"
                     + ("" if ours is None else f"; exporter {ours:g}"))
    if ours is None:
        return Check(name, what, FAIL, f"nvidia-smi -q: {theirs}; the exporter has no {c.GPU_PCIE_REPLAYS.name}")
    if ours == theirs:
        return Check(name, what, PASS, f"exporter {ours:g}, nvidia-smi -q {theirs}")
    # read after the scrape: a replay in between makes nvidia-smi's higher, never lower
    return Check(name, what, WARN if ours < theirs else FAIL, f"exporter {ours:g}, nvidia-smi -q {theirs}")


def parse_mig_list(text: str) -> dict[str, list[str]]:
    """GPU UUID -> its MIG instances' profiles, from `nvidia-smi -L`."""
    out: dict[str, list[str]] = {}
    uuid = ""
    for line in text.splitlines():
        gpu = re.match(r"^GPU \d+: .*\(UUID: (GPU-[^)]+)\)", line)
        if gpu:
            uuid = gpu.group(1)
            out[uuid] = []
            continue
        mig = re.match(r"^\s+MIG (\S+)\s+Device\s+\d+:", line)
        if mig and uuid:
            out[uuid].append(mig.group(1))
    return out


def compare_mig(name: str, gpu: PageGpu, migs: dict[str, list[str]] | None) -> Check:
    what = "MIG instances"
    theirs = sorted((migs or {}).get(gpu.uuid, []))
    ours = sorted(profile for _, profile in gpu.migs)
    if not theirs and not ours:
        return Check(name, what, SKIP, "no MIG instance (nvidia-smi -L lists none)")
    return Check(name, what, PASS if ours == theirs else FAIL,
                 f"exporter {', '.join(ours) or 'none'}; nvidia-smi -L {', '.join(theirs) or 'none'}")


def compare_identity(name: str, gpu: PageGpu, row: dict) -> Check:
    """model_name and pci_bus_id labels against nvidia-smi's name and pci.bus_id."""
    pairs = (("model_name", gpu.name, str(row.get("name") or "")),
             ("pci_bus_id", bus_key(gpu.bus_id), bus_key(str(row.get("pci.bus_id") or ""))))
    wrong = [f"{label} {ours!r} vs {theirs!r}" for label, ours, theirs in pairs if ours != theirs]
    return Check(name, "identity (name, PCI bus)", FAIL if wrong else PASS,
                 "; ".join(wrong) or f"{gpu.name}, {gpu.bus_id}")


def more_checks(name: str, gpu: PageGpu, first: PageGpu | None, seconds: float, readings: Sequence[dict],
                extra: dict) -> list[Check]:
    """Every check of this module for one GPU; `extra` holds nvidia-smi's other answers (apps, replays, migs)."""
    return [
        compare_identity(name, gpu, readings[0]),
        compare_clock_events(name, gpu, readings),
        compare_energy(name, first, gpu, seconds, readings),
        compare_replays(name, gpu, extra.get("replays")),
        compare_processes(name, gpu, extra.get("apps") or []),
        compare_mig(name, gpu, extra.get("migs")),
    ]
