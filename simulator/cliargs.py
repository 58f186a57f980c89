"""Command-line flags shared by `llmslo-sim serve|virtual|plan` and `llmslo-load`, and what they build.

Every number is parsed by its `Bound` in `simulator/limits.py`: out of range, argparse exits 2 naming the flag,
the range and the reason, and `--help` shows the same range."""

from __future__ import annotations

import argparse
import dataclasses
import math

from simulator import limits as L
from simulator.config import BATCHING_MODES, EngineConfig
from simulator.faults import ERROR_MODES, FaultState
from simulator.presets import DEFAULT_DEPLOYMENT, DEPLOYMENTS, get_deployment
from simulator.workload import DATASETS, LengthDist, WorkloadSpec, parse_lora_mix

# Lengths of the synthetic workload when no flag says otherwise: a chat-like prompt and answer.
PROMPT_LEN, PROMPT_SIGMA, OUTPUT_LEN, OUTPUT_SIGMA = 500, 0.5, 150, 0.6


def add_engine_arguments(p: argparse.ArgumentParser, multi_preset: bool = False) -> None:
    g = p.add_argument_group("engine")
    if multi_preset:
        g.add_argument("--preset", action="append", choices=sorted(DEPLOYMENTS),
                       help=f"model + GPU pair; repeat to compare several (default {DEFAULT_DEPLOYMENT})")
    else:
        g.add_argument("--preset", default=DEFAULT_DEPLOYMENT, choices=sorted(DEPLOYMENTS),
                       help="model + GPU pair (default %(default)s); `llmslo-sim presets` lists them")
    g.add_argument("--model", default="", help="served model name (default: the preset model's Hugging Face id)")
    g.add_argument("--lora", default="", help="comma-separated LoRA adapter names served besides the base model")
    g.add_argument("--max-loras", type=L.MAX_LORAS, default=1, help=L.MAX_LORAS.help("LoRA adapter slots (default %(default)s)"))
    g.add_argument("--tp", type=L.TP, default=0, help=L.TP.help("tensor-parallel GPUs (default: the preset's)"))
    g.add_argument("--gpu-memory-utilization", type=L.GPU_MEMORY_UTILIZATION, default=0.0,
                   help=L.GPU_MEMORY_UTILIZATION.help("default: the preset's (0.9)"))
    g.add_argument("--block-size", type=L.BLOCK_SIZE, default=16, help=L.BLOCK_SIZE.help("default %(default)s"))
    g.add_argument("--num-gpu-blocks", type=L.NUM_GPU_BLOCKS, default=0,
                   help=L.NUM_GPU_BLOCKS.help("override the KV blocks derived from the preset"))
    g.add_argument("--max-num-seqs", type=L.MAX_NUM_SEQS, default=256, help=L.MAX_NUM_SEQS.help("default %(default)s"))
    g.add_argument("--max-num-batched-tokens", type=L.MAX_NUM_BATCHED_TOKENS, default=2048,
                   help=L.MAX_NUM_BATCHED_TOKENS.help("default %(default)s"))
    g.add_argument("--max-model-len", type=L.MAX_MODEL_LEN, default=0,
                   help=L.MAX_MODEL_LEN.help("default: the model's context length"))
    g.add_argument("--no-chunked-prefill", action="store_true",
                   help="vLLM V0's default: whole prompts in prefill-only steps, before any decode")
    g.add_argument("--num-scheduler-steps", type=L.NUM_SCHEDULER_STEPS, default=1,
                   help=L.NUM_SCHEDULER_STEPS.help("vLLM V0's multi-step scheduling: new requests join only every "
                                                   "N steps (default 1)"))
    g.add_argument("--async-output-proc", action="store_true",
                   help="vLLM V0's (0.6.x) asynchronous output processing: a step's tokens reach clients when the "
                        "next step ends")
    g.add_argument("--no-prefix-caching", action="store_true")
    g.add_argument("--batching", choices=BATCHING_MODES, default="continuous")
    g.add_argument("--output-len-median", type=L.OUTPUT_LEN_MEDIAN, default=150,
                   help=L.OUTPUT_LEN_MEDIAN.help("natural output length (lognormal median) of requests without "
                                                 "ignore_eos"))
    g.add_argument("--seed", type=L.SEED, default=0,
                   help=L.SEED.help("seeds the engine's draws and, in virtual mode and plan, the workload"))


def add_fault_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("faults (also settable at run time: POST /admin/faults)")
    g.add_argument("--slowdown", type=L.SLOWDOWN, default=1.0, help=L.SLOWDOWN.help("multiply every step's time"))
    g.add_argument("--error-rate", type=L.ERROR_RATE, default=0.0, help=L.ERROR_RATE.help("share of requests that fail"))
    g.add_argument("--error-mode", choices=ERROR_MODES, default="http500")
    g.add_argument("--stall", type=L.STALL, default=0.0,
                   help=L.STALL.help("stall the engine this many seconds at start (inf: until cleared)"))
    g.add_argument("--kv-capacity-factor", type=L.KV_CAPACITY_FACTOR, default=1.0,
                   help=L.KV_CAPACITY_FACTOR.help("share of KV blocks usable"))


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--rate", type=L.RATE, required=True,
                   help=L.RATE.help("mean arrivals per second (Poisson); inf with --num-requests: all at t=0 (vLLM's "
                                    "--request-rate inf)"))
    g.add_argument("--duration", type=L.DURATION, default=None,
                   help=L.DURATION.help("seconds of arrivals (or give --num-requests)"))
    g.add_argument("--num-requests", "--num-prompts", dest="num_requests", type=L.NUM_REQUESTS, default=0,
                   help=L.NUM_REQUESTS.help("exactly this many requests instead of a duration (vLLM's --num-prompts)"))
    add_workload_shape_arguments(g)
    g.add_argument("--workload-seed", type=L.SEED, default=None,
                   help=L.SEED.help("seeds the workload (default: --seed, or 0 where there is none)"))


def add_workload_shape_arguments(g: argparse._ActionsContainer) -> None:
    """Lengths, shared prefixes and LoRA mix: everything about the workload but its rate and duration."""
    g.add_argument("--dataset", choices=("synthetic", *DATASETS), default="synthetic",
                   help="sharegpt: ShareGPT-like lengths with vLLM's benchmark filter (prompt <= 1024, prompt + "
                        "output <= 2048; means ~202 / ~179 tokens) instead of the length flags below")
    g.add_argument("--prompt-len", type=L.PROMPT_LEN, default=None,
                   help=L.PROMPT_LEN.help(f"median prompt tokens (lognormal; {PROMPT_LEN})"))
    g.add_argument("--prompt-sigma", type=L.SIGMA, default=None,
                   help=L.SIGMA.help(f"0: every prompt the median ({PROMPT_SIGMA})"))
    g.add_argument("--output-len", type=L.OUTPUT_LEN, default=None,
                   help=L.OUTPUT_LEN.help(f"median output tokens (lognormal; {OUTPUT_LEN})"))
    g.add_argument("--output-sigma", type=L.SIGMA, default=None,
                   help=L.SIGMA.help(f"0: every output the median ({OUTPUT_SIGMA})"))
    g.add_argument("--shared-prefix", type=L.SHARED_PREFIX, default=0.0,
                   help=L.SHARED_PREFIX.help("fraction of each prompt from a shared system prompt"))
    g.add_argument("--num-prefixes", type=L.NUM_PREFIXES, default=4,
                   help=L.NUM_PREFIXES.help("distinct shared system prompts (default %(default)s)"))
    g.add_argument("--lora-mix", default="", help="ADAPTER=SHARE,... requests sent to LoRA adapters")


def add_slo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ttft", type=L.SLO_SECONDS, default=0.5,
                   help=L.SLO_SECONDS.help("goodput threshold on TTFT, seconds (default %(default)s)"))
    p.add_argument("--tpot", type=L.SLO_SECONDS, default=0.05,
                   help=L.SLO_SECONDS.help("goodput threshold on TPOT, seconds (default %(default)s)"))
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def engine_config(args: argparse.Namespace, lora_fallback: tuple[str, ...] = ()) -> EngineConfig:
    deployment = get_deployment(args.preset)
    changes = {}
    if args.tp:
        changes["tp"] = args.tp
    if args.gpu_memory_utilization:
        changes["gpu_memory_utilization"] = args.gpu_memory_utilization
    if changes:
        deployment = dataclasses.replace(deployment, **changes)
    loras = tuple(n.strip() for n in args.lora.split(",") if n.strip()) or lora_fallback
    return EngineConfig(
        deployment=deployment,
        served_model_name=args.model,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        chunked_prefill=not args.no_chunked_prefill,
        num_scheduler_steps=args.num_scheduler_steps,
        async_output_proc=args.async_output_proc,
        max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching,
        num_gpu_blocks_override=args.num_gpu_blocks,
        batching=args.batching,
        lora_adapters=loras,
        max_loras=args.max_loras,
        output_len_median=args.output_len_median,
        seed=args.seed,
    )


def fault_state(args: argparse.Namespace, now: float) -> FaultState:
    """The start-up faults; `now` is the engine clock's time (a stall is measured from it)."""
    faults = FaultState()
    patch: dict = {
        "slowdown": args.slowdown,
        "error_rate": args.error_rate,
        "error_mode": args.error_mode,
        "kv_capacity_factor": args.kv_capacity_factor,
    }
    if args.stall:
        patch["stall"] = True if math.isinf(args.stall) else args.stall
    faults.update(patch, now)  # FaultError is a ValueError naming the field
    return faults


def workload_spec(args: argparse.Namespace) -> WorkloadSpec:
    num_requests = getattr(args, "num_requests", 0) or 0
    if args.duration is None and not num_requests:
        raise ValueError("workload: give --duration (seconds of arrivals) or --num-requests")
    if args.duration is not None and num_requests:
        raise ValueError("workload: --duration and --num-requests both say when arrivals stop; give one")
    lengths = (args.prompt_len, args.prompt_sigma, args.output_len, args.output_sigma)
    dataset = getattr(args, "dataset", "synthetic")
    if dataset != "synthetic":
        if any(v is not None for v in lengths):
            raise ValueError(f"workload: --dataset {dataset} sets the lengths; drop --prompt-len, --prompt-sigma, "
                             "--output-len and --output-sigma (or use --dataset synthetic)")
        d = DATASETS[dataset]
        prompt, output, max_prompt, max_total = d.prompt_len, d.output_len, d.max_prompt_len, d.max_total_len
    else:
        p_len, p_sigma, o_len, o_sigma = (default if v is None else v for v, default in
                                          zip(lengths, (PROMPT_LEN, PROMPT_SIGMA, OUTPUT_LEN, OUTPUT_SIGMA), strict=True))
        if p_len < 1 or o_len < 1 or p_sigma < 0 or o_sigma < 0:
            raise ValueError("workload: --prompt-len and --output-len must be >= 1, the sigmas >= 0")
        prompt = LengthDist(p_len, p_sigma, 1, int(max(p_len * 8, 16)))
        output = LengthDist(o_len, o_sigma, 1, int(max(o_len * 10, 16)))
        max_prompt = max_total = 0
    return WorkloadSpec(
        rate=args.rate,
        duration=args.duration if args.duration is not None else 1.0,
        num_requests=num_requests,
        prompt_len=prompt,
        output_len=output,
        max_prompt_len=max_prompt,
        max_total_len=max_total,
        shared_prefix=args.shared_prefix,
        num_prefixes=args.num_prefixes,
        lora_mix=parse_lora_mix(args.lora_mix),
        seed=workload_seed(args),
    )


def workload_seed(args: argparse.Namespace) -> int:
    """--workload-seed when given, else --seed (virtual mode's one seed), else 0 (llmslo-load has no --seed)."""
    if getattr(args, "workload_seed", None) is not None:
        return args.workload_seed
    return getattr(args, "seed", 0) or 0


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace | int:
    """The parsed flags, or the exit status when argparse ended the run: 2 for a bad flag (it printed which), 0 for --help."""
    try:
        return parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
