"""`llmslo-sim`: serve a simulated engine over HTTP, run a workload in virtual time, or list the presets."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import signal
import sys

from llmslo.files import write_atomic
from simulator import cliargs, plan
from simulator import limits as L
from simulator.admission import QueueLimits
from simulator.api import SimulatorServer, start
from simulator.clock import RealClock
from simulator.costmodel import CostModel, CostParams
from simulator.presets import DEFAULT_DEPLOYMENT, DEPLOYMENTS
from simulator.progress import Progress
from simulator.stats import render_text
from simulator.virtual import simulate


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmslo-sim", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="an OpenAI-compatible server with vLLM's /metrics")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=L.PORT, default=8000,
                       help=L.PORT.help("0: let the OS pick (the chosen port is printed)"))
    serve.add_argument("--max-num-queued-reqs", type=L.MAX_NUM_QUEUED_REQS, default=L.DEFAULT_MAX_NUM_QUEUED_REQS,
                       help=L.MAX_NUM_QUEUED_REQS.help("as vLLM's, answered 503 with Retry-After (default %(default)s)"))
    serve.add_argument("--max-num-queued-tokens", type=L.MAX_NUM_QUEUED_TOKENS, default=L.DEFAULT_MAX_NUM_QUEUED_TOKENS,
                       help=L.MAX_NUM_QUEUED_TOKENS.help("as vLLM's (default %(default)s)"))
    cliargs.add_engine_arguments(serve)
    cliargs.add_fault_arguments(serve)

    virtual = sub.add_parser("virtual", help="run a workload in simulated time and print a summary")
    cliargs.add_engine_arguments(virtual)
    cliargs.add_fault_arguments(virtual)
    cliargs.add_workload_arguments(virtual)
    cliargs.add_slo_arguments(virtual)
    virtual.add_argument("--metrics-out", default="", help="also write the run's final vLLM /metrics page here")
    virtual.add_argument("--offline", action="store_true",
                         help="no API server: requests reach the engine at once, as in vLLM's offline benchmark "
                              "(LLM.generate); without it each pays the frontend's latency")

    planner = sub.add_parser("plan", help="the highest arrival rate per replica that meets an SLO file's goodput "
                          "objective, and the replicas a target rate needs (docs/capacity.md)")
    planner.add_argument("--slo", action="append", required=True,
                      help="SLO file or directory with an llmslo/goodput SLO (repeatable), e.g. slos/chat.yaml")
    planner.add_argument("--class", dest="slo_class", default="",
                      help="goodput class (slo_class) to plan for; default: the only one in the files")
    planner.add_argument("--rate", type=L.TARGET_RATE, default=None,
                         help=L.TARGET_RATE.help("target arrivals per second for the whole pool: also print the "
                                                 "replicas it needs"))
    planner.add_argument("--duration", type=L.PLAN_DURATION, default=120.0,
                         help=L.PLAN_DURATION.help("virtual seconds of arrivals per probe (default %(default)s)"))
    planner.add_argument("--objective", type=L.OBJECTIVE, default=None,
                         help=L.OBJECTIVE.help("override the SLO's goodput objective, percent (e.g. 99)"))
    planner.add_argument("--start-rate", type=L.START_RATE, default=1.0,
                         help=L.START_RATE.help("first rate probed (default %(default)s)"))
    planner.add_argument("--tolerance", type=L.TOLERANCE, default=0.02,
                         help=L.TOLERANCE.help("stop when the passing and failing rates are this close, relative "
                                               "(default %(default)s)"))
    planner.add_argument("--seeds", type=L.SEEDS, default=3,
                         help=L.SEEDS.help("workload seeds (--seed, --seed+1, ...): the answer is the highest rate "
                                           "that meets the objective on every one (default %(default)s)"))
    planner.add_argument("--json", action="store_true", help="print the results as JSON")
    cliargs.add_engine_arguments(planner, multi_preset=True)
    cliargs.add_fault_arguments(planner)
    cliargs.add_workload_shape_arguments(planner.add_argument_group("workload (--seed and --seeds seed it)"))

    sub.add_parser("presets", help="list the model + GPU presets with their KV capacity and speed")
    return p


async def _serve(args: argparse.Namespace) -> int:
    config = cliargs.engine_config(args)
    server = SimulatorServer(config, faults=cliargs.fault_state(args, RealClock().now()),
                             queue_limits=QueueLimits(args.max_num_queued_reqs, args.max_num_queued_tokens))
    runner, url = await start(server, args.host, args.port)
    print(f"llmslo-sim: serving {config.model_name} ({config.deployment.name}, {config.num_gpu_blocks} KV blocks) "
          f"on {url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0


def _virtual(args: argparse.Namespace) -> int:
    spec = cliargs.workload_spec(args)
    if not spec.num_requests and spec.rate * spec.duration < 1:
        raise ValueError(f"workload: --rate {spec.rate:g} x --duration {spec.duration:g} s expects less than one "
                         "request; raise one of them")
    config = cliargs.engine_config(args, lora_fallback=tuple(name for name, _ in spec.lora_mix))
    base = config.deployment.cost_params or CostParams()
    params = dataclasses.replace(base, frontend_latency_s=0.0) if args.offline else None
    run = simulate(config, spec, ttft_slo=args.ttft, tpot_slo=args.tpot, faults=cliargs.fault_state(args, 0.0),
                   metrics=bool(args.metrics_out), cost_params=params)
    if run.metrics is not None:
        write_atomic(args.metrics_out, run.metrics.render().decode())
    print(json.dumps(run.summary, indent=2) if args.json else render_text(run.summary))
    return 0


def _plan(args: argparse.Namespace) -> int:
    cls = plan.load_goodput_class(args.slo, args.slo_class)
    if args.objective is not None:
        cls = dataclasses.replace(cls, objective=args.objective)
    spec = cliargs.workload_spec(_with(args, rate=1.0, duration=args.duration, workload_seed=args.seed))
    seeds = list(range(args.seed, args.seed + args.seeds))
    if seeds[-1] > L.SEED.high:
        raise ValueError(f"--seed {args.seed} with --seeds {args.seeds} runs past the highest seed, {L.SEED.high}")
    presets = args.preset or [DEFAULT_DEPLOYMENT]
    plan.check_work(spec, args.start_rate, args.tolerance, len(seeds), len(presets))
    progress = Progress("llmslo-sim plan")
    probe_start = [progress.clock()]

    def told(preset: str, p: plan.Probe) -> None:
        probe_start[0] = progress.clock()
        progress.say(f"{preset} seed {p.seed}: {p.rate:.2f} req/s {'meets' if p.passed else 'misses'} the "
                     f"objective ({p.attainment * 100:.1f}% of {p.requests} good)")

    def running(preset: str, seed: int, rate: float, finished: int, expected: int) -> None:
        per_s = finished / max(progress.clock() - probe_start[0], 1e-9)
        progress.say(f"{preset} seed {seed}: probing {rate:.2f} req/s, {finished:,} of ~{expected:,} requests "
                     f"simulated, ~{max(expected - finished, 0) / per_s:.0f} s left in this probe", step=False)

    results = []
    for preset in presets:
        preset_args = _with(args, preset=preset)
        config = cliargs.engine_config(preset_args, lora_fallback=tuple(name for name, _ in spec.lora_mix))
        cliargs.fault_state(preset_args, 0.0)  # refuse bad fault flags before the first probe
        results.append(plan.find_max_rate_all_seeds(
            config, spec, cls, seeds, start_rate=args.start_rate, tolerance=args.tolerance,
            faults=functools.partial(cliargs.fault_state, preset_args, 0.0), on_probe=told, on_running=running))
    if args.json:
        print(json.dumps({
            "slo_class": dataclasses.asdict(cls),
            "workload": {"duration_s": spec.duration, "prompt_len_median": spec.prompt_len.median,
                         "output_len_median": spec.output_len.median, "shared_prefix": spec.shared_prefix,
                         "seed": spec.seed, "seeds": seeds},
            "assumption": "replicas = ceil(rate / max_rate_per_replica): load spread evenly, replicas independent",
            "results": [plan.result_dict(r, args.rate) for r in results],
        }, indent=2))
    else:
        objectives = " and ".join(f"{k} <= {v:g} s" for k, v in (("TTFT", cls.ttft), ("TPOT", cls.tpot)) if v)
        header = (f"class {cls.name} ({cls.origin}): {objectives}, objective {cls.objective:g}% good\n"
                  f"workload: Poisson, prompt median {spec.prompt_len.median:g} tok, output median "
                  f"{spec.output_len.median:g} tok, {spec.duration:g} s virtual per probe, "
                  f"seeds {', '.join(map(str, seeds))}; one replica per probe\n"
                  f"max req/s: the highest rate found that meets the objective on every seed; attain.: the worst "
                  "seed's; per-seed max: the spread of each seed's own highest rate")
        print(plan.render_table(results, args.rate, header))
        if args.rate is not None:
            print("replicas = ceil(rate / max req/s): assumes the load spreads evenly over independent replicas; "
                  "add a safety margin (docs/capacity.md)")
    return 0


def _with(args: argparse.Namespace, **changes: object) -> argparse.Namespace:
    return argparse.Namespace(**(vars(args) | changes))


def _presets() -> int:
    print(f"{'preset':<20} {'model':<36} {'gpu':<11} tp {'kv blocks':>9} {'kv tokens':>10} "
          f"{'decode@1':>9} {'decode@64':>10} {'prefill 500':>11}")
    for name, d in DEPLOYMENTS.items():
        cost = CostModel(d)
        blocks = d.num_gpu_blocks(16)
        print(f"{name:<20} {d.model.name:<36} {d.gpu.name:<11} {d.tp:>2} {blocks:>9} {blocks * 16:>10} "
              f"{cost.decode_step_time(1, 600) * 1e3:>7.1f}ms {cost.decode_step_time(64, 600) * 1e3:>8.1f}ms "
              f"{cost.prefill_step_time(500) * 1e3:>9.1f}ms")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = cliargs.parse(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        if args.command == "serve":
            return asyncio.run(_serve(args))
        if args.command == "virtual":
            return _virtual(args)
        if args.command == "plan":
            return _plan(args)
        return _presets()
    except ValueError as e:
        print(f"llmslo-sim: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
