"""slogen's build time: 10, 100 and 1,000 SLOs of every SLI kind (every output, and rules alone), and the
class-heavy catalog (latency, goodput and events SLIs of 100 tap classes) at 1,000 and 10,000 SLOs.

Targets: a full `slogen build` (rules, promtool tests and their promtool check, dashboards, runbooks, KEDA) of
1,000 SLOs of every kind under 10 s, rules alone (`slogen generate`) under 1 s; the class-heavy catalog under 5 s
at 1,000 SLOs and under 60 s at 10,000 (bench slogen-memory: its memory). Each figure is the wall time of one
`python -m slogen.cli ...` process (interpreter start included: what a user waits for) and its CPU time, the
build's forked child and promtool included. The peer column is the figure measured before this tree (as
BENCHMARKS.md records it: the old tree is not rebuilt here). A cProfile summary of the 1,000-SLO class-heavy
build goes to stderr and into the section's note.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import Row

SECTION = "slogen: build time"
COMMAND = "python -m bench slogen"
SIZES = (10, 100, 1000)
# Measured before (issue 36, on this machine): the class-heavy build of 1,000 SLOs, seconds.
BEFORE_CLASS = {1000: 18.5}
TARGET_CLASS = {1000: 5.0, 10_000: 60.0}
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
    "Wall time (and CPU time: the build, its forked children and promtool) of one `python -m slogen.cli` process on N "
    "synthetic SLOs in N/10 prometheus/v1 files, best of 3 (1 at 10,000). Every kind: every llmslo plugin, tap "
    "and engine sources, Sloth events and raw SLIs, alerts on. Class-heavy: each service's 10 SLOs are TTFT, TPOT "
    "and e2e latency, goodput and Sloth events SLIs of its own tap class, 100 classes. Full: `slogen build` with "
    "every output (rules, promtool tests, dashboards, runbooks, KEDA/HPA, deploy) and its `promtool check rules`. "
    "Rules: `slogen generate`. From 100 SLOs on, the promtool tests and (up to 5,000 SLOs) the dashboards are made "
    "in forked children while the build makes the rest (slogen/build.py, PARALLEL_MIN_SLOS), and promtool checks "
    "each step's rule files as soon as the step is done (slogen/promtoolcheck.py). Every row but the warm one is a first build: promtool "
    "checks every rule file (its cache of accepted files, slogen/checkcache.py, empty). The machine's two cores are "
    "shared: CPU time is the steadier figure."
)
NOTES = {SECTION: NOTE}


# The class-heavy shape: each service's 10 SLOs are latency (TTFT, TPOT, e2e), goodput and Sloth events SLIs of
# its own tap class (one goodput definition each), 100 classes in all (a class per service up to 100 services, then shared): the catalog whose
# build had slowed to 18.5 s at 1,000 SLOs (it was 6.8 s) and 132 s at 10,000.
CLASS_SIZES = (1000, 10_000)
CLASSES = 100
CLASS_SLIS = (
    ('{{plugin: {{id: "llmslo/latency", options: {{metric: "ttft", threshold: "0.5", slo_class: "{c}"}}}}}}', 99),
    ('{{plugin: {{id: "llmslo/latency", options: {{metric: "tpot", threshold: "0.05", slo_class: "{c}"}}}}}}', 99),
    ('{{plugin: {{id: "llmslo/latency", options: {{metric: "e2e", threshold: "10", slo_class: "{c}"}}}}}}', 95),
    ('{{plugin: {{id: "llmslo/goodput", options: {{slo_class: "{c}", ttft: "0.5", tpot: "0.05"}}}}}}', 95),
    ('{{plugin: {{id: "llmslo/goodput", options: {{slo_class: "{c}", ttft: "0.5", tpot: "0.05"}}}}}}', 99),
    ('{{events: {{error_query: \'sum(rate(req_total{{class="{c}",code=~"5.."}}[{{{{.window}}}}]))\', '
     'total_query: \'sum(rate(req_total{{class="{c}"}}[{{{{.window}}}}]))\'}}}}', 99.9),
)


def write_class_specs(root: Path, n: int) -> Path:
    """N SLOs of the class-heavy shape in N/10 files (10 per service), under root/slos."""
    slos = root / "slos"
    slos.mkdir(parents=True, exist_ok=True)
    for f in range(max(1, n // PER_FILE)):
        cls = f"class{f % CLASSES}"
        lines = ['version: "prometheus/v1"', f'service: "svc{f}"', "slos:"]
        for i in range(min(PER_FILE, n - f * PER_FILE)):
            sli, objective = CLASS_SLIS[i % len(CLASS_SLIS)]
            lines += [f'  - name: "slo{i}"', f"    objective: {objective}", f"    sli: {sli.format(c=cls)}",
                      f"    alerting: {{name: Svc{f}Slo{i}}}"]
        (slos / f"svc{f}.yaml").write_text("\n".join(lines) + "\n")
    return slos


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
    plain, settled = timed(argv, root, str(ROOT), 3)[0], timed(with_install(root, argv), root, str(ROOT), 3)[0]
    return Row(SECTION, f"{n} SLOs: full build with install settings (alerts scoped to a namespace, deploy/install)",
               f"{settled:.2f} s", f"{plain:.2f} s (the same build without settings, this run)",
               f"{settled / plain:.2f}x the time", COMMAND)


def _clean(root: Path) -> None:
    for name in ("out", "rules"):
        subprocess.run(["rm", "-rf", str(root / name)], check=True)
    (root / "rules").mkdir()


def timed(argv: list[str], root: Path, pythonpath: str, repeat: int, warm: bool = False) -> tuple[float, float]:
    """Best wall time of `repeat` runs of `python -m slogen.cli ARGV` (fresh output directories each time), and
    that run's CPU time (its children's included: the forked step, promtool). Cold: each run with an empty
    promtool-check cache (slogen/checkcache.py), as a first build; warm: after one untimed build filled it, as a
    rebuild whose rule files promtool accepted before."""
    cache = root / "cache"
    env = {**os.environ, "PYTHONPATH": pythonpath, "SLOGEN_CACHE_DIR": str(cache)}
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    if warm:
        _clean(root)
        subprocess.run([sys.executable, "-m", "slogen.cli", *argv], cwd=root, env=env, capture_output=True, check=True)
    best = (float("inf"), 0.0)
    for _ in range(repeat):
        _clean(root)
        if not warm:
            subprocess.run(["rm", "-rf", str(cache)], check=True)
        cpu0, t0 = _children_cpu(), time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "slogen.cli", *argv], cwd=root, env=env,
                              capture_output=True, text=True)
        elapsed, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
        if done.returncode != 0:
            raise RuntimeError(f"slogen {' '.join(argv[:1])} failed ({done.returncode}): {done.stderr[-2000:]}")
        best = min(best, (elapsed, cpu))
    return best


def _children_cpu() -> float:
    """User and system CPU seconds of this process's waited-for children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


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


def _kind_rows(rows: list[Row]) -> None:
    """Every kind of SLI at 10, 100 and 1,000 SLOs: the full build and rules alone; the install row at 1,000."""
    for n in SIZES:
        with tempfile.TemporaryDirectory(prefix="bench-slogen-") as tmp:
            root = Path(tmp)
            slos = write_specs(root, n)
            for kind, argv in commands(root, slos).items():
                wall, cpu = timed(argv, root, str(ROOT), 3)
                what = (f"{n} SLOs: full build (rules, tests, dashboards, runbooks, KEDA)" if kind == "full"
                        else f"{n} SLOs: rules only (slogen generate)")
                target = 10.0 if kind == "full" else 1.0
                rows.append(Row(SECTION, what, f"{wall:.2f} s ({cpu:.1f} s CPU)", f"target {target:g} s at 1,000",
                                "-", COMMAND))
                print(f"  {what}: {wall:.2f} s, {cpu:.1f} s CPU", file=sys.stderr, flush=True)
            if n == SIZES[-1]:
                rows.append(install_row(n, root, slos))
                print(f"  {rows[-1].what}: {rows[-1].ours}, {rows[-1].peer}", file=sys.stderr, flush=True)


def class_rows(sizes: tuple[int, ...] = CLASS_SIZES) -> tuple[list[Row], list[str]]:
    """The class-heavy catalog's full build at each size, against the figure measured before; the profile of
    the 1,000-SLO build."""
    rows, profiles = [], []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-slogen-class-") as tmp:
            root = Path(tmp)
            slos = write_class_specs(root, n)
            argv = commands(root, slos)["full"]
            wall, cpu = timed(argv, root, str(ROOT), 1 if n >= 10_000 else 3)
            what = f"{n:,} SLOs, class-heavy (latency, goodput, events; 100 classes): full build"
            met = "met" if wall < TARGET_CLASS[n] else "NOT met"
            before = BEFORE_CLASS.get(n)
            rows.append(Row(SECTION, what, f"{wall:.2f} s ({cpu:.1f} s CPU)",
                            f"{before:g} s (before, issue 36)" if before else "-",
                            (f"{before / wall:.1f}x faster; " if before else "") + f"target {TARGET_CLASS[n]:g} s {met}",
                            COMMAND))
            print(f"  {what}: {wall:.2f} s, {cpu:.1f} s CPU", file=sys.stderr, flush=True)
            if n == 1000:
                rows.append(_warm_row(n, argv, root))
                profiles.append(profile_summary(argv, root))
    return rows, profiles


def _warm_row(n: int, argv: list[str], root: Path) -> Row:
    """The same build again with promtool's verdicts on these rule files cached (a rebuild): what it skips is
    the cold row's `promtool check rules`."""
    wall, cpu = timed(argv, root, str(ROOT), 3, warm=True)
    what = f"{n:,} SLOs, class-heavy: full build, rule files promtool accepted before (warm check cache)"
    print(f"  {what}: {wall:.2f} s, {cpu:.1f} s CPU", file=sys.stderr, flush=True)
    return Row(SECTION, what, f"{wall:.2f} s ({cpu:.1f} s CPU)", "-",
               f"target {TARGET_CLASS[n]:g} s {'met' if wall < TARGET_CLASS[n] else 'NOT met'}", COMMAND)


def run() -> list[Row]:
    rows: list[Row] = []
    _kind_rows(rows)
    more, profiles = class_rows()
    rows += more
    for p in profiles:
        print(p, file=sys.stderr)
    NOTES[SECTION] = NOTE + "\n\nWhere the time goes now, by own time (cProfile, one in-process run each):\n\n" + "\n".join(
        "    " + line.strip() for p in profiles for line in p.split("\n")[:7])
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
