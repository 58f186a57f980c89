"""slogen's build time for 10, 100 and 1,000 SLOs: every output, and rules alone, before and after.

The targets: a full `slogen build` (rules, promtool tests, dashboards, runbooks, KEDA)
of 1,000 SLOs under 10 s, rules alone (`slogen generate`) under 1 s. The peer column is the same
command run on slogen and llmslo as they were at BEFORE_COMMIT (taken out with `git archive`), on
the same synthetic specs in the same run, so the ratio is the speed-up. Each figure is the wall time
of one `python -m slogen.cli ...` process (interpreter start included: what a user waits for).
A cProfile summary of the largest current-tree build goes to stderr and into the section's note.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.old_tree import old_tree
from bench.report import Row

SECTION = "slogen: build time"
COMMAND = "python -m bench slogen"
BEFORE_COMMIT = "ed3bf19"  # the tree before the build-speed work
SIZES = (10, 100, 1000)
PER_FILE = 10
ROOT = Path(__file__).resolve().parents[1]

# One SLO per entry, cycled: every llmslo plugin and both Sloth SLI shapes.
SLIS = (
    ('{plugin: {id: "llmslo/latency", options: {metric: "ttft", threshold: "0.5", slo_class: "interactive"}}}', 99),
    ('{plugin: {id: "llmslo/goodput", options: {slo_class: "interactive", ttft: "0.5", tpot: "0.05"}}}', 95),
    ('{plugin: {id: "llmslo/availability", options: {source: "tap", slo_class: "interactive"}}}', 99.9),
    ('{plugin: {id: "llmslo/latency", options: {metric: "e2e", threshold: "10", source: "engine", '
     "selector: '{engine=\"vllm\"}'}}}", 99),
    ('{plugin: {id: "llmslo/availability", options: {source: "engine"}}}', 99.5),
    ('{plugin: {id: "llmslo/kv-headroom", options: {threshold: "0.9"}}}', 95),
    ('{events: {error_query: \'sum(rate(req_total{code=~"5.."}[{{.window}}]))\', '
     'total_query: \'sum(rate(req_total[{{.window}}]))\'}}', 99.9),
    ('{raw: {error_ratio_query: \'sum(rate(req_total{code=~"5.."}[{{.window}}])) / '
     'sum(rate(req_total[{{.window}}]))\'}}', 99.9),
)

AUTOSCALING = """version: "llmslo/autoscaling/v1"
pools:
  - name: pool-a
    namespace: llm
    target: {kind: Deployment, name: pool-a}
    replicas: {min: 1, max: 8}
    match: {namespace: llm, model: llama-3-8b}
    triggers:
      queue_depth: {per_replica: 4}
      kv_cache_utilization: {per_replica: 0.85}
      ttft_burn_rate: {slo: svc0/slo0, above: 2, window: 5m}
"""

NOTE = (
    "Wall time of one `python -m slogen.cli` process on N synthetic SLOs in N/10 prometheus/v1 files (every "
    "llmslo plugin, tap and engine sources, Sloth events and raw SLIs, alerts on), best of 3 (1 at 1,000 SLOs "
    "before). Full: `slogen build` with every output (rules, promtool tests, dashboards, runbooks, KEDA/HPA, "
    "deploy). Rules: `slogen generate` (the rule files only). Peer: the same command on slogen and llmslo at "
    f"{BEFORE_COMMIT} (before the build's speed work), same specs, same run. Targets: full build of "
    "1,000 SLOs under 10 s, rules under 1 s. The before tree makes fewer files (the dashboard tests came "
    "later), so its full-build figure is, if anything, low. Promtool-test simulations are shared by SLOs of one "
    "shape (objective, windows, options): the synthetic catalog has 8 shapes, as a real one has a handful. "
    "From 100 SLOs on, `slogen build` generates the promtool tests in a forked child while it makes the rest "
    "(slogen/build.py, PARALLEL_MIN_SLOS): on these 2 cores the 1,000-SLO build took 10.5 to 11 s in one process "
    "and 6 to 7 s with the child, same bytes. The profile below is the parent's."
)
NOTES = {SECTION: NOTE}


def write_specs(root: Path, n: int) -> Path:
    """N SLOs in N/10 files under root/slos, and an autoscaling spec beside them (the build reads both)."""
    slos = root / "slos"
    slos.mkdir(parents=True, exist_ok=True)
    for f in range(max(1, n // PER_FILE)):
        lines = ['version: "prometheus/v1"', f'service: "svc{f}"', "slos:"]
        for i in range(min(PER_FILE, n - f * PER_FILE)):
            sli, objective = SLIS[(f * PER_FILE + i) % len(SLIS)]
            lines += [f'  - name: "slo{i}"', f"    objective: {objective}", f"    sli: {sli}",
                      f"    alerting: {{name: Svc{f}Slo{i}}}"]
        (slos / f"svc{f}.yaml").write_text("\n".join(lines) + "\n")
    (root / "autoscaling").mkdir(exist_ok=True)
    (root / "autoscaling" / "pools.yaml").write_text(AUTOSCALING)
    return slos


def commands(root: Path, slos: Path) -> dict[str, list[str]]:
    return {
        "full": ["build", "--out", str(root / "out"), str(slos)],
        "rules": ["generate", "-i", str(slos), "-o", str(root / "rules")],
    }


def with_install(root: Path, argv: list[str]) -> list[str]:
    """`argv` (the full build) with install settings: every alert scoped to a namespace (the OnNamespace label)
    and deploy/install written over a copy of the bases, as in a repository `slogen init` made."""
    settings = root / "llmslo.yaml"
    settings.write_text("version: llmslo/install/v1\nnamespace: monitoring\ninferenceNamespaces: [llm]\n"
                        "objectLabels: {release: kps}\nimage: registry.corp/llmslo@sha256:" + "ab" * 32 + "\n")
    return [*argv, "--settings", str(settings)]


def install_row(n: int, root: Path, slos: Path) -> Row:
    """The full build with and without install settings, side by side in one run (ours only: the before tree
    has no settings)."""
    argv = commands(root, slos)["full"]
    plain, settled = timed(argv, root, str(ROOT), 3), timed(with_install(root, argv), root, str(ROOT), 3)
    return Row(SECTION, f"{n} SLOs: full build with install settings (alerts scoped to a namespace, deploy/install)",
               f"{settled:.2f} s", f"{plain:.2f} s (the same build without settings, this run)",
               f"{settled / plain:.2f}x the time", COMMAND)


def _clean(root: Path) -> None:
    for name in ("out", "rules"):
        subprocess.run(["rm", "-rf", str(root / name)], check=True)
    (root / "rules").mkdir()


def timed(argv: list[str], root: Path, pythonpath: str, repeat: int) -> float:
    """Best wall time of `repeat` runs of `python -m slogen.cli ARGV` (fresh output directories each time)."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    best = float("inf")
    for _ in range(repeat):
        _clean(root)
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "slogen.cli", *argv], cwd=root, env=env,
                              capture_output=True, text=True)
        elapsed = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"slogen {' '.join(argv[:1])} failed ({done.returncode}): {done.stderr[-2000:]}")
        best = min(best, elapsed)
    return best


def profile_summary(argv: list[str], root: Path, top: int = 6) -> str:
    """The functions holding the most own time in one in-process run of the current tree."""
    from slogen.cli import main

    _clean(root)
    prof = cProfile.Profile()
    cwd = os.getcwd()
    os.chdir(root)
    try:
        prof.runcall(main, argv)
    finally:
        os.chdir(cwd)
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    total = sum(s[2] for s in stats.stats.values())  # type: ignore[attr-defined]
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]  # type: ignore[attr-defined]
    lines = [f"{'/'.join(file.rsplit('/', 2)[-2:])}:{line} {fn}: {tt:.2f} s own, {ct:.2f} s with callees"
             for (file, line, fn), (_, _, tt, ct, _) in rows]
    return f"profile of `slogen {argv[0]}` (in-process, {total:.1f} s own time in all):\n  " + "\n  ".join(lines)


def run() -> list[Row]:
    rows: list[Row] = []
    profiles: list[str] = []
    with old_tree(BEFORE_COMMIT, "bench-slogen-old-", ("slogen", "llmslo")) as old:
        for n in SIZES:
            with tempfile.TemporaryDirectory(prefix="bench-slogen-") as tmp:
                root = Path(tmp)
                slos = write_specs(root, n)
                for kind, argv in commands(root, slos).items():
                    ours = timed(argv, root, str(ROOT), 3)
                    before = timed(argv, root, str(old), 1 if n >= 1000 else 3)
                    what = (f"{n} SLOs: full build (rules, tests, dashboards, runbooks, KEDA)" if kind == "full"
                            else f"{n} SLOs: rules only (slogen generate)")
                    rows.append(Row(SECTION, what, f"{ours:.2f} s", f"{before:.2f} s (before, {BEFORE_COMMIT})",
                                    f"{before / ours:.1f}x faster", COMMAND))
                    print(f"  {what}: {ours:.2f} s, before {before:.2f} s", file=sys.stderr, flush=True)
                    if n == SIZES[-1]:
                        profiles.append(profile_summary(argv, root))
                if n == SIZES[-1]:
                    rows.append(install_row(n, root, slos))
                    print(f"  {rows[-1].what}: {rows[-1].ours}, {rows[-1].peer}", file=sys.stderr, flush=True)
    for p in profiles:
        print(p, file=sys.stderr)
    NOTES[SECTION] = NOTE + "\n\nWhere the time goes now, by own time (cProfile, one in-process run each):\n\n" + "\n".join(
        "    " + line.strip() for p in profiles for line in p.split("\n")[:7])
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
