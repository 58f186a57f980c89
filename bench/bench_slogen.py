"""slogen's own speed: load, validate and generate rules for 10, 100 and 1000 SLOs.

The peer would be the `sloth generate` binary on the same specs, but Sloth is a Go program that
cannot be installed on this machine (no Go toolchain or module download, no Debian or PyPI
package). The peer column is therefore slogen's `--sloth-compat` mode, which emits exactly
Sloth's rules (tests/slogen/test_golden.py): the ratio shows what the traffic-weighted rules,
per-tier alerts and no-data alerts cost at generation time, not a comparison with Sloth's binary.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.report import Row
from slogen.generators import generate
from slogen.generators.options import GenOptions
from slogen.loaders import load_paths
from slogen.writers import rule_file

SECTION = "slogen: build time"
COMMAND = "python -m bench slogen"
SIZES = (10, 100, 1000)
PER_FILE = 10
PLUGINS = (
    ('{plugin: {id: "llmslo/latency", options: {metric: "ttft", threshold: "0.5", slo_class: "interactive"}}}', 99),
    ('{plugin: {id: "llmslo/goodput", options: {slo_class: "interactive", ttft: "0.5", tpot: "0.05"}}}', 95),
    ('{events: {error_query: \'sum(rate(req_total{code=~"5.."}[{{.window}}]))\', '
     'total_query: \'sum(rate(req_total[{{.window}}]))\'}}', 99.9),
)

NOTES = {SECTION: (
    "Wall time of load + validate + generate + render the rule files, best of 3, for N SLOs in N/10 "
    "prometheus/v1 files (a mix of llmslo/latency, llmslo/goodput and Sloth events SLIs, alerts on). "
    "Peer: slogen --sloth-compat (Sloth's exact rules); the Sloth binary itself (Go) cannot be installed "
    "here, so this is not a measurement of Sloth. Generated promtool tests are not included (they "
    "simulate each SLO and are built per service by `slogen build`)."
)}


def write_specs(root: Path, n: int) -> None:
    for f in range(max(1, n // PER_FILE)):
        lines = ['version: "prometheus/v1"', f'service: "svc{f}"', "slos:"]
        for i in range(min(PER_FILE, n - f * PER_FILE)):
            sli, objective = PLUGINS[i % len(PLUGINS)]
            lines += [f'  - name: "slo{i}"', f"    objective: {objective}", f"    sli: {sli}",
                      f"    alerting: {{name: Svc{f}Slo{i}}}"]
        (root / f"svc{f}.yaml").write_text("\n".join(lines) + "\n")


def timed(root: Path, compat: bool) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        loaded = load_paths([root])
        results = generate(loaded.slos, GenOptions(sloth_compat=compat))
        for r in results:
            rule_file(r.rules.groups())
        best = min(best, time.perf_counter() - t0)
    return best


def run() -> list[Row]:
    rows = []
    for n in SIZES:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            write_specs(root, n)
            ours, peer = timed(root, False), timed(root, True)
        rows.append(Row(SECTION, f"{n} SLOs: load, validate, generate, render", f"{ours * 1000:.0f} ms",
                        f"{peer * 1000:.0f} ms (--sloth-compat)", f"{ours / peer:.2f}", COMMAND))
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
