"""slogen's memory at 10,000 SLOs: a full `slogen build`, its peak memory and wall time.

The targets: a catalog of 10,000 SLOs builds within 2 GB and within 60 s. The peer column is the figure measured
before this tree (as BENCHMARKS.md records it: the old tree is not rebuilt here), same specs. Memory is the whole
process tree's resident set (the build, its forked children and promtool), sampled every 50 ms from /proc; the
largest single process's peak is in the note. A first build: promtool's cache of accepted files starts empty.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_slogen import write_specs
from bench.report import Row

SECTION = "slogen: memory at 10,000 SLOs"
COMMAND = "python -m bench slogen-memory"
SLOS = 10_000
TARGET_BYTES = 2 << 30
TARGET_SECONDS = 60.0
BEFORE = (132.0, 1.47)  # seconds and GiB, measured before (issue 36; BENCHMARKS.md)
ROOT = Path(__file__).resolve().parents[1]
NOTES: dict[str, str] = {}


def _tree(pid: int) -> list[int]:
    """pid and its descendants (from /proc's children lists)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except OSError:
            continue
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def measured_build(root: Path, slos: Path, pythonpath: str) -> tuple[float, int, int]:
    """(wall seconds, peak tree RSS, peak single-process RSS) of one `slogen build` of `slos`."""
    subprocess.run(["rm", "-rf", str(root / "out")], check=True)
    subprocess.run(["rm", "-rf", str(root / "cache")], check=True)
    env = {**os.environ, "PYTHONPATH": pythonpath, "SLOGEN_CACHE_DIR": str(root / "cache")}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: a build's notes would fill a pipe nobody reads yet
        proc = subprocess.Popen([sys.executable, "-m", "slogen.cli", "build", "--out", str(root / "out"), str(slos)],
                                cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=log)
        tree_peak = one_peak = 0
        while proc.poll() is None:
            sizes = [_rss(p) for p in _tree(proc.pid)]
            tree_peak, one_peak = max(tree_peak, sum(sizes)), max(one_peak, max(sizes, default=0))
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
        log.seek(0)
        err = log.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"slogen build failed ({proc.returncode}): {err[-2000:]}")
    return elapsed, tree_peak, one_peak


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def run() -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="bench-slogen-mem-") as tmp:
        root = Path(tmp)
        slos = write_specs(root, SLOS)
        wall, tree, one = measured_build(root, slos, str(ROOT))
        print(f"  ours: {wall:.0f} s, tree {gib(tree)}, largest process {gib(one)}", file=sys.stderr)
    NOTES[SECTION] = (
        __doc__.split("\n\n", 1)[1].strip() + f" The synthetic catalog of bench slogen ({SLOS:,} SLOs in "
        f"{SLOS // 10:,} files, every kind of SLI). Largest single process: {gib(one)}. Targets: under "
        f"{gib(TARGET_BYTES)} for the whole tree ({'met' if tree < TARGET_BYTES else 'NOT met'}), under "
        f"{TARGET_SECONDS:g} s ({'met' if wall < TARGET_SECONDS else 'NOT met'}).")
    return [
        Row(SECTION, f"{SLOS:,} SLOs: full build, peak memory (build, forked children, promtool)", gib(tree),
            f"{BEFORE[1]:.2f} GiB (before, issue 36)", f"{BEFORE[1] * (1 << 30) / tree:.1f}x less", COMMAND),
        Row(SECTION, f"{SLOS:,} SLOs: full build, wall time", f"{wall:.0f} s", f"{BEFORE[0]:g} s (before, issue 36)",
            f"{BEFORE[0] / wall:.2f}x", COMMAND),
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
