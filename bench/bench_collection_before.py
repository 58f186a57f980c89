"""The exporter's collection cycle now against the same cycle at an earlier commit, side by side in one run.

What a scrape of the exporter costs is its collection cycle (fetch every engine page on the node, parse the
families the adapters read, adapt, guard, render and gzip the page; bench.collection_worker's `ours`). The
node is bench_collection's: 8 vLLM engines x 64 LoRA adapters and 8 fake GPUs. Both trees' cycles run in
their own worker processes (bench.cycle_protocol, the earlier commit's exporter/ and llmslo/ from
bench.old_tree), in interleaved rounds, best round each. BEFORE is the commit this session's work started
from; `LLMSLO_BENCH_BEFORE=<commit>` picks another.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from bench.bench_collection import (
    GPUS,
    NODE_ADAPTERS,
    NODE_ENGINES,
    measure_interleaved,
    node_urls,
    page_name,
    page_server,
)
from bench.cycle_protocol import CycleWorker
from bench.lora_pages import vllm_lora_page
from bench.old_tree import old_tree
from bench.report import Row

BEFORE = os.environ.get("LLMSLO_BENCH_BEFORE", "a89947b")
SECTION = "Collection cycle: now against before"
COMMAND = "python -m bench collection-before"

NOTES = {SECTION: (
    f"Ours = this tree's exporter, peer = the exporter at commit {BEFORE} (bench.old_tree), each a "
    f"bench.collection_worker process on the same node of {NODE_ENGINES} vLLM engines x {NODE_ADAPTERS} LoRA adapters "
    "and 8 fake GPUs, in interleaved rounds, best round each. A ratio near 1.00x is no change."
)}


def run() -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="bench-collection-before-") as tmp, old_tree(BEFORE) as before:
        workdir = Path(tmp)
        for i in range(NODE_ENGINES):
            (workdir / f"{page_name(NODE_ADAPTERS, i)}.prom").write_text(vllm_lora_page(NODE_ADAPTERS, seed=i))
        with page_server(workdir) as base:
            spec = {"urls": node_urls(base, NODE_ENGINES, NODE_ADAPTERS), "gpu": GPUS, "node": "bench-node"}
            now = CycleWorker("bench.collection_worker", "ours", spec, workdir)
            then = CycleWorker("bench.collection_worker", "ours", spec, workdir, tree=before)
            try:
                ours, peer = measure_interleaved(now, then)
            finally:
                now.close()
                then.close()
    return [
        Row(SECTION, "CPU per collection cycle (ms)", f"{ours.cpu_s * 1e3:.1f}", f"{peer.cpu_s * 1e3:.1f}",
            f"{ours.cpu_s / peer.cpu_s:.2f}x", COMMAND),
        Row(SECTION, "wall time per collection cycle (ms)", f"{ours.wall_s * 1e3:.1f}", f"{peer.wall_s * 1e3:.1f}",
            f"{ours.wall_s / peer.wall_s:.2f}x", COMMAND),
        Row(SECTION, "output series", f"{ours.series:,}", f"{peer.series:,}", f"{ours.series / peer.series:.2f}x", COMMAND),
    ]
