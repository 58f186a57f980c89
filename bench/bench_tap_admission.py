"""The tap's KV admission at overload: goodput with and without `--admission`, on the simulator in real time.

The engine is the simulator (`llmslo-sim serve`, Llama-3.1-8B on an H100, its KV cache cut to KV_BLOCKS
blocks of 16 tokens and every step SLOWDOWN times slower, so that a small load fills it and the streams stay
cheap for the shared CPUs), behind the tap (`python -m exporter.tap --slo slos/chat.yaml`, so requests are
judged by the interactive class: TTFT <= 0.5 s and TPOT <= 0.05 s). Its capacity within those objectives is
derived first in virtual time on the same engine and workload: the highest arrival rate at which at least
95 % of the requests are good (the goodput SLO's objective). Then an open-loop Poisson load of OVERLOAD x that
rate (the same request stream, seed and all) is offered for ARRIVALS_S seconds, once through a tap without
admission and once through a tap with `--admission` at its defaults. A client gives up on a request after
CLIENT_TIMEOUT_S (as a user would; without it the backlog of the run without admission would take minutes to
drain). Reported: goodput (good requests per second of arrivals, over all offered: a refused request is not
good), the p99 TTFT of the admitted requests (one that never got a first token counts as slower than any),
and the share refused.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from bench.report import Row
from simulator.config import EngineConfig
from simulator.faults import FaultState
from simulator.loadgen import run_load
from simulator.stats import RequestRecord
from simulator.virtual import simulate
from simulator.workload import LengthDist, WorkloadSpec

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Goodput tap: KV admission at 2x overload (simulator, real time)"
PRESET = "llama3-8b-h100"
MODEL = "llama-3-8b-instruct"  # matched by slos/chat.yaml's interactive class (llama-3-8b*)
KV_BLOCKS = 600  # 9,600 KV tokens: about ten requests of p99 size
SLOWDOWN = 2.0
TTFT_SLO, TPOT_SLO = 0.5, 0.05
PROMPT = LengthDist(400, 0.3, 16, 1000)
OUTPUT = LengthDist(100, 0.3, 8, 300)
OVERLOAD = 2.0
ARRIVALS_S = 35.0
CLIENT_TIMEOUT_S = 15.0
GOOD_SHARE = 0.95  # capacity: the highest rate at which this share of requests is good
SEED = 3

NOTES = {
    SECTION: (
        f"Simulator `{PRESET}` with --num-gpu-blocks {KV_BLOCKS} (9,600 KV tokens) and --slowdown {SLOWDOWN:g}, "
        f"prompts ~{PROMPT.median:.0f} tokens, outputs ~{OUTPUT.median:.0f}; served in real time behind the tap "
        f"(interactive class: TTFT <= {TTFT_SLO} s, TPOT <= {TPOT_SLO} s). Capacity = the highest Poisson rate at "
        f"which {GOOD_SHARE:.0%} of requests are good, found in virtual time on the same engine and workload; "
        f"the load offered is {OVERLOAD:g}x that for {ARRIVALS_S:g} s, the same request stream for both runs; "
        f"clients give up after {CLIENT_TIMEOUT_S:g} s. Ours: `--admission` at its defaults; peer: no admission. "
        "Goodput counts good requests over all offered (refused ones are not good) per second of arrivals; "
        "p99 TTFT is over the admitted requests, one that never got a first token counting as slower than any."
    ),
}


def _spec(rate: float, duration: float) -> WorkloadSpec:
    return WorkloadSpec(rate=rate, duration=duration, prompt_len=PROMPT, output_len=OUTPUT, seed=SEED)


def capacity() -> float:
    """The highest rate (0.5 req/s steps) at which GOOD_SHARE of the requests are good, in virtual time."""
    config = EngineConfig(served_model_name=MODEL, num_gpu_blocks_override=KV_BLOCKS)
    best = 0.0
    rate = 0.5
    while rate <= 40:
        recs = simulate(config, _spec(rate, 120), faults=FaultState(slowdown=SLOWDOWN)).recorder.records
        if sum(r.good(TTFT_SLO, TPOT_SLO) for r in recs) >= GOOD_SHARE * len(recs):
            best = rate
        elif best:
            break
        rate += 0.5
    return best


def _spawn(cmd: list[str], pattern: str, what: str) -> tuple[subprocess.Popen[str], str]:
    """Start a process and wait for the line that names its URL (stdout and stderr together)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(pattern, line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise RuntimeError(f"{what} did not start: {' '.join(cmd)}")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _drain(proc: subprocess.Popen[str]) -> None:
    """Keep reading a child's output so that it never blocks on a full pipe."""
    import threading

    def read() -> None:
        assert proc.stdout is not None
        for _ in proc.stdout:
            pass

    threading.Thread(target=read, daemon=True).start()


def one_run(rate: float, admission: bool) -> list[RequestRecord]:
    sim, sim_url = _spawn(
        [sys.executable, "-m", "simulator.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--preset", PRESET,
         "--model", MODEL, "--num-gpu-blocks", str(KV_BLOCKS), "--slowdown", str(SLOWDOWN), "--seed", str(SEED)],
        r"on (http://\S+)", "the simulator",
    )
    _drain(sim)
    try:
        tap_cmd = [sys.executable, "-m", "exporter.tap", "--listen", "127.0.0.1:0", "--upstream", sim_url,
                   "--metrics-listen", "127.0.0.1:0", "--slo", str(ROOT / "slos" / "chat.yaml"), "--log-level", "info"]
        if admission:
            tap_cmd.append("--admission")
        tap, tap_url = _spawn(tap_cmd, r"event=tap_listening proxy=(\S+)", "the tap")
        _drain(tap)
        try:
            time.sleep(1.0)  # the admission poller's first readings
            return asyncio.run(run_load(tap_url, _spec(rate, ARRIVALS_S), timeout=CLIENT_TIMEOUT_S))
        finally:
            _stop(tap)
    finally:
        _stop(sim)


def _refused(r: RequestRecord) -> bool:
    return not r.ok and "429" in r.error


def figures(records: list[RequestRecord]) -> dict[str, float]:
    offered = len(records)
    good = sum(r.good(TTFT_SLO, TPOT_SLO) for r in records)
    refused = sum(_refused(r) for r in records)
    ttfts = sorted(r.ttft if r.ttft is not None else math.inf for r in records if not _refused(r))
    p99 = ttfts[min(len(ttfts) - 1, math.ceil(0.99 * len(ttfts)) - 1)] if ttfts else math.nan
    return {"offered": offered, "good": good, "refused": refused, "goodput_rps": good / ARRIVALS_S,
            "good_share": good / offered if offered else 0.0, "refused_share": refused / offered if offered else 0.0,
            "p99_ttft": p99, "admitted": offered - refused,
            "no_first_token": sum(1 for r in records if not _refused(r) and r.ttft is None)}


def _seconds(x: float) -> str:
    return f"> {CLIENT_TIMEOUT_S:g} s (no first token)" if math.isinf(x) else f"{x:.2f} s"


def run() -> list[Row]:
    cap = capacity()
    rate = OVERLOAD * cap
    with_gate = figures(one_run(rate, admission=True))
    without = figures(one_run(rate, admission=False))
    print(f"  capacity {cap} req/s; with {with_gate}; without {without}", file=sys.stderr)
    cmd = (f"python -m bench tap-admission (llmslo-sim serve --preset {PRESET} --num-gpu-blocks {KV_BLOCKS} "
           f"--slowdown {SLOWDOWN:g}; llmslo-exporter tap --slo slos/chat.yaml [--admission])")
    where = (f"capacity {cap:g} req/s within the objectives, offered {rate:g} req/s for {ARRIVALS_S:g} s "
             f"({with_gate['offered']} requests)")
    g1, g0 = with_gate["goodput_rps"], without["goodput_rps"]
    p1, p0 = with_gate["p99_ttft"], without["p99_ttft"]
    return [
        Row(SECTION, f"goodput, good req/s over all offered; {where} (good: {with_gate['good_share']:.0%} vs "
                     f"{without['good_share']:.0%} of offered)",
            f"{g1:.2f} req/s", f"{g0:.2f} req/s", f"{g1 / g0:.1f}x" if g0 else "inf (peer 0)", cmd),
        Row(SECTION, f"p99 TTFT of admitted requests ({with_gate['admitted']} vs {without['admitted']} admitted; "
                     f"{with_gate['no_first_token']} vs {without['no_first_token']} never got a first token)",
            _seconds(p1), _seconds(p0),
            f"{p0 / p1:.1f}x lower" if math.isfinite(p0) and p1 > 0 else ("lower" if math.isfinite(p1) else "-"), cmd),
        Row(SECTION, "share of offered requests refused (429 + Retry-After)",
            f"{with_gate['refused_share']:.0%}", f"{without['refused_share']:.0%}", "-", cmd),
    ]
