"""`llmslo-exporter`: run the node exporter, or one cycle with --once, or the `tap` subcommand."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from exporter import logs
from exporter.config import (
    DEFAULT_POD_RESOURCES_SOCKET,
    DEFAULT_PORT,
    NODE_POOL_ENV,
    TARGET_KINDS,
    ConfigError,
    ExporterConfig,
    Listen,
    load_config,
    merge_cli,
    resolve_node_name,
    resolve_node_pool,
)

if TYPE_CHECKING:
    from exporter.cycle import Snapshot

PROG = "llmslo-exporter"
EXIT_CONFIG = 2
EXIT_NOTHING_READ = 1


def version_text() -> str:
    """`--version`: the llmslo version and the Python that runs it (llmslo_build_info's labels)."""
    from exporter.procinfo import build_info
    from llmslo import conventions as c

    info = build_info()
    return f"{PROG} {info[c.LABEL_VERSION]} ({info[c.LABEL_PYTHON_IMPLEMENTATION]} {info[c.LABEL_PYTHON_VERSION]})"


class _VersionAction(argparse.Action):
    """`--version`, its text made only when asked: argparse's own action takes the text when the parser is built,
    and making it reads the installed distribution's metadata on every start."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(version_text())  # to stdout, as argparse's own `version` action writes it
        parser.exit()


def _help_formatter(prog: str) -> argparse.HelpFormatter:
    """argparse's formatter at the terminal's width ($COLUMNS, else the terminal's, else 80), found as
    shutil.get_terminal_size finds it: argparse imports shutil for it (and with it bz2 and lzma) whenever an
    argument is added, 2 ms of CPU on every start."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 80
    return argparse.HelpFormatter(prog, width=columns - 2)  # argparse's own margin


def build_parser() -> argparse.ArgumentParser:
    """The exporter's parser; `tap` is a placeholder (the tap's own parser is built only when `tap`
    is run: importing it costs start-up time every run would pay)."""
    p = argparse.ArgumentParser(
        prog=PROG,
        formatter_class=_help_formatter,
        description="Per-node exporter: NVML and LLM engines' /metrics in, one normalized /metrics out.",
        epilog="Flags override the --config file; --engine adds to its targets. "
        f"`{PROG} tap --help` describes the goodput tap, `{PROG} tap-injector --help` the webhook that adds it "
        "to pods.",
    )
    p.add_argument("--version", action=_VersionAction)
    p.add_argument("--config", metavar="FILE", help="YAML config file (all settings, plus Kubernetes discovery)")
    # Prometheus exporters' flag names first; the earlier names stay as aliases.
    p.add_argument("--web.listen-address", "--listen", dest="listen", metavar="HOST:PORT",
                   help=f"where /metrics is served (default 0.0.0.0:{DEFAULT_PORT})")
    p.add_argument(
        "--engine", metavar="KIND=URL", action="append", default=[],
        help=f"a target to scrape, repeatable; KIND is one of {', '.join(TARGET_KINDS)}; URL is http(s)://... or file://...",
    )
    p.add_argument("--gpu", metavar="SPEC", help="nvml (default; falls back to no GPUs with a logged reason), fake:N or off")
    p.add_argument("--interval", metavar="SECONDS", help="collection interval (default 5)")
    p.add_argument("--once", action="store_true", help="run one cycle, print the exposition to stdout and exit")
    p.add_argument("--web.config.file", "--web-config", dest="web_config", metavar="FILE",
                   help="Prometheus web-config file: TLS, basic auth, bearer token")
    p.add_argument("--node-name", metavar="NAME", help="the node label and discovery's node (default $NODE_NAME, else hostname)")
    p.add_argument("--node-pool", metavar="NAME",
                   help=f"the node pool this node is in, as llm_exporter_node_pool_info (default ${NODE_POOL_ENV}; "
                   "the install sets it per pool: the inference pool's isolation alerts read it)")
    p.add_argument("--discovery-namespaces", metavar="NS[,NS...]", action="append", default=[],
                   help="the namespaces Kubernetes discovery lists pods in, repeatable "
                   "(default: kubernetes_discovery.namespaces in the file, else all namespaces)")
    p.add_argument("--pod-resources-socket", metavar="PATH",
                   help="the kubelet's pod-resources socket, read to label GPU series with the pod, namespace and "
                   f"container that hold each GPU (default {DEFAULT_POD_RESOURCES_SOCKET}; off turns it off)")
    p.add_argument("--pod-resources-url", metavar="URL",
                   help="the node's `llmslo-exporter podmap` relay, read instead of the socket (what the shipped "
                        "DaemonSet does: the exporter mounts no host folder)")
    p.add_argument("--log.level", "--log-level", dest="log_level", metavar="LEVEL",
                   help="debug, info (default), warning or error")
    p.add_argument("--log.format", "--log-format", dest="log_format", choices=logs.LOG_FORMATS,
                   default=logs.LOG_FORMATS[0],
                   help="logfmt (default: event=NAME key=value ...) or json (one object per line)")
    sub = p.add_subparsers(dest="command", metavar="{tap}")
    sub.add_parser("tap", help=f"run the goodput tap, an in-line streaming proxy (`{PROG} tap --help`)",
                   add_help=False)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["podmap"]:
        from exporter.gpu import podmap_server  # the relay that alone reads the kubelet's socket

        return podmap_server.main(args_list[1:])
    if args_list[:1] == ["tap-injector"]:
        from exporter.tap_inject import cli as injector_cli  # the webhook that adds the tap to opted-in pods

        return injector_cli.main(args_list[1:])
    if args_list[:1] == ["tap"]:
        from exporter.tap import cli as tap_cli  # on demand: the exporter's own runs skip the tap's imports

        return int(tap_cli.main(args_list[1:]) or 0)
    parser = build_parser()
    args, unknown = parser.parse_known_args(args_list)
    if args.command == "tap":  # after other flags: the placeholder parser cannot read the tap's options
        print(f"{PROG}: error: `tap` comes first: {PROG} tap [options] (see {PROG} tap --help)", file=sys.stderr)
        return EXIT_CONFIG
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        # The file's cross-field checks run once the flags are merged: --node-name may be what they need.
        config = load_config(args.config, check=False) if args.config else ExporterConfig()
        config = merge_cli(
            config, listen=args.listen, engines=args.engine, gpu=args.gpu, interval=args.interval,
            web_config=args.web_config, node_name=args.node_name, node_pool=args.node_pool, log_level=args.log_level,
            pod_resources_socket=args.pod_resources_socket, pod_resources_url=args.pod_resources_url,
            discovery_namespaces=args.discovery_namespaces, source=args.config or "command line",
        )
        config = replace(config, node_pool=resolve_node_pool(config.node_pool))
    except ConfigError as exc:
        for problem in exc.problems:  # one line each, every problem of the file
            print(f"{PROG}: error: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    logs.setup(config.log_level if not args.once or args.log_level else "warning", fmt=args.log_format)
    try:
        if args.once and loop_free(config):
            return run_once_files(config)
        import asyncio  # here: `--once` over saved pages runs without it (a third of its start-up)

        return asyncio.run(run_once(config) if args.once else serve(config))
    except (ConfigError, ListenError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return 130


class ListenError(Exception):
    """The /metrics port could not be bound (taken, not permitted, unknown host): a setup error, exit 2."""

    def __init__(self, listen: Listen, exc: OSError):
        import socket  # here: only a failed bind needs it

        if isinstance(exc, socket.gaierror) or not exc.errno:
            why = exc.strerror or str(exc)
        else:
            why = os.strerror(exc.errno)  # asyncio's own text repeats the address and lower-cases the reason
        super().__init__(f"cannot listen on {listen}: {why} (fix: free the port or choose another with --web.listen-address)")


class _Runtime:
    """The long-lived parts one process needs, opened and closed together."""

    def __init__(self, config: ExporterConfig):
        from exporter.collector import Collector
        from exporter.targets import TargetSet

        self.config = config
        self.node_name = resolve_node_name(config.node_name)
        self.gpu_provider = None
        if config.gpu != "off":  # `off` imports nothing of the GPU side
            from exporter.gpu import open_provider

            self.gpu_provider = open_provider(config.gpu)
        self.discoverer = None
        if config.discovery.enabled:
            from exporter.discovery import KubernetesDiscoverer

            self.discoverer = KubernetesDiscoverer(config.discovery, self.node_name)
        self.targets = TargetSet(config.targets, self.discoverer, config.discovery.refresh_interval_s)
        # The HTTP client (aiohttp, about 0.1 s to import) is opened by the collector when an http(s)
        # target is first scraped: a --once over saved pages never loads it.
        self.collector = Collector(config, None, self.gpu_provider, self.node_name)
        warn_clamped(config)

    async def close(self) -> None:
        await self.targets.stop()
        await self.collector.close()
        if self.discoverer is not None:
            await self.discoverer.close()
        close = getattr(self.gpu_provider, "close", None)
        if callable(close):
            try:
                close()
            except Exception as exc:  # shutting down: report, do not fail
                logs.event("gpu_close_failed", logging.WARNING, error=type(exc).__name__)


def warn_clamped(config: ExporterConfig) -> None:
    """Log each target whose timeout was cut to the collection interval."""
    for t in config.timeouts_clamped():
        logs.event("timeout_clamped_to_interval", logging.WARNING, target=t.label, interval_s=config.interval_s)


def loop_free(config: ExporterConfig) -> bool:
    """Whether a `--once` cycle needs no event loop: saved pages only (file://), no GPUs, no discovery."""
    from exporter.sources import is_file_url

    return config.gpu == "off" and not config.discovery.enabled and all(is_file_url(t.url) for t in config.targets)


def run_once_files(config: ExporterConfig) -> int:
    """`--once` over saved pages, in this thread (exporter/cycle.py): the same page as `run_once`'s."""
    from exporter.cycle import PageCycle

    cycle = PageCycle(config, resolve_node_name(config.node_name))
    warn_clamped(config)
    freeze_startup_objects()
    gc.disable()  # one cycle, then exit: reference counting frees its garbage, no collection need walk it
    return print_once(config, cycle.collect_files(config.targets))


async def run_once(config: ExporterConfig) -> int:
    """One cycle to stdout; exit 1 (with each source's reason on stderr) when nothing could be read."""
    rt = _Runtime(config)
    freeze_startup_objects()  # as `serve` does: the cycle's collections, and the one at exit, skip the modules
    gc.disable()  # one cycle, then exit: reference counting frees its garbage, no collection need walk it
    try:
        await rt.targets.refresh()  # one cycle: discover first, in line, then collect what was found
        snap = await rt.collector.collect(rt.targets.current(), rt.targets.self_metrics())
    finally:
        await rt.close()
    return print_once(config, snap)


def print_once(config: ExporterConfig, snap: Snapshot) -> int:
    """The page to stdout as /metrics serves it (without the gzip copy); exit 1, with each source's reason on
    stderr, when nothing could be read."""
    from exporter.exposition import render

    if not snap.any_source_read:
        lines = [f"{PROG}: error: no source could be read:"]
        lines += [f"  target {t.target} ({t.engine}): {t.reason}" for t in snap.targets]
        if not snap.targets:
            lines.append("  no engine targets configured (use --engine KIND=URL or --config)")
        lines.append(f"  gpu ({config.gpu}): no GPU answered" if config.gpu != "off" else "  gpu: off")
        print("\n".join(lines), file=sys.stderr)
        return EXIT_NOTHING_READ
    sys.stdout.buffer.write(render(snap.samples))
    sys.stdout.flush()
    return 0


def freeze_startup_objects() -> None:
    """Move everything allocated so far (modules, the app, the runtime) out of the cyclic collector's view.

    A full collection otherwise walks those objects too, holding the GIL for tens of milliseconds in
    the middle of a big page's parse, and /metrics waits that long (measured: BENCHMARKS.md, hostile page);
    `--once` pays the same walk in its cycle and again in the interpreter's last collection at exit.
    """
    gc.freeze()


async def serve(config: ExporterConfig) -> int:
    import asyncio
    import signal

    from exporter.server import start_server
    from exporter.snapshot import CollectionLoop, SnapshotHolder

    holder = SnapshotHolder()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    rt = _Runtime(config)  # before listening: a failed bind then leaves nothing running but this, closed below
    server = None
    collecting: asyncio.Task | None = None
    try:
        try:
            server = await start_server(holder, config.listen, config.web_config_file)
        except OSError as exc:
            raise ListenError(config.listen, exc) from None
        await rt.targets.start()
        freeze_startup_objects()
        collecting = asyncio.create_task(CollectionLoop(rt.collector, rt.targets, holder, config.interval_s).run_forever())
        logs.event("started", node=rt.node_name, targets=len(config.targets), gpu=config.gpu,
                   discovery="on" if config.discovery.enabled else "off", interval_s=config.interval_s)
        await stop.wait()
    finally:
        if collecting is not None:
            logs.event("stopping")
            collecting.cancel()
            await asyncio.gather(collecting, return_exceptions=True)
        if server is not None:
            await server.stop()
        await rt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
