"""The tap's listen addresses: HOST:PORT, [IPv6]:PORT, :PORT and unix:PATH, read and written.

Its own module so that the option list (exporter.tap.options) and the `--workers` parent
(exporter.tap.workers) read addresses without importing the CLI, and the CLI imports both.
"""

from __future__ import annotations

import argparse


def host_port(value: str) -> tuple[str, int]:
    """HOST:PORT, [IPv6]:PORT or :PORT (all interfaces); port 0 picks a free port."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not HOST:PORT (e.g. 0.0.0.0:8001)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def metrics_address(value: str) -> tuple[str, int] | str:
    """HOST:PORT as for --listen, or unix:PATH (a unix socket; unix:@NAME is Linux's abstract
    namespace, no file at all: what the workers of --workers serve their metrics on)."""
    if value.startswith("unix:") and len(value) > 5:
        path = value[5:]
        return "\0" + path[1:] if path.startswith("@") else path
    return host_port(value)


def format_host_port(host: str, port: int) -> str:
    """HOST:PORT as `host_port` reads it back: brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
