"""What the GPU smoke test's parts share: its result lines and verdict, and the exporter's GPUs as a /metrics
page shows them (tools/nvml_trace.py: every NVML call; tools/gpu_smoke.py and tools/gpu_smoke_series.py:
every series beside nvidia-smi)."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter import promtext
from llmslo import conventions as c

EXIT_PASS, EXIT_FAIL, EXIT_SKIPPED = 0, 1, 77
PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"


@dataclass(frozen=True)
class Check:
    gpu: str  # "0 GPU-8c4f..." or "" for checks of the whole run
    what: str
    outcome: str  # PASS | FAIL | WARN | SKIP
    detail: str


@dataclass
class PageGpu:
    """The exporter's series of one GPU: whole-GPU values by (name, distinguishing labels), and the MIG
    instances' (GPU_I_ID, GPU_I_PROFILE) pairs."""

    index: str
    uuid: str
    name: str = ""
    bus_id: str = ""
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    up: float | None = None
    xids: dict[str, float] = field(default_factory=dict)
    migs: set[tuple[str, str]] = field(default_factory=set)

    def value(self, metric: str, labels: tuple[tuple[str, str], ...] = ()) -> float | None:
        return self.values.get((metric, labels))

    def labelled(self, metric: str, label: str) -> dict[str, float]:
        """label value -> value, for a metric told apart by one label (clock_event, pid)."""
        return {dict(key)[label]: v for (name, key), v in self.values.items() if name == metric and label in dict(key)}


_EXTRA_LABELS = frozenset({c.LABEL_ECC_TYPE, c.LABEL_CLOCK_EVENT, c.LABEL_PID})


def gpus_on_page(page: str) -> dict[str, PageGpu]:
    """The exporter's GPUs by UUID, from a /metrics page."""
    out: dict[str, PageGpu] = {}
    for fam in promtext.parse_page(page).families.values():
        for s in fam.samples:
            uuid = s.labels.get(c.LABEL_UUID)
            if not s.name.startswith("llm_gpu_") or not uuid:
                continue
            gpu = out.setdefault(uuid, PageGpu(s.labels.get(c.LABEL_GPU, ""), uuid, s.labels.get(c.LABEL_MODEL_NAME, ""),
                                               s.labels.get(c.LABEL_PCI_BUS_ID, "")))
            if s.labels.get(c.LABEL_GPU_INSTANCE_ID):
                gpu.migs.add((s.labels[c.LABEL_GPU_INSTANCE_ID], s.labels.get(c.LABEL_GPU_INSTANCE_PROFILE, "")))
            elif s.name == c.GPU_UP.name:
                gpu.up = s.value
            elif s.name == c.GPU_XID_ERRORS.name:
                gpu.xids[s.labels.get(c.LABEL_XID, "")] = s.value
            else:
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k in _EXTRA_LABELS))
                gpu.values[(s.name, key)] = s.value
    return out


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
