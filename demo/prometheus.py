"""Prometheus for the local stack: a config that scrapes the node exporter, loads slogen's rules, alerts to
the local Alertmanager; the process; and the few HTTP API queries the demo and tests make.

Prometheus scrapes only the exporter, as in production: the exporter itself scrapes the taps and the
engines, so every series arrives normalized. `cluster` is set as an external label, so alerts reaching
Alertmanager carry it as they would from a fleet (and slogen's rules keep it through aggregation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from demo.alertmanager import find_binary, write_config
from demo.procs import Child, Supervisor, free_url, fresh_dir
from llmslo import conventions as C
from slogen.durations import format_seconds

PROMETHEUS_BINARIES = ("/usr/bin/prometheus", "prometheus")
EXPORTER_JOB = "llmslo-exporter"


@dataclass(frozen=True)
class PrometheusTimers:
    scrape_interval_s: float = 1.0
    evaluation_interval_s: float = 1.0
    resend_delay_s: float = 1.0  # how often a firing alert is re-sent to Alertmanager



def build_config(exporter_hostport: str, rule_files: list[Path], alertmanager_hostport: str,
                 timers: PrometheusTimers, cluster: str) -> dict:
    return {
        "global": {
            "scrape_interval": format_seconds(timers.scrape_interval_s),
            "scrape_timeout": format_seconds(min(timers.scrape_interval_s, 10.0)),
            "evaluation_interval": format_seconds(timers.evaluation_interval_s),
            "external_labels": {C.LABEL_CLUSTER: cluster},
        },
        "rule_files": [str(p) for p in rule_files],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager_hostport]}]}]},
        "scrape_configs": [
            {"job_name": EXPORTER_JOB, "static_configs": [{"targets": [exporter_hostport]}]},
        ],
    }


async def start_prometheus(sup: Supervisor, workdir: Path, exporter_hostport: str, rule_files: list[Path],
                           alertmanager_url: str, timers: PrometheusTimers, cluster: str) -> tuple[Child, str]:
    """Write the config, start Prometheus on a free loopback port with a temp TSDB, wait for /-/ready."""
    binary = find_binary(PROMETHEUS_BINARIES)
    prom_dir = workdir / "prometheus"
    data = fresh_dir(prom_dir / "data")
    am_hostport = alertmanager_url.removeprefix("http://")
    config = write_config(prom_dir / "prometheus.yml",
                          build_config(exporter_hostport, rule_files, am_hostport, timers, cluster))
    port, url = free_url()
    child = sup.spawn("prometheus", [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        "--storage.tsdb.retention.time=1d",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--rules.alert.resend-delay={format_seconds(timers.resend_delay_s)}",
        "--log.level=warn",
    ])
    await sup.wait_http(child, f"{url}/-/ready", timeout_s=60)
    return child, url


class PromClient:
    """The handful of Prometheus HTTP API calls the demo and the tests need."""

    def __init__(self, session: aiohttp.ClientSession, url: str):
        self.session = session
        self.url = url

    async def _get(self, path: str, params: dict | None = None) -> dict:
        async with self.session.get(self.url + path, params=params) as resp:
            body = await resp.json()
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus {path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    async def query(self, expr: str) -> list[dict]:
        """Instant vector result: [{"metric": {...}, "value": [ts, "v"]}, ...]."""
        data = await self._get("/api/v1/query", {"query": expr})
        return data["result"] if data["resultType"] == "vector" else []

    async def scalar(self, expr: str) -> float | None:
        """The value of a one-sample query, None when it returns nothing (or NaN)."""
        result = await self.query(expr)
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if math.isnan(value) else value

    async def alerts(self) -> list[dict]:
        return (await self._get("/api/v1/alerts"))["alerts"]

    async def last_scrape(self, job: str = EXPORTER_JOB) -> float | None:
        """When Prometheus last scraped the job (unix seconds): the timestamp of its `up` sample."""
        return await self.scalar(f'max(timestamp(up{{job="{job}"}}))')
