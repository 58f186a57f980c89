"""`llmslo-exporter tap-injector`: serve the mutating admission webhook that adds the goodput tap to pods.

A subcommand of the image's entrypoint, as `tap` and `podmap` are, so the webhook runs from the same image
(by the same digest) as the tap it injects. Exit 2 on a bad flag or a key pair that does not load, each
message naming the flag.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from exporter.config import ConfigError
from exporter.logs import LOG_FORMATS, event, setup
from exporter.tap_inject.pod import InjectorSettings
from exporter.tap_inject.server import PATH_NAMESPACE, PATH_POD, start
from exporter.webconfig import TlsServerConfig

PROG = "llmslo-exporter tap-injector"
DEFAULT_LISTEN = "0.0.0.0:8443"
DEFAULT_METRICS_LISTEN = "0.0.0.0:9413"
TAP_IMAGE_ENV = "LLMSLO_TAP_IMAGE"
EXIT_CONFIG = 2


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def build_parser() -> argparse.ArgumentParser:
    defaults = InjectorSettings(tap_image="")
    p = argparse.ArgumentParser(prog=PROG, description=(
        f"Mutating admission webhook (POST {PATH_POD}: pods labelled llmslo.io/tap=enabled; POST {PATH_NAMESPACE}: "
        "pods of namespaces labelled llmslo.io/tap-injection=enabled) adding the goodput tap as a sidecar."))
    p.add_argument("--listen", type=_host_port, default=_host_port(DEFAULT_LISTEN), metavar="HOST:PORT",
                   help=f"the webhook, over TLS (default {DEFAULT_LISTEN})")
    p.add_argument("--metrics-listen", default=DEFAULT_METRICS_LISTEN, metavar="HOST:PORT|off",
                   help=f"/metrics and /healthz over plain HTTP (default {DEFAULT_METRICS_LISTEN})")
    p.add_argument("--tls-cert-file", required=True, metavar="FILE", help="the serving certificate (PEM), re-read "
                   "when it changes (cert-manager's Secret: tls.crt)")
    p.add_argument("--tls-key-file", required=True, metavar="FILE", help="its key (PEM; tls.key)")
    p.add_argument("--tap-image", default=os.environ.get(TAP_IMAGE_ENV, ""), metavar="IMAGE@sha256:...",
                   help=f"the llmslo image the sidecar runs, by digest (default ${TAP_IMAGE_ENV})")
    p.add_argument("--slo-configmap", default=defaults.slo_configmap, metavar="NAME",
                   help=f"the SLO ConfigMap mounted into the tap (default {defaults.slo_configmap}; a pod's "
                   "annotation llmslo.io/tap-slo-configmap overrides it)")
    p.add_argument("--port-name", default=defaults.port_name, metavar="NAME",
                   help=f"the engine's serving port name the tap takes over (default {defaults.port_name}; "
                   "annotation llmslo.io/tap-port-name)")
    p.add_argument("--listen-port", type=int, default=defaults.listen_port, metavar="PORT",
                   help=f"where the tap listens (default {defaults.listen_port}; annotation llmslo.io/tap-listen-port)")
    p.add_argument("--metrics-port", type=int, default=defaults.metrics_port, metavar="PORT",
                   help=f"the tap's metrics port (default {defaults.metrics_port}; annotation llmslo.io/tap-port)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.add_argument("--log-format", default=LOG_FORMATS[0], choices=LOG_FORMATS)
    return p


def settings_from(args: argparse.Namespace) -> InjectorSettings:
    return InjectorSettings(tap_image=args.tap_image, slo_configmap=args.slo_configmap, port_name=args.port_name,
                            listen_port=args.listen_port, metrics_port=args.metrics_port)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    settings = settings_from(args)
    problems = settings.problems()
    metrics = None if args.metrics_listen == "off" else args.metrics_listen
    try:
        metrics_listen = _host_port(metrics) if metrics else None
    except argparse.ArgumentTypeError as exc:
        problems.append(f"--metrics-listen: {exc}")
    if problems:
        for problem in problems:
            print(f"{PROG}: error: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    setup(args.log_level, fmt=args.log_format)
    try:
        _, stop = start(settings, args.listen, metrics_listen, TlsServerConfig(args.tls_cert_file, args.tls_key_file))
    except (ConfigError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    event("tap_injector_listening", listen=f"{args.listen[0]}:{args.listen[1]}", metrics=metrics or "off",
          tap_image=settings.tap_image, slo_configmap=settings.slo_configmap)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    stop()
    event("tap_injector_stopped")
    return 0


__all__ = ["build_parser", "main"]
