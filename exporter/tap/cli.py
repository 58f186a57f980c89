"""`llmslo-exporter tap`: run the goodput tap in front of one OpenAI-compatible engine.

    llmslo-exporter tap --listen 0.0.0.0:8001 --upstream http://127.0.0.1:8000 \\
        --metrics-listen 0.0.0.0:9402 --slo slos/chat.yaml

`add_parser(subparsers)` registers the subcommand on the exporter's CLI (its handler is
`run(args)`); `main(argv)` runs it standalone (`python -m exporter.tap`).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import resource
import signal
import ssl
import sys
from collections.abc import Sequence

from exporter.logs import TAP_LOGGER, event, setup
from exporter.tap.admission import Admission, warn_unguarded
from exporter.tap.classes import SloConfig, SloConfigError, load_slo_config
from exporter.tap.deadlines import DeadlineError, derive_deadlines, log_derived
from exporter.tap.options import add_arguments
from exporter.tap.server import TapServer
from exporter.tap.settings import TapSettings
from exporter.tap.slofiles import one_shot_sources

DESCRIPTION = (
    "Relay an OpenAI-compatible engine unchanged while timing every completion (TTFT, TPOT, E2E) "
    "and counting goodput per SLO class; the tap's metrics are served on --metrics-listen."
)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Register `tap` on a parent CLI; the parsed namespace's `func` is `run`."""
    p = subparsers.add_parser("tap", help="run the goodput tap (an in-line streaming proxy)", description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=run)
    return p


FD_RESERVE = 128  # descriptors kept for listeners, upstream connections being opened, logs


def raise_fd_limit() -> int:
    """Raise the open-file soft limit to the hard limit (each client connection is a descriptor,
    and so is its upstream connection); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            event("tap_fd_limit_not_raised", logging.WARNING, logger=TAP_LOGGER, soft=soft, hard=hard, error=e)
    return soft


def default_max_connections(fd_limit: int) -> int:
    """Half of what is left after the reserve: every client connection may need one upstream."""
    return max(16, (fd_limit - FD_RESERVE) // 2)


# Net container allocations (allocations minus frees) between young-generation collections;
# CPython's default is 700. See _tune_gc.
GC_GEN0_THRESHOLD = 20_000


def _tune_gc() -> None:
    """Keep the cyclic GC's pauses out of the relayed streams; call once the listeners are up.

    Everything allocated by then lives as long as the process, so it is frozen out of every
    later scan. A relayed request frees its objects by reference counting (it makes no cyclic
    garbage on the normal path), but with CPython's default threshold of 700 the turnover of
    requests still sets off a young collection every second or so, and that collection scans
    every young object still alive (thousands, one in-flight stream's worth each): pauses of
    1-7 ms on a tap relaying a few hundred streams, each one delaying every chunk due in it.
    The threshold counts allocations net of frees, so steady turnover barely moves it while
    growth does: with 20 000, collections still come as the number of streams grows and when
    cyclic garbage (error paths) piles up, bounding it to about that many objects.
    """
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


async def _serve(args: argparse.Namespace, server: TapServer) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, server.reload_slo)  # check the SLO files now (exporter.tap.reload)
    await server.start(args.listen, args.metrics_listen, reuse_port=args.reuse_port)
    _tune_gc()
    assert server.proxy_address is not None
    if server.metrics_address is None:  # a worker of `--workers N`: the parent serves the metrics
        event("tap_worker_listening", logger=TAP_LOGGER, proxy=server.proxy_address.url(),
              metrics="unix:" + str(args.metrics_listen).replace("\0", "@"), pid=os.getpid())
    else:
        event("tap_listening", logger=TAP_LOGGER, proxy=server.proxy_address.url(),
              metrics=server.metrics_address.url() + "/metrics", upstream=args.upstream,
              classes=",".join(server.proxy.slo.class_names), slo_hash=server.proxy.slo.hash,
              loop=type(loop).__module__.split(".")[0])
    try:
        await stop.wait()
    finally:
        event("tap_stopping", logger=TAP_LOGGER, grace_s=args.shutdown_grace)
        await server.stop()


def _runner(choice: str) -> asyncio.Runner:
    """An asyncio runner on uvloop when asked for or (auto) installed, else on the default loop."""
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise SystemExit("llmslo-exporter tap: --event-loop uvloop, but uvloop is not installed") from None
        else:
            return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    return asyncio.Runner()


def _read_slo(args: argparse.Namespace) -> tuple[SloConfig, list[str]] | None:
    """--slo, read at start, and the paths to reload later (None: the error is printed). A pipe (`--slo <(...)`)
    is a one-shot source: read once here and never reloaded; refused with --workers, whose N processes would
    each read it (only the first would get its contents)."""
    pipes = one_shot_sources(args.slo)
    if pipes and args.workers > 1:
        print(f"llmslo-exporter tap: --slo {pipes[0]} is a pipe, which only one process can read, once; with "
              f"--workers {args.workers} every worker reads --slo (fix: give a file or a directory)", file=sys.stderr)
        return None
    try:
        slo = load_slo_config(args.slo, pipe_ok=True)
    except SloConfigError as e:
        print(f"llmslo-exporter tap: {e}", file=sys.stderr)
        return None
    if pipes:
        event("tap_slo_not_reloaded", logging.WARNING, logger=TAP_LOGGER, paths=",".join(pipes),
              reason="a pipe is read once, at start", fix="give --slo a file or a directory to have changes reloaded")
    return slo, [] if pipes else list(args.slo)


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT. Exit status 2 for unusable configuration."""
    setup(args.log_level, TAP_LOGGER, args.log_format)
    read = _read_slo(args)
    if read is None:
        return 2
    slo, reload_paths = read
    if not args.upstream.startswith(("http://", "https://")):
        print(f"llmslo-exporter tap: --upstream {args.upstream!r} must be an http:// or https:// URL", file=sys.stderr)
        return 2
    if args.client_idle_timeout <= 0:
        print("llmslo-exporter tap: --client-idle-timeout must be more than 0 seconds", file=sys.stderr)
        return 2
    if args.upstream_ca:
        try:
            ssl.create_default_context(cafile=args.upstream_ca)
        except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
            print(f"llmslo-exporter tap: --upstream-ca {args.upstream_ca!r}: cannot load it: {e} (fix: give a "
                  "readable PEM file of CA certificates)", file=sys.stderr)
            return 2
    try:
        deadlines = derive_deadlines(slo, args.first_token_timeout, args.stall_timeout, args.response_timeout)
    except DeadlineError as e:
        print(f"llmslo-exporter tap: {e}", file=sys.stderr)
        return 2
    unknown = sorted(set(args.admission_sheddable) - set(slo.class_names))
    if unknown:
        print(f"llmslo-exporter tap: --admission-sheddable {','.join(unknown)}: no such goodput class in --slo "
              f"(classes: {', '.join(slo.class_names)}); fix: name a class the SLO files define", file=sys.stderr)
        return 2
    log_derived(slo, deadlines, TAP_LOGGER)
    fd_limit = raise_fd_limit()
    if args.workers > 1:
        from exporter.tap.workers import run_workers  # the parent of N workers: loaded only when asked for

        return run_workers(args)
    try:
        import prometheus_client

        prometheus_client.disable_created_metrics()  # *_created series are noise for a sidecar (process-wide)
    except AttributeError:
        pass
    settings = TapSettings(
        args.upstream, args.max_body_bytes, inject_usage=not args.no_inject_usage,
        client_idle_timeout_s=args.client_idle_timeout, upstream_ca=args.upstream_ca,
        first_token_timeout_s=args.first_token_timeout, stall_timeout_s=args.stall_timeout,
        response_timeout_s=args.response_timeout, trust_slo_headers=args.trust_slo_headers,
        max_connections=args.max_connections or default_max_connections(fd_limit), head_timeout_s=args.head_timeout,
        max_buffered_body_bytes=args.max_buffered_body_bytes, genai_names=args.genai_names,
    )
    if args.admission:
        warn_unguarded(slo)
    admission = Admission(
        args.upstream, args.upstream_ca, min_seats=args.admission_min_seats, max_queue=args.admission_max_queue,
        poll_s=args.admission_poll_interval, fallback_footprint=args.admission_footprint, engine=args.admission_engine,
        sheddable=frozenset(args.admission_sheddable), shed_margin=args.admission_shed_margin, slo=slo,
        taps=args.admission_taps, client_header=args.admission_client_header or "",
    ) if args.admission else None
    server = TapServer(settings, slo, shutdown_timeout_s=args.shutdown_grace, models_refresh_s=args.models_refresh,
                       admission=admission, slo_paths=reload_paths, reload_interval_s=args.slo_reload_interval)
    try:
        with _runner(args.event_loop) as runner:
            runner.run(_serve(args, server))
    except OSError as e:
        # Exit 2, as the exporter does: a setting to change, not a runtime failure.
        print(f"llmslo-exporter tap: error: cannot listen: {e} (fix: free the port or choose another with "
              "--listen / --metrics-listen)", file=sys.stderr)
        return 2
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="llmslo-exporter tap", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))
