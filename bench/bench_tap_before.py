"""The tap's relay now against the same tap at an earlier commit, side by side in one run.

A change that hardens the relay (progress-based deadlines, bounded reads, admission reads off the
relay path) must not make it slower. Both taps relay the same upstream as `python -m bench tap`
drives it (bench.bench_tap: keep-alive streams, turns in rotating order, each figure the median over
the rounds of the path's percentile minus the direct path's in the same round), so the before and the
after take turns on the same machine minutes apart instead of coming from two runs hours apart.
BEFORE is the commit the reliability pass (#27) started from; `LLMSLO_BENCH_BEFORE=<commit>` picks another.
"""

from __future__ import annotations

import os
import sys

from bench import bench_tap as tap_bench
from bench.old_tree import old_tree
from bench.report import Row

BEFORE = os.environ.get("LLMSLO_BENCH_BEFORE", "a89947b")
SECTION = "Goodput tap: the relay now against before"
COMMAND = "python -m bench tap-before"
ROUNDS = 10  # more turns than bench tap's: the two taps differ by less than the neighbours' drift

NOTES: dict[str, str] = {}


def measure() -> dict[int, dict[str, tap_bench.PathRuns]]:
    results = {}
    rounds, tap_bench.ROUNDS = tap_bench.ROUNDS, ROUNDS
    try:
        with old_tree(BEFORE) as before_tree, tap_bench._upstream() as (upstream_port, upstream_pid), \
                tap_bench._tap(upstream_port) as now, tap_bench._tap(upstream_port, tree=before_tree) as before:
            paths = {"direct": (upstream_port, []), "now": now, "before": before}
            for streams in tap_bench.STREAM_COUNTS:
                results[streams] = runs = tap_bench._measure_turns(paths, streams, upstream_pid)
                for name, r in runs.items():
                    print(f"  {streams} streams, {name}: {r}", file=sys.stderr, flush=True)
    finally:
        tap_bench.ROUNDS = rounds
    return results


def rows_from(results: dict[int, dict[str, tap_bench.PathRuns]]) -> list[Row]:
    rows = []
    for streams, runs in results.items():
        for label, attr in (("TTFT p50", "ttft_p50_ms"), ("TTFT p99", "ttft_p99_ms"),
                            ("per-chunk p50", "chunk_p50_ms"), ("per-chunk p99", "chunk_p99_ms")):
            ours, peer = tap_bench.added(runs, "now", attr), tap_bench.added(runs, "before", attr)
            rows.append(Row(SECTION, f"added {label}, {streams} streams (ms)", f"{ours:.3f}", f"{peer:.3f}",
                            tap_bench._ratio(ours, peer), COMMAND))
        ours_cpu, peer_cpu = runs["now"].cpu_us_per_chunk, runs["before"].cpu_us_per_chunk
        assert ours_cpu is not None and peer_cpu is not None
        rows.append(Row(SECTION, f"CPU per streamed chunk, {streams} streams (µs)", f"{ours_cpu:.1f}", f"{peer_cpu:.1f}",
                        tap_bench._ratio(ours_cpu, peer_cpu), COMMAND))
    return rows


def run() -> list[Row]:
    results = measure()
    NOTES[SECTION] = (
        f"Ours = this tree's tap, peer = the tap at commit {BEFORE} (bench.old_tree: its exporter/ and llmslo/). "
        f"Upstream and client as in the section above ({tap_bench.TOKENS} chunks every {tap_bench.INTERVAL_MS:g} ms "
        f"after a {tap_bench.FIRST_MS:g} ms first token; the tap injects usage and strips it). The three paths "
        f"(direct, now, before) take {ROUNDS} turns each in rotating order, so both taps meet the same drift; each "
        f"added figure is the median over the rounds of the tap's percentile minus the direct path's in the same round, "
        f"with {tap_bench.SCHEDULING[0]} scheduling. A ratio near 1.00x is no change; sub-0.1 ms differences of the "
        f"p99 rows are within the run-to-run spread on this shared 2-core machine."
    )
    return rows_from(results)
