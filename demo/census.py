"""`python -m demo.census`: count the series one node's exporter exposes, by source, for E engines with A LoRA
adapters each (a tap in front of every engine) and G GPUs, against the real simulator and the real exporter.

docs/scaling.md derives the per-node series formula from the conventions and the adapters; this measures it.
Every engine serves its base model and its adapters, each gets a few streamed requests through its tap (so
every histogram and counter child exists), then one exporter cycle (`--once`) is counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import aiohttp
import yaml

from demo.procs import Supervisor, free_port
from llmslo import conventions as C

SLO_FILE = """\
version: "prometheus/v1"
service: "census"
slos:
  - name: "goodput-interactive"
    objective: 95
    sli: {plugin: {id: "llmslo/goodput", options: {slo_class: "interactive", ttft: "0.5", tpot: "0.05"}}}
    alerting: {page_alert: {disable: true}, ticket_alert: {disable: true}}
"""


def source_of(name: str) -> str:
    base = name.removesuffix("_bucket").removesuffix("_count").removesuffix("_sum")
    for group, metrics in (("gpu", C.GPU_METRICS), ("tap", C.TAP_METRICS), ("engine", C.ENGINE_METRICS),
                           ("exporter", C.EXPORTER_METRICS)):
        if any(base == m.name for m in metrics):
            return group
    return "other"


async def _traffic(session: aiohttp.ClientSession, tap_url: str, models: list[str], per_model: int) -> None:
    for model in models:
        for _ in range(per_model):
            body = {"model": model, "messages": [{"role": "user", "content": "count the series"}],
                    "max_tokens": 4, "stream": True}
            async with session.post(tap_url + "/v1/chat/completions", json=body) as resp:
                await resp.read()


async def census(engines: int, adapters: int, gpus: int, workdir: Path) -> dict:
    sup = Supervisor(workdir / f"logs-{engines}-{adapters}")
    slo = workdir / "slo.yaml"
    slo.write_text(SLO_FILE)
    targets = []
    try:
        waits, taps = [], []
        for i in range(engines):
            sim_port, tap_port, metrics_port = free_port(), free_port(), free_port()
            loras = [f"adapter-{i}-{j}" for j in range(adapters)]
            argv = [sys.executable, "-m", "simulator.cli", "serve", "--port", str(sim_port), "--model", f"model-{i}"]
            if loras:
                argv += ["--lora", ",".join(loras), "--max-loras", str(max(1, adapters))]
            sim = sup.spawn(f"sim-{i}", argv)
            tap = sup.spawn(f"tap-{i}", [sys.executable, "-m", "exporter.tap", "--listen", f"127.0.0.1:{tap_port}",
                                         "--upstream", f"http://127.0.0.1:{sim_port}", "--metrics-listen",
                                         f"127.0.0.1:{metrics_port}", "--slo", str(slo), "--log-level", "warning"])
            waits += [sup.wait_http(sim, f"http://127.0.0.1:{sim_port}/health"),
                      sup.wait_http(tap, f"http://127.0.0.1:{metrics_port}/metrics")]
            taps.append((f"http://127.0.0.1:{tap_port}", [f"model-{i}", *loras]))
            targets += [{"kind": "vllm", "url": f"http://127.0.0.1:{sim_port}/metrics", "name": f"engine-{i}",
                         "pod": f"pod-{i}", "namespace": "llm"},
                        {"kind": "tap", "url": f"http://127.0.0.1:{metrics_port}/metrics", "name": f"tap-{i}",
                         "pod": f"pod-{i}", "namespace": "llm"}]
        await asyncio.gather(*waits)
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(_traffic(session, url, models, 3) for url, models in taps))
        config = workdir / f"exporter-{engines}-{adapters}.yaml"
        config.write_text(yaml.safe_dump({"gpu": f"fake:{gpus}", "node_name": "node-0", "targets": targets}))
        page = subprocess.run([sys.executable, "-m", "exporter", "--config", str(config), "--once"],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    finally:
        await sup.stop()
    counts: Counter[str] = Counter()
    for line in page.splitlines():
        if line and not line.startswith("#"):
            counts[source_of(line.split("{", 1)[0].split(" ", 1)[0])] += 1
    return {"engines": engines, "adapters": adapters, "gpus": gpus, **dict(sorted(counts.items())),
            "total": sum(counts.values())}


async def _main(cases: list[tuple[int, int, int]]) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="llmslo-census-") as tmp:
        return [await census(e, a, g, Path(tmp)) for e, a, g in cases]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.census", description=__doc__.split("\n\n")[0])
    p.add_argument("--case", action="append", default=[], metavar="E,A,G",
                   help="engines, LoRA adapters per engine, GPUs (repeatable; default: 1,0,1 1,2,1 2,2,2 4,2,4 4,8,8)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    cases = [tuple(int(x) for x in c.split(",")) for c in args.case] or [
        (1, 0, 1), (1, 2, 1), (2, 2, 2), (4, 2, 4), (4, 8, 8)]
    rows = asyncio.run(_main(cases))  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        keys = ["engines", "adapters", "gpus", "gpu", "engine", "tap", "exporter", "other", "total"]
        print("  ".join(f"{k:>8}" for k in keys))
        for r in rows:
            print("  ".join(f"{r.get(k, 0):>8}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
