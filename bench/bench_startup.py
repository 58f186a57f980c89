"""Start-up: `llmslo-exporter --once` on one saved vLLM page, minus Python's own start-up, this tree vs OLD_COMMIT
(as BEFORE records it: that tree is not run again).

Wall time of `python -m exporter --once --gpu off --engine vllm=file://PAGE` (the page: the simulator's vLLM
page with 64 LoRA adapters, `bench/lora_pages.py`; output to /dev/null) and of `python -c pass` with the same
interpreter, in interleaved rounds; the difference of the medians is what the exporter adds. `-X importtime` of
one more run lists which heavy packages it imports. Then the whole process on many pages: `--once` over
PAGE_COPIES copies of the page (7.3 MB, one file:// target each) against a process that parses the same files
with prometheus_client's parser, start-up included on both sides.
"""

from __future__ import annotations

import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Start-up: llmslo-exporter --once on a saved page"
COMMAND = "python -m bench startup"
OLD_COMMIT = "9090d4d"  # before lazy imports: the tap's CLI, aiohttp, TLS contexts, yaml, NVML bindings at start
RECORDED = "2026-12-01"  # when OLD_COMMIT's exporter last ran beside ours (BENCHMARKS.md, commit abf091b)
# OLD_COMMIT's figures then, in ms (`python -c pass` took 24 ms in that run), and its imports.
BEFORE = {"wall": 322, "beyond": 297, "fastest": 242}
BEFORE_IMPORTS = "409 modules; `aiohttp`, `exporter.tap`, `yaml`, `prometheus_client`, `exporter.gpu.nvml`"
ROUNDS = 21
HEAVY = ("aiohttp", "exporter.tap", "yaml", "prometheus_client", "exporter.gpu.nvml", "exporter.server", "grpc",
         "google.protobuf", "importlib.metadata")
PAGE_COPIES = 80  # of the 91 kB page: 7.3 MB
PAGES_ROUNDS = 5  # the peer's process takes about 1.5 s
PEER_PARSE = ("import sys\nfrom prometheus_client.parser import text_string_to_metric_families as parse\n"
              "for path in sys.argv[1:]:\n    with open(path) as f:\n        list(parse(f.read()))\n")

NOTES = {
    SECTION: (
        "Wall time of `python -m exporter --once --gpu off --engine vllm=file://PAGE > /dev/null` (the simulator's "
        f"vLLM page, 64 LoRA adapters) and of `python -c pass`, same interpreter, {ROUNDS} interleaved rounds, "
        "medians; *beyond Python's own* is the difference. Bytecode is cached (in a separate tree), as in an "
        "installed package. *Peer*: the exporter at "
        f"{OLD_COMMIT} as recorded {RECORDED} when it last ran beside ours (not run again), which imported the goodput tap's CLI (and with it "
        "aiohttp's client and server, whose import builds TLS contexts), yaml, prometheus_client and the NVML "
        "bindings on every start. The imports row is from `-X importtime` of one more run each. *Many pages*: the "
        f"same `--once` over {PAGE_COPIES} copies of the page (7.3 MB, one file:// target each) as one whole "
        "process, against a process that parses the same files with prometheus_client's "
        f"`text_string_to_metric_families` (the peer here), {PAGES_ROUNDS} interleaved rounds, medians of wall "
        "time and of CPU time (the child's user and system time, every thread: less swayed by the neighbours "
        "of a shared machine)."
    ),
}


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def _heavy_imports(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[list[str], int]:
    """Which of HEAVY the run imports, and how many modules in all (from -X importtime)."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, check=True)
    names = {m.group(1) for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", done.stderr, re.M)}
    return [h for h in HEAVY if h in names], len(names)


def _many_pages(tmp: Path, text: str, env: dict[str, str]) -> list:
    """`--once` over PAGE_COPIES saved pages as a whole process vs prometheus_client parsing the same files."""
    from bench.report import Row

    folder = tmp / "pages"
    folder.mkdir()
    paths = [folder / f"vllm-{i:03d}.prom" for i in range(PAGE_COPIES)]
    for path in paths:
        path.write_text(text)
    megabytes = sum(p.stat().st_size for p in paths) / 1e6
    ours = [sys.executable, "-m", "exporter", "--once", "--gpu", "off",
            *(arg for path in paths for arg in ("--engine", f"vllm=file://{path}"))]
    peer = [sys.executable, "-c", PEER_PARSE, *map(str, paths)]
    for argv in (ours, peer):
        _run(argv, ROOT, env)
    wall: dict[str, list[float]] = {"ours": [], "peer": []}
    cpu: dict[str, list[float]] = {"ours": [], "peer": []}
    for _ in range(PAGES_ROUNDS):
        for side, argv in (("ours", ours), ("peer", peer)):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall[side].append(_run(argv, ROOT, env))
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[side].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    mine, theirs = statistics.median(wall["ours"]), statistics.median(wall["peer"])
    mine_cpu, theirs_cpu = statistics.median(cpu["ours"]), statistics.median(cpu["peer"])
    what = f"many pages: one process over {PAGE_COPIES} saved pages ({megabytes:.1f} MB), median of {PAGES_ROUNDS}"
    return [
        Row(SECTION, f"{what}, wall time", f"{mine * 1000:.0f} ms (`--once`)",
            f"{theirs * 1000:.0f} ms (prometheus_client parser)", f"{theirs / mine:.1f}x less", COMMAND),
        Row(SECTION, f"{what}, CPU time (user + system, all threads)", f"{mine_cpu * 1000:.0f} ms",
            f"{theirs_cpu * 1000:.0f} ms", f"{theirs_cpu / mine_cpu:.1f}x less", COMMAND),
    ]


def _before(text: str) -> str:
    """A peer cell: OLD_COMMIT's recorded figure, said to be one."""
    return f"{text} (before, {OLD_COMMIT}, recorded {RECORDED})"


def run() -> list:
    from bench.lora_pages import vllm_lora_page
    from bench.report import Row

    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        page = Path(tmp) / "vllm.prom"
        page.write_text(vllm_lora_page(64))
        once = [sys.executable, "-m", "exporter", "--once", "--gpu", "off", "--engine", f"vllm=file://{page}"]
        bare = [sys.executable, "-c", "pass"]
        # Bytecode cached, as in an installed package (pip compiles it): a separate cache tree, so neither
        # the repository nor the interpreter's own caches are written, and PYTHONDONTWRITEBYTECODE (set in
        # some sandboxes) does not make every run compile every module again.
        base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        base["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        env_ours = dict(base)
        _run(bare, ROOT, env_ours)
        _run(once, ROOT, env_ours)  # compile the tree's .pyc files once, outside the measurement
        times: dict[str, list[float]] = {"python": [], "ours": []}
        for _ in range(ROUNDS):
            times["python"].append(_run(bare, ROOT, env_ours))
            times["ours"].append(_run(once, ROOT, env_ours))
        names, count = _heavy_imports(once, ROOT, env_ours)
        pages_rows = _many_pages(Path(tmp), page.read_text(), env_ours)

    python = statistics.median(times["python"])
    ours = statistics.median(times["ours"])

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.0f} ms"

    imported = f"{count} modules; " + (", ".join(f"`{n}`" for n in names) if names else "none of them")
    return [
        Row(SECTION, f"wall time, median of {ROUNDS} (`python -c pass`: {ms(python)})", ms(ours),
            _before(f"{BEFORE['wall']} ms"), f"{BEFORE['wall'] / 1000 / ours:.1f}x less", COMMAND),
        Row(SECTION, "beyond Python's own start-up (median minus `python -c pass`'s)", ms(ours - python),
            _before(f"{BEFORE['beyond']} ms"), f"{BEFORE['beyond'] / 1000 / (ours - python):.1f}x less", COMMAND),
        Row(SECTION, f"fastest of {ROUNDS}, beyond Python's fastest", ms(min(times["ours"]) - min(times["python"])),
            _before(f"{BEFORE['fastest']} ms"), "", COMMAND),
        Row(SECTION, f"imports ({', '.join(HEAVY)})", imported, _before(BEFORE_IMPORTS), "", COMMAND),
        *pages_rows,
    ]
