"""The simulator against published vLLM measurements: each setting as one `llmslo-sim virtual` command.

Rows come from ../shared/peers/vllm-perf/PROVENANCE.md (the vLLM v0.6.0 blog's figures, Vidur's A100 profile;
their numbers keep the file's row ids) and from vLLM's own performance CI (buildkite build 9515, H200) and a
published A100-40GB sweep (ids starting with x). Each row runs twice on identical requests: on today's
simulator through the CLI, and on the simulator at BEFORE_COMMIT (the cost model before calibration)
through bench/sim_fidelity_worker.py, so the error is stated before and after.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from simulator import cli, cliargs
from simulator.costmodel import CostModel, CostParams
from simulator.presets import get_deployment
from simulator.virtual import simulate
from simulator.workload import generate

ROOT = Path(__file__).resolve().parents[1]
BEFORE_COMMIT = "ed3bf19"  # the last commit with the uncalibrated cost model
BLOG = "vLLM v0.6.0 blog"
# The blog's runs are vLLM's nightly benchmark suite (.buildkite/nightly-benchmarks/tests/nightly-tests.json, linked
# from the blog's reproduction issue vllm-project/vllm#8176): 500 prompts per QPS setting, and the vLLM server
# started with num_scheduler_steps 10, max_num_seqs 512 (not the default 256) and gpu_memory_utilization 0.9.
BLOG_N = "500"
# vLLM 0.6.0's V0 scheduler as the blog ran it: no chunked prefill (whole prompts, up to max(max_model_len, 2048)
# tokens per prompt step), multi-step scheduling with 10 steps per block, and 512 seats. The seats decide TTFT
# past saturation: V0 admits prompts before decoding, so with 512 seats all 500 prompts get in and the load shows
# as slower decode steps; with 256 the rest queue behind finishing sequences.
# vLLM 0.6.0 also processed a step's outputs while the next step ran (async output processing, on by default; the
# blog: "performing the processing of the n-th step output while executing the n+1-th step"), so tokens reach the
# client one step late.
V0_BUDGET = ("--no-chunked-prefill", "--max-num-batched-tokens", "8192", "--num-scheduler-steps", "10",
             "--max-num-seqs", "512", "--gpu-memory-utilization", "0.9", "--async-output-proc")
WORKLOADS = {
    "ShareGPT": ("--dataset", "sharegpt"),
    "prefill-heavy 462/16": ("--prompt-len", "462", "--prompt-sigma", "0", "--output-len", "16", "--output-sigma", "0"),
    "decode-heavy 462/256": ("--prompt-len", "462", "--prompt-sigma", "0", "--output-len", "256", "--output-sigma", "0"),
}
PRESETS = {"8B 1xH100": "llama3-8b-h100", "8B 1xA100": "llama3-8b-a100", "70B 4xH100 TP4": "llama3-70b-h100x4"}

# Which target a row counts toward: throughput (median <= 10 %, every row <= 20 %), light-load TPOT (median
# <= 10 %), TTFT near saturation (within 2x), or none (reported only).
THROUGHPUT, LIGHT_TPOT, SAT_TTFT, OTHER = "throughput", "light-load TPOT", "TTFT near saturation", "other"


@dataclass(frozen=True)
class Case:
    id: str
    source: str
    setting: str
    metric: str  # throughput_rps | tpot_ms | ttft_ms | e2e_ms | linear_ms
    published: float
    target: str
    argv: tuple[str, ...] = ()  # llmslo-sim virtual arguments; empty for kernel rows
    preset: str = ""  # kernel rows: the deployment whose linear operators are timed
    tokens: int = 0  # kernel rows: tokens through the linear operators


def _blog(id_: int, hw: str, workload: str, rate: str, metric: str, value: float, target: str) -> Case:
    argv = ("--preset", PRESETS[hw], "--rate", rate, "--num-requests", BLOG_N, *V0_BUDGET, *WORKLOADS[workload])
    return Case(str(id_), BLOG, f"{hw}, {workload}, QPS {rate}", metric, value, target, argv)


def _blog_rows() -> list[Case]:
    """The blog's runs for each hardware in turn, numbered on from 1 (PROVENANCE.md rows 1-32)."""
    rows: list[Case] = []
    for hw, values in _BLOG_VALUES.items():
        runs = [run for run in _BLOG_RUNS if run[:3] not in _BLOG_MISSING.get(hw, ())]
        rows += [_blog(len(rows) + 1 + k, hw, w, r, m, v, g) for k, ((w, r, m, g), v) in
                 enumerate(zip(runs, values, strict=True))]
    return rows


def cases() -> list[Case]:
    rows = _blog_rows()
    vidur = "Vidur A100 profile"
    rows += [
        Case("43", vidur, "8B A100, 32 layers' linear ops, 1 token", "linear_ms", 9.8, OTHER, preset="llama3-8b-a100",
             tokens=1),
        Case("44", vidur, "8B A100, 32 layers' linear ops, 2048 tokens", "linear_ms", 146, OTHER,
             preset="llama3-8b-a100", tokens=2048),
    ]
    ci = "vLLM perf CI (buildkite 9515)"
    fixed = ("--prompt-len", "32", "--prompt-sigma", "0", "--output-len", "128", "--output-sigma", "0")
    rows += [
        Case("x1", ci, "8B 1xH200, batch 8, 32 in / 128 out, offline", "e2e_ms", 833.4, OTHER,
             ("--preset", "llama3-8b-h200", "--rate", "inf", "--num-requests", "8", "--offline", *fixed)),
        Case("x2", ci, "70B 4xH200 TP4, batch 8, 32 in / 128 out, offline", "e2e_ms", 2077.5, OTHER,
             ("--preset", "llama3-70b-h200x2", "--tp", "4", "--rate", "inf", "--num-requests", "8", "--offline",
              *fixed)),
        Case("x3", "A100-40GB sweep (johnmusgrave.com, vLLM 0.23)", "8B 1xA100-40GB, 1 request, 1024 in / 128 out",
             "tpot_ms", 1000 / 75, LIGHT_TPOT,
             ("--preset", "llama3-8b-a100-40gb", "--rate", "inf", "--num-requests", "1", "--prompt-len", "1024",
              "--prompt-sigma", "0", "--output-len", "128", "--output-sigma", "0")),
    ]
    return rows


# The blog's runs, in its order for every hardware: (workload, QPS, metric, target).
_BLOG_RUNS = (
    ("prefill-heavy 462/16", "inf", "throughput_rps", THROUGHPUT), ("decode-heavy 462/256", "inf", "throughput_rps", THROUGHPUT),
    ("ShareGPT", "inf", "throughput_rps", THROUGHPUT), ("ShareGPT", "2", "tpot_ms", LIGHT_TPOT),
    ("ShareGPT", "32", "tpot_ms", OTHER), ("ShareGPT", "32", "ttft_ms", SAT_TTFT),
    ("decode-heavy 462/256", "32", "ttft_ms", SAT_TTFT), ("prefill-heavy 462/16", "32", "ttft_ms", SAT_TTFT),
    ("ShareGPT", "inf", "ttft_ms", SAT_TTFT), ("decode-heavy 462/256", "inf", "ttft_ms", SAT_TTFT),
    ("prefill-heavy 462/16", "inf", "ttft_ms", SAT_TTFT),
)
# (workload, QPS, metric) of the runs a hardware's post does not publish.
_BLOG_MISSING = {"8B 1xH100": {("ShareGPT", "32", "ttft_ms")}}
# Published values in the order of each hardware's runs (PROVENANCE.md rows 1-32; H100 first, then A100, 70B).
_BLOG_VALUES = {
    "8B 1xH100": (59.0, 31.0, 36.8, 8.7, 14.0, 402, 282, 2599, 4746, 4843),
    "8B 1xA100": (28.5, 14.7, 19.0, 14.1, 42.6, 411, 1078, 919, 4714, 9341, 9253),
    "70B 4xH100 TP4": (25.2, 15.4, 17.3, 22.2, 58.1, 405, 1941, 1894, 4255, 10892, 10641),
}


def command(case: Case) -> str:
    if case.metric == "linear_ms":
        return f"CostModel(get_deployment({case.preset!r})).layers_linear_time({case.tokens})"
    return "llmslo-sim virtual " + " ".join(case.argv)


def _args(case: Case):
    return cli._parser().parse_args(["virtual", *case.argv])


def simulate_now(case: Case) -> float:
    """Today's simulator: the CLI's own path for the row's command."""
    if case.metric == "linear_ms":
        return CostModel(get_deployment(case.preset)).layers_linear_time(case.tokens) * 1e3
    args = _args(case)
    params = dataclasses.replace(CostParams(), frontend_latency_s=0.0) if args.offline else None
    run = simulate(cliargs.engine_config(args), cliargs.workload_spec(args), cost_params=params)
    s = run.summary
    return {"throughput_rps": s["throughput_rps"], "tpot_ms": s["tpot_s"]["mean"] * 1e3,
            "ttft_ms": s["ttft_s"]["mean"] * 1e3, "e2e_ms": s["e2e_s"]["mean"] * 1e3}[case.metric]


def _worker_case(case: Case) -> dict:
    if case.metric == "linear_ms":
        d = get_deployment(case.preset)
        return {"kind": "linear", "model": d.model.name, "gpu": d.gpu.name, "tp": d.tp, "tokens": case.tokens}
    args = _args(case)
    config = cliargs.engine_config(args)
    d = config.deployment
    items = [(it.arrival, len(it.prompt_token_ids), it.output_len)
             for it in generate(cliargs.workload_spec(args), config.model_len)]
    return {"kind": "run", "model": d.model.name, "gpu": d.gpu.name, "tp": d.tp, "offline": args.offline,
            "max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": config.max_num_batched_tokens,
            "items": items}


def simulate_before(all_cases: list[Case], commit: str = BEFORE_COMMIT) -> list[float]:
    """The same requests through the simulator package as it was at `commit`."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-sim-old-"))
    try:
        archive = subprocess.run(["git", "archive", commit, "simulator"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
        payload = json.dumps([_worker_case(c) for c in all_cases])
        out = subprocess.run([sys.executable, str(ROOT / "bench" / "sim_fidelity_worker.py")], input=payload,
                             capture_output=True, text=True, check=True, env={"PYTHONPATH": str(tmp)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results = json.loads(out.stdout)
    return [r[c.metric] for c, r in zip(all_cases, results, strict=True)]


@dataclass(frozen=True)
class Measured:
    case: Case
    before: float
    after: float

    def ratio(self, value: float) -> float:
        return value / self.case.published


def measure() -> list[Measured]:
    all_cases = cases()
    before = simulate_before(all_cases)
    return [Measured(c, b, simulate_now(c)) for c, b in zip(all_cases, before, strict=True)]


def abs_err(ratio: float) -> float:
    return abs(ratio - 1.0)


def target_summary(rows: list[Measured]) -> list[tuple[str, str, str, str]]:
    """(target, criterion, before, after) for each of the issue's targets."""
    def group(target: str) -> list[Measured]:
        return [m for m in rows if m.case.target == target]

    def med(ms: list[Measured], attr: str) -> float:
        return statistics.median(abs_err(m.ratio(getattr(m, attr))) for m in ms)

    def worst(ms: list[Measured], attr: str) -> float:
        return max(abs_err(m.ratio(getattr(m, attr))) for m in ms)

    def worst_factor(ms: list[Measured], attr: str) -> float:
        return max(max(r, 1 / r) for m in ms for r in (m.ratio(getattr(m, attr)),))

    def within_2x(ms: list[Measured], attr: str) -> str:
        return f"{sum(1 for m in ms if 0.5 <= m.ratio(getattr(m, attr)) <= 2.0)} of {len(ms)}"

    thr, tpot, ttft = group(THROUGHPUT), group(LIGHT_TPOT), group(SAT_TTFT)
    every = [m for m in rows]
    return [
        (f"throughput ({len(thr)} rows)", "median abs error <= 10 %",
         f"{med(thr, 'before'):.0%}", f"{med(thr, 'after'):.0%}"),
        (f"throughput ({len(thr)} rows)", "worst row within 20 %",
         f"{worst(thr, 'before'):.0%}", f"{worst(thr, 'after'):.0%}"),
        (f"light-load TPOT ({len(tpot)} rows)", "median abs error <= 10 %",
         f"{med(tpot, 'before'):.0%}", f"{med(tpot, 'after'):.0%}"),
        (f"TTFT near saturation ({len(ttft)} rows)", "worst factor within 2x",
         f"{worst_factor(ttft, 'before'):.2f}x", f"{worst_factor(ttft, 'after'):.2f}x"),
        (f"TTFT near saturation ({len(ttft)} rows)", "rows within 2x", within_2x(ttft, "before"),
         within_2x(ttft, "after")),
        (f"all rows ({len(every)})", "median abs error (reported)",
         f"{med(every, 'before'):.0%}", f"{med(every, 'after'):.0%}"),
    ]


def fmt(metric: str, value: float) -> str:
    unit = {"throughput_rps": "req/s", "tpot_ms": "ms", "ttft_ms": "ms", "e2e_ms": "ms", "linear_ms": "ms"}[metric]
    return f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"


METRIC_NAMES = {"throughput_rps": "throughput", "tpot_ms": "mean TPOT", "ttft_ms": "mean TTFT",
                "e2e_ms": "mean E2E", "linear_ms": "linear ops"}


def markdown_table(rows: list[Measured]) -> str:
    lines = ["| # | source | setting | metric | published | simulated | ratio | before (ratio) |",
             "|---|---|---|---|---|---|---|---|"]
    for m in rows:
        c = m.case
        lines.append(f"| {c.id} | {c.source} | {c.setting} | {METRIC_NAMES[c.metric]} | {fmt(c.metric, c.published)} "
                     f"| {fmt(c.metric, m.after)} | {m.ratio(m.after):.2f} | {fmt(c.metric, m.before)} "
                     f"({m.ratio(m.before):.2f}) |")
    lines += ["", "| target | criterion | before | after |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in target_summary(rows)]
    return "\n".join(lines) + "\n"
