"""Alertmanager for the local stack: slogen's generated routing with the demo's webhook as on-call, and the process.

The configuration is `alerts/alertmanager.yaml` as `slogen build` generated it for the demo's window catalog
(slogen/artifacts/alertmanager.py): the same routes, grouping, inhibition and timers an operator deploys, the
timers compressed with the catalog. The demo only fills the placeholder receivers: `llmslo-page` posts to
<webhook>/page and `llmslo-ticket` to <webhook>/ticket, with resolved notifications on. Gossip is off
(`--cluster.listen-address=`), state lives in the work dir.
"""

from __future__ import annotations

import copy
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from demo.procs import Child, Supervisor, free_url, fresh_dir
from llmslo.durations import parse_prometheus_duration
from llmslo.files import write_atomic
from slogen.artifacts.alertmanager import PAGE_RECEIVER
from slogen.durations import format_seconds

ALERTMANAGER_BINARIES = ("/usr/bin/prometheus-alertmanager", "alertmanager", "prometheus-alertmanager")
RECEIVER_PREFIX = "llmslo-"  # generated receivers are llmslo-<route>
PAGE_ROUTE = "page"
TICKET_ROUTE = "ticket"


@dataclass(frozen=True)
class AlertmanagerTimers:
    """One route's grouping timers, in seconds (repeat as Alertmanager writes it)."""

    group_wait_s: float
    group_interval_s: float
    repeat_interval: str = "1h"


def find_binary(candidates: tuple[str, ...]) -> str:
    for c in candidates:
        path = c if os.path.isabs(c) else shutil.which(c)
        if path and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(f"none of {', '.join(candidates)} is installed; run `make system-deps` "
                            "(Debian: apt-get install prometheus prometheus-alertmanager)")


def route_name(receiver: str) -> str:
    """The webhook path a generated receiver posts to: llmslo-page -> page."""
    return receiver.removeprefix(RECEIVER_PREFIX)


def load_generated(path: Path) -> dict:
    """slogen's alerts/alertmanager.yaml."""
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict) or "route" not in config or not config.get("receivers"):
        raise ValueError(f"{path}: not an Alertmanager configuration with a route and receivers (run `slogen build`)")
    return config


def _routes(route: dict):
    yield route
    for child in route.get("routes") or []:
        yield from _routes(child)


def build_config(generated: dict, webhook_base: str, timers: AlertmanagerTimers | None = None) -> dict:
    """The generated configuration with every receiver posting to `webhook_base/<route>` (resolved included).
    `timers`, when given, replaces group_wait and group_interval wherever a route sets them (the generated
    ones are used otherwise)."""
    config = copy.deepcopy(generated)
    for receiver in config["receivers"]:
        receiver["webhook_configs"] = [{"url": f"{webhook_base}/{route_name(receiver['name'])}", "send_resolved": True}]
    if timers is not None:
        for route in _routes(config["route"]):
            if "group_wait" in route or route is config["route"]:
                route["group_wait"] = format_seconds(timers.group_wait_s)
            if "group_interval" in route or route is config["route"]:
                route["group_interval"] = format_seconds(timers.group_interval_s)
    return config


def route_timers(config: dict, receiver: str = PAGE_RECEIVER) -> AlertmanagerTimers:
    """The timers of the first route sending to `receiver` (inherited from its parents where it sets none)."""

    def walk(route: dict, inherited: dict):
        here = {**inherited, **{k: route[k] for k in ("group_wait", "group_interval", "repeat_interval") if k in route}}
        if route.get("receiver") == receiver and route is not config["route"]:
            return here
        for child in route.get("routes") or []:
            found = walk(child, here)
            if found is not None:
                return found
        return None

    defaults = {"group_wait": "30s", "group_interval": "5m", "repeat_interval": "4h"}  # Alertmanager's own
    found = walk(config["route"], defaults) or walk({"routes": [config["route"]]}, defaults) or defaults
    return AlertmanagerTimers(parse_prometheus_duration(found["group_wait"]) / 1000, parse_prometheus_duration(found["group_interval"]) / 1000,
                              found["repeat_interval"])


def write_config(path: Path, config: dict) -> Path:
    write_atomic(path, yaml.safe_dump(config, sort_keys=False))
    return path


async def start_alertmanager(sup: Supervisor, workdir: Path, config: dict) -> tuple[Child, str]:
    """Write `config`, start Alertmanager on a free loopback port, wait for /-/ready. Returns (child, URL)."""
    binary = find_binary(ALERTMANAGER_BINARIES)
    am_dir = workdir / "alertmanager"
    data = fresh_dir(am_dir / "data")
    path = write_config(am_dir / "alertmanager.yml", config)
    port, url = free_url()
    child = sup.spawn("alertmanager", [
        binary,
        f"--config.file={path}",
        f"--storage.path={data}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",  # no gossip: one local instance
        "--log.level=warn",
    ])
    await sup.wait_http(child, f"{url}/-/ready")
    return child, url
