"""`llmslo-sim`: serve a simulated engine over HTTP, run a workload in virtual time, or list the presets."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from simulator import cliargs
from simulator.api import SimulatorServer, start
from simulator.clock import RealClock
from simulator.costmodel import CostModel
from simulator.presets import DEPLOYMENTS
from simulator.stats import render_text
from simulator.virtual import simulate
from llmslo.files import write_atomic


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmslo-sim", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="an OpenAI-compatible server with vLLM's /metrics")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000, help="0: let the OS pick (the chosen port is printed)")
    cliargs.add_engine_arguments(serve)
    cliargs.add_fault_arguments(serve)

    virtual = sub.add_parser("virtual", help="run a workload in simulated time and print a summary")
    cliargs.add_engine_arguments(virtual)
    cliargs.add_fault_arguments(virtual)
    cliargs.add_workload_arguments(virtual)
    cliargs.add_slo_arguments(virtual)
    virtual.add_argument("--metrics-out", default="", help="also write the run's final vLLM /metrics page here")

    sub.add_parser("presets", help="list the model + GPU presets with their KV capacity and speed")
    return p


async def _serve(args: argparse.Namespace) -> int:
    config = cliargs.engine_config(args)
    server = SimulatorServer(config, faults=cliargs.fault_state(args, RealClock().now()))
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
    config = cliargs.engine_config(args, lora_fallback=tuple(name for name, _ in spec.lora_mix))
    run = simulate(config, spec, ttft_slo=args.ttft, tpot_slo=args.tpot, faults=cliargs.fault_state(args, 0.0),
                   metrics=bool(args.metrics_out))
    if run.metrics is not None:
        write_atomic(args.metrics_out, run.metrics.render().decode())
    print(json.dumps(run.summary, indent=2) if args.json else render_text(run.summary))
    return 0


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
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return asyncio.run(_serve(args))
        if args.command == "virtual":
            return _virtual(args)
        return _presets()
    except ValueError as e:
        print(f"llmslo-sim: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
