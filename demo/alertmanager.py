"""Alertmanager for the local stack: a config that routes pages and tickets to the demo's webhook, and the process.

Routing follows the generated alerts' own labels: slogen marks every burn-rate alert with `sloth_severity`
(page | ticket), so pages and tickets reach different receivers whatever severity names a team chose.
Timers are short so a notification arrives seconds after Prometheus fires, and a resolved one seconds
after it resolves; gossip is off (`--cluster.listen-address=`), state lives in a temp dir.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from demo.procs import Child, Supervisor, free_port
from llmslo import conventions as C
from llmslo.files import write_atomic
from slogen.durations import format_seconds

ALERTMANAGER_BINARIES = ("/usr/bin/prometheus-alertmanager", "alertmanager", "prometheus-alertmanager")
PAGE_ROUTE = "page"
TICKET_ROUTE = "ticket"
DEFAULT_ROUTE = "other"  # anything else (no-data alerts, KV headroom, ...) still reaches someone
GROUP_BY = (C.LABEL_ALERTNAME, C.SLO.LABEL_SLO, C.SLO.LABEL_SEVERITY, C.SLO.LABEL_TIER)


@dataclass(frozen=True)
class AlertmanagerTimers:
    """Alertmanager's grouping timers; `fast()` for tests and the demo, real defaults are minutes."""

    group_wait_s: float = 1.0
    group_interval_s: float = 1.0
    repeat_interval: str = "1h"


def find_binary(candidates: tuple[str, ...]) -> str:
    for c in candidates:
        path = c if os.path.isabs(c) else shutil.which(c)
        if path and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(f"none of {', '.join(candidates)} is installed; run `make system-deps` "
                            "(Debian: apt-get install prometheus prometheus-alertmanager)")



def build_config(webhook_base: str, timers: AlertmanagerTimers) -> dict:
    """Alertmanager YAML as a dict: page and ticket routes on sloth_severity, one webhook URL each."""

    def receiver(name: str) -> dict:
        return {"name": name, "webhook_configs": [{"url": f"{webhook_base}/{name}", "send_resolved": True}]}

    return {
        "route": {
            "receiver": DEFAULT_ROUTE,
            "group_by": list(GROUP_BY),
            "group_wait": format_seconds(timers.group_wait_s),
            "group_interval": format_seconds(timers.group_interval_s),
            "repeat_interval": timers.repeat_interval,
            "routes": [
                {"receiver": PAGE_ROUTE, "matchers": [f'{C.SLO.LABEL_SEVERITY}="page"']},
                {"receiver": TICKET_ROUTE, "matchers": [f'{C.SLO.LABEL_SEVERITY}="ticket"']},
            ],
        },
        "receivers": [receiver(PAGE_ROUTE), receiver(TICKET_ROUTE), receiver(DEFAULT_ROUTE)],
    }


def write_config(path: Path, config: dict) -> Path:
    write_atomic(path, yaml.safe_dump(config, sort_keys=False))
    return path


async def start_alertmanager(sup: Supervisor, workdir: Path, webhook_base: str,
                             timers: AlertmanagerTimers) -> tuple[Child, str]:
    """Write the config, start Alertmanager on a free loopback port, wait for /-/ready. Returns (child, URL)."""
    binary = find_binary(ALERTMANAGER_BINARIES)
    am_dir = workdir / "alertmanager"
    shutil.rmtree(am_dir / "data", ignore_errors=True)  # a fresh start: no series or silences from a previous run
    (am_dir / "data").mkdir(parents=True)
    config = write_config(am_dir / "alertmanager.yml", build_config(webhook_base, timers))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    child = sup.spawn("alertmanager", [
        binary,
        f"--config.file={config}",
        f"--storage.path={am_dir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",  # no gossip: one local instance
        "--log.level=warn",
    ])
    await sup.wait_http(child, f"{url}/-/ready")
    return child, url
