"""The tap's admission gate, no harm below capacity and help above it: goodput with and without `--admission`,
side by side, on the simulator in real time.

The engine is the simulator (`llmslo-sim serve`, Llama-3.1-8B on an H100, its KV cache cut to KV_BLOCKS
blocks of 16 tokens and every step SLOWDOWN times slower, so that a small load fills it and the streams stay
cheap for the shared CPUs), behind the tap (`python -m exporter.tap --slo slos/chat.yaml`, so requests are
judged by the interactive class: TTFT <= 0.5 s and TPOT <= 0.05 s). Each workload's capacity within those
objectives is derived first in virtual time on the same engine: the highest Poisson rate at which at least
95 % of the requests are good (the goodput SLO's objective). Every case then runs the same request stream
through two stacks at the same time (each its own simulator and tap; one with `--admission` at its defaults,
one without), so both see the same machine load:

- no harm: 0.5x and 0.9x capacity, Poisson and bursty (BURST requests at once, the bursts Poisson);
- an idle engine at 10x the old gate's per-poll cap (IDLE_RATE requests/s of max_tokens 1);
- prefill/KV overload: 2x capacity (Poisson);
- decode overload: short prompts and long outputs at 2x that workload's capacity;
- prefix-heavy no harm: prompts of ~PREFIX_PROMPT tokens, PREFIX_SHARE of each one common system prompt, at
  0.9x that workload's capacity (a prompt takes free KV only for its uncached part).

`python -m bench.bench_tap_admission WORDS` runs only the cases whose description contains WORDS and prints
their rows without writing BENCHMARKS.md (`python -m bench tap-admission` runs them all and writes it).

A client gives up on a request after CLIENT_TIMEOUT_S (as a user would; without it the backlog of the run
without admission would take minutes to drain). Reported per case: goodput (good requests per second of
arrivals, over all offered: a refused request is not good) and the share refused, with the gate's refusal
reasons from its /metrics.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import aiohttp

from bench.report import Row
from llmslo import conventions as C
from simulator.clock import VirtualClock
from simulator.config import EngineConfig
from simulator.engine import EngineCore, run_virtual
from simulator.faults import FaultState
from simulator.loadgen import fetch_base_model, send_one
from simulator.stats import RequestRecord
from simulator.tokens import render
from simulator.virtual import RunRecorder
from simulator.workload import LengthDist, WorkItem, WorkloadSpec, generate

ROOT = Path(__file__).resolve().parent.parent
SECTION = "Goodput tap: admission by objective, no harm below capacity (simulator, real time)"
PRESET = "llama3-8b-h100"
MODEL = "llama-3-8b-instruct"  # matched by slos/chat.yaml's interactive class (llama-3-8b*)
KV_BLOCKS = 600  # 9,600 KV tokens: about ten requests of p99 size
SLOWDOWN = 2.0
TTFT_SLO, TPOT_SLO = 0.5, 0.05
PROMPT = LengthDist(400, 0.3, 16, 1000)
OUTPUT = LengthDist(100, 0.3, 8, 300)
DECODE_PROMPT = LengthDist(40, 0.3, 8, 100)  # the decode-overload workload: short prompts, long outputs
DECODE_OUTPUT = LengthDist(400, 0.2, 200, 600)
IDLE_PROMPT = LengthDist(16, 0.0, 16, 16)
PREFIX_PROMPT = LengthDist(3000, 0.1, 2400, 3600)  # the prefix-heavy workload: a third of the cache per prompt ...
PREFIX_SHARE = 0.9  # ... of which this share is one common system prompt
OLD_PER_POLL_CAP = (4 + 1) / 0.25  # the old gate: --admission-max-queue 4 + 1 requests a 0.25 s poll, 20 req/s
IDLE_RATE = 10 * OLD_PER_POLL_CAP
IDLE_S = 5.0
ARRIVALS_S = 30.0
BURST = 4  # requests arriving together in the bursty cases
CLIENT_TIMEOUT_S = 15.0
GOOD_SHARE = 0.95  # capacity: the highest rate at which this share of requests is good
SEED = 3
TARGETS = "targets: refused <= 1% and goodput within 3% of no gate below capacity; nothing refused idle; >= 3x at 2x"

NOTES = {
    SECTION: (
        f"Simulator `{PRESET}` with --num-gpu-blocks {KV_BLOCKS} (9,600 KV tokens) and --slowdown {SLOWDOWN:g}, "
        f"prompts ~{PROMPT.median:.0f} tokens, outputs ~{OUTPUT.median:.0f} (decode overload: "
        f"~{DECODE_PROMPT.median:.0f} and ~{DECODE_OUTPUT.median:.0f}); served in real time behind the tap "
        f"(interactive class: TTFT <= {TTFT_SLO} s, TPOT <= {TPOT_SLO} s). Capacity = the highest rate at which "
        f"{GOOD_SHARE:.0%} of requests are good, found in virtual time on the same engine, workload and arrivals "
        f"(Poisson or bursty). Each row runs one request stream for {ARRIVALS_S:g} s "
        f"(idle: {IDLE_S:g} s) through two stacks at once, each its own simulator and tap: ours `--admission` at its "
        f"defaults, peer no admission (its simulator's /metrics read as often, so both do the same work). "
        f"Bursty: {BURST} requests at once, the bursts Poisson. Clients give up after "
        f"{CLIENT_TIMEOUT_S:g} s. Goodput counts good requests over all offered (refused ones are not good) per second "
        f"of arrivals. {TARGETS}; a row that misses its target says so."
    ),
}


@dataclass(frozen=True)
class Case:
    what: str
    items: tuple[WorkItem, ...]
    duration: float
    target: str  # "no_harm" | "idle" | "overload"


@dataclass(frozen=True)
class Outcome:
    offered: int
    good: int
    refused: int
    reasons: dict[str, float]

    @property
    def refused_share(self) -> float:
        return self.refused / self.offered if self.offered else 0.0


def _spec(rate: float, duration: float, prompt: LengthDist = PROMPT, output: LengthDist = OUTPUT,
          shared: float = 0.0) -> WorkloadSpec:
    # one system prompt for the prefix-heavy case only: the prefixes are drawn from the workload's random stream,
    # so another count would change every other case's requests
    spec = WorkloadSpec(rate=rate, duration=duration, prompt_len=prompt, output_len=output, seed=SEED)
    return replace(spec, shared_prefix=shared, num_prefixes=1) if shared else spec


def virtual_records(items: list[WorkItem]) -> list[RequestRecord]:
    """The items served by the same engine in virtual time (simulator.virtual.simulate, with the arrivals given)."""
    config = EngineConfig(served_model_name=MODEL, num_gpu_blocks_override=KV_BLOCKS)
    clock = VirtualClock()
    core = EngineCore(config, clock, None, FaultState(slowdown=SLOWDOWN))
    recorder = RunRecorder()
    core.observers.append(recorder)
    run_virtual(core, clock, ((i.arrival, core.new_request(list(i.prompt_token_ids), i.output_len, output_len=i.output_len))
                              for i in items))
    return recorder.records


def capacity(prompt: LengthDist = PROMPT, output: LengthDist = OUTPUT, burst: int = 1, shared: float = 0.0) -> float:
    """The highest rate (0.5 req/s steps) at which GOOD_SHARE of the requests are good, in virtual time, with
    arrivals in bursts of `burst`."""
    best = 0.0
    rate = 0.5
    while rate <= 40:
        recs = virtual_records(arrivals(generate(_spec(rate, 120, prompt, output, shared)), rate, burst))
        if sum(r.good(TTFT_SLO, TPOT_SLO) for r in recs) >= GOOD_SHARE * len(recs):
            best = rate
        elif best:
            break
        rate += 0.5
    return best


def arrivals(items: list[WorkItem], rate: float, burst: int) -> list[WorkItem]:
    """The same requests in bursts of `burst` arriving together, the bursts a Poisson process of rate / burst
    (burst 1: the items as they are, Poisson at `rate`)."""
    if burst == 1:
        return items
    rng = random.Random(SEED + 1)
    out: list[WorkItem] = []
    t = rng.expovariate(rate / burst)
    for i in range(0, len(items), burst):
        out += [replace(item, arrival=t) for item in items[i:i + burst]]
        t += rng.expovariate(rate / burst)
    return out


def _spawn(cmd: list[str], pattern: str, what: str) -> tuple[subprocess.Popen[str], re.Match[str]]:
    """Start a process, wait for the line that names its URL (stdout and stderr together), then keep reading
    its output so that it never blocks on a full pipe."""
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
            threading.Thread(target=lambda: [None for _ in proc.stdout or ()], daemon=True).start()
            return proc, m
    proc.kill()
    raise RuntimeError(f"{what} did not start: {' '.join(cmd)}")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def stack(admission: bool) -> Iterator[tuple[str, str]]:
    """A simulator behind a tap: the tap's proxy URL and its /metrics URL."""
    with ExitStack() as stop:
        sim, m = _spawn(
            [sys.executable, "-m", "simulator.cli", "serve", "--host", "127.0.0.1", "--port", "0", "--preset", PRESET,
             "--model", MODEL, "--num-gpu-blocks", str(KV_BLOCKS), "--slowdown", str(SLOWDOWN), "--seed", str(SEED)],
            r"on (http://\S+)", "the simulator")
        stop.callback(_stop, sim)
        cmd = [sys.executable, "-m", "exporter.tap", "--listen", "127.0.0.1:0", "--upstream", m.group(1),
               "--metrics-listen", "127.0.0.1:0", "--slo", str(ROOT / "slos" / "chat.yaml"), "--log-level", "info"]
        tap, t = _spawn(cmd + (["--admission"] if admission else []),
                        r"event=tap_listening proxy=(\S+) metrics=(\S+)", "the tap")
        stop.callback(_stop, tap)
        if not admission:  # the simulator renders its page as often as the gated one's does: the same work
            done = threading.Event()
            threading.Thread(target=_poll, args=(m.group(1) + "/metrics", done), daemon=True).start()
            stop.callback(done.set)
        yield t.group(1), t.group(2)


def _poll(url: str, done: threading.Event) -> None:
    while not done.wait(0.25):
        try:
            urllib.request.urlopen(url, timeout=2).read()
        except OSError:
            pass


def refusal_reasons(metrics_url: str) -> dict[str, float]:
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    found = re.findall(rf'^{C.TAP_REFUSALS.name}{{reason="([a-z_]+)"}} (\S+)$', text, re.M)
    return {reason: float(n) for reason, n in found if reason in C.REFUSED_ADMISSION_REASONS and float(n)}


async def send_all(url: str, items: tuple[WorkItem, ...], client_timeout_s: float = CLIENT_TIMEOUT_S,
                   render_prompt: Callable[[list[int]], str] = render) -> list[RequestRecord]:
    """The items on their schedule, open loop (as simulator.loadgen.run_load, with the arrivals given); each
    client gives up after `client_timeout_s`; `render_prompt` writes the ids in the engine's vocabulary."""
    timeout = aiohttp.ClientTimeout(total=client_timeout_s)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        model, _ = await fetch_base_model(session, url)
        t0 = time.perf_counter()

        async def launch(item: WorkItem) -> RequestRecord:
            await asyncio.sleep(max(0.0, item.arrival - (time.perf_counter() - t0)))
            return await send_one(session, url, item, model, True, t0, render_prompt)

        return list(await asyncio.gather(*(launch(item) for item in items)))


def side_by_side(items: tuple[WorkItem, ...]) -> tuple[Outcome, Outcome]:
    """The same stream through a gated and an ungated stack at the same time."""
    with stack(True) as (gated, gated_metrics), stack(False) as (plain, _):
        time.sleep(1.0)  # the admission poller's first readings

        async def both() -> tuple[list[RequestRecord], list[RequestRecord]]:
            a, b = await asyncio.gather(send_all(gated, items), send_all(plain, items))
            return a, b

        with_gate, without = asyncio.run(both())
        reasons = refusal_reasons(gated_metrics)
    return outcome(with_gate, reasons), outcome(without, {})


def outcome(records: list[RequestRecord], reasons: dict[str, float],
            objectives: tuple[float, float] = (TTFT_SLO, TPOT_SLO)) -> Outcome:
    """The records counted: offered, good within `objectives` (TTFT, TPOT), refused by the gate (429)."""
    return Outcome(len(records), sum(r.good(*objectives) for r in records),
                   sum(1 for r in records if not r.ok and "429" in r.error), reasons)


def _prefix_what(c: float) -> str:
    return (f"prefix-heavy: prompts ~{PREFIX_PROMPT.median:.0f} tokens, {PREFIX_SHARE:.0%} one system prompt, "
            f"0.9x its capacity ({0.9 * c:g} req/s), Poisson")


def _prefix_items(c: float) -> list[WorkItem]:
    return generate(_spec(0.9 * c, ARRIVALS_S, PREFIX_PROMPT, OUTPUT, PREFIX_SHARE))


def _no_harm_what(load: float, how: str, c: float) -> str:
    return f"{load:g}x capacity ({load * c:g} req/s), {how}"


def _no_harm_items(load: float, burst: int, c: float) -> list[WorkItem]:
    return arrivals(generate(_spec(load * c, ARRIVALS_S)), load * c, burst)


def cases(only: tuple[str, ...] = ()) -> tuple[list[Case], dict[str, float]]:
    """Every case, or those whose description contains one of `only`; a capacity is searched for (minutes of
    requests in virtual time) only when a chosen case needs it."""
    caps: dict[str, float] = {}

    def cap(name: str) -> float:
        if name not in caps:
            caps[name] = {"capacity": capacity, "burst_capacity": lambda: capacity(burst=BURST),
                          "decode_capacity": lambda: capacity(DECODE_PROMPT, DECODE_OUTPUT),
                          "prefix_capacity": lambda: capacity(PREFIX_PROMPT, OUTPUT, shared=PREFIX_SHARE)}[name]()
        return caps[name]

    # (description given the capacity, the capacity it needs, how to build its items, duration, target)
    plan: list[tuple[Callable[[float], str], str, Callable[[float], list[WorkItem]], float, str]] = []
    for load in (0.5, 0.9):
        for burst, name, how in ((1, "capacity", "Poisson"), (BURST, "burst_capacity", f"bursts of {BURST}")):
            plan.append((partial(_no_harm_what, load, how), name, partial(_no_harm_items, load, burst), ARRIVALS_S,
                         "no_harm"))
    plan.append((lambda _: f"idle engine, {IDLE_RATE:g} req/s of max_tokens 1 (10x the old gate's per-poll cap)", "",
                 lambda _: generate(_spec(IDLE_RATE, IDLE_S, IDLE_PROMPT, LengthDist(1, 0.0, 1, 1))), IDLE_S, "idle"))
    plan.append((lambda c: f"2x capacity ({2 * c:g} req/s), Poisson", "capacity",
                 lambda c: generate(_spec(2 * c, ARRIVALS_S)), ARRIVALS_S, "overload"))
    plan.append((lambda c: f"decode overload: prompts ~{DECODE_PROMPT.median:.0f}, outputs ~{DECODE_OUTPUT.median:.0f} "
                 f"tokens, 2x its capacity ({2 * c:g} req/s)", "decode_capacity",
                 lambda c: generate(_spec(2 * c, ARRIVALS_S, DECODE_PROMPT, DECODE_OUTPUT)), ARRIVALS_S, "overload"))
    plan.append((_prefix_what, "prefix_capacity", _prefix_items, ARRIVALS_S, "no_harm"))
    out = []
    for describe, name, build, duration, target in plan:
        # the words are matched against the description with the capacity left out (it is not known yet)
        if only and not any(w in describe(math.nan) for w in only):
            continue
        c = cap(name) if name else 0.0
        out.append(Case(describe(c), tuple(build(c)), duration, target))
    return out, caps


def verdict(case: Case, ours: Outcome, peer: Outcome, ratio: float) -> str:
    if case.target == "no_harm":
        ok = ours.refused_share <= 0.01 and ratio >= 0.97
        return "" if ok else " (target missed: refused <= 1% and goodput within 3%)"
    if case.target == "idle":
        return "" if ours.refused == 0 else " (target missed: nothing refused)"
    return "" if ratio >= 3 else " (target missed: goodput >= 3x no gate)"


def goodput_row(section: str, what: str, case: Case, ours: Outcome, peer: Outcome, seconds: float, cmd: str, *,
                peer_refused: bool = True, say_met: bool = False) -> Row:
    """One case's row: goodput with the gate (ours) and without (peer) over `seconds` of arrivals, the share the
    gate refused and why (and the peer's share, where it may refuse too), and the target's verdict."""
    g1, g0 = ours.good / seconds, peer.good / seconds
    ratio = g1 / g0 if g0 else math.inf
    reasons = ", ".join(f"{k} {v:g}" for k, v in sorted(ours.reasons.items())) or "none"
    said = verdict(case, ours, peer, ratio)
    if say_met and not said:
        said = " (target met: refused <= 1% and goodput within 3%)" if case.target == "no_harm" else \
            " (target met: goodput >= 3x)"
    refused = f"{ours.refused_share:.1%}" + (f" vs {peer.refused_share:.1%}" if peer_refused else "")
    return Row(section, f"{what}: goodput (good req/s over all offered); refused {refused} (reasons: {reasons}){said}",
               f"{g1:.2f} req/s", f"{g0:.2f} req/s", f"{ratio:.2f}x" if g0 else "inf (peer 0)", cmd)


def run(only: tuple[str, ...] = ()) -> list[Row]:
    """Every case side by side (`only`: those whose description contains one of the words)."""
    todo, caps = cases(only)
    cmd = (f"python -m bench tap-admission (llmslo-sim serve --preset {PRESET} --num-gpu-blocks {KV_BLOCKS} "
           f"--slowdown {SLOWDOWN:g}; llmslo-exporter tap --slo slos/chat.yaml [--admission])")
    rows = []
    print(f"  capacity {caps}", file=sys.stderr)
    for case in todo:
        ours, peer = side_by_side(case.items)
        print(f"  {case.what}: ours {ours}, peer {peer}", file=sys.stderr)
        rows.append(goodput_row(SECTION, f"{case.what}, {ours.offered} requests", case, ours, peer, case.duration,
                                cmd))
    return rows


if __name__ == "__main__":
    for row in run(tuple(sys.argv[1:])):
        print(f"{row.what}: ours {row.ours}, peer {row.peer}, ratio {row.ratio}")
