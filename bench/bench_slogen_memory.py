"""slogen's memory at 10,000 SLOs: a full `slogen build`, its peak memory and wall time, before and after.

The target: a catalog of 10,000 SLOs builds within 2 GB. The
peer is the same command on slogen and llmslo at the commit in the peer column (the build that held every file's text
until the end), same specs, same run. Memory is the whole process tree's resident set (the build and its
forked child), sampled every 50 ms from /proc; the largest single process's peak is in the note.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_slogen import write_specs
from bench.old_tree import old_tree
from bench.report import Row

SECTION = "slogen: memory at 10,000 SLOs"
COMMAND = "python -m bench slogen-memory"
BEFORE_COMMIT = "9ca7226"  # the build before it wrote its files as it made them
SLOS = 10_000
TARGET_BYTES = 2 << 30
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
    env = {**os.environ, "PYTHONPATH": pythonpath}
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
    with tempfile.TemporaryDirectory(prefix="bench-slogen-mem-") as tmp, \
            old_tree(BEFORE_COMMIT, "bench-slogen-mem-old-", ("slogen", "llmslo")) as old:
        root = Path(tmp)
        slos = write_specs(root, SLOS)
        ours = measured_build(root, slos, str(ROOT))
        print(f"  ours: {ours[0]:.0f} s, tree {gib(ours[1])}, largest process {gib(ours[2])}", file=sys.stderr)
        before = measured_build(root, slos, str(old))
        print(f"  before: {before[0]:.0f} s, tree {gib(before[1])}, largest process {gib(before[2])}", file=sys.stderr)
    NOTES[SECTION] = (
        __doc__.split("\n\n", 1)[1].strip() + f" The synthetic catalog of bench slogen ({SLOS:,} SLOs in "
        f"{SLOS // 10:,} files, about 1.8 GB of generated text before the dashboards' ConfigMaps). Largest single process: {gib(ours[2])} "
        f"now, {gib(before[2])} before. Target: under {gib(TARGET_BYTES)} for the whole tree "
        f"({'met' if ours[1] < TARGET_BYTES else 'NOT met'}).")
    return [
        Row(SECTION, f"{SLOS:,} SLOs: full build, peak memory (build and forked child)", gib(ours[1]),
            f"{gib(before[1])} (before, {BEFORE_COMMIT})", f"{before[1] / ours[1]:.1f}x less", COMMAND),
        Row(SECTION, f"{SLOS:,} SLOs: full build, wall time", f"{ours[0]:.0f} s",
            f"{before[0]:.0f} s (before, {BEFORE_COMMIT})", f"{before[0] / ours[0]:.2f}x", COMMAND),
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
