"""Every dashboard panel returns data from a real stack.

Simulated vLLM engines behind goodput taps, the node exporter with fake GPUs, and a real
Prometheus scraping it and evaluating the rules slogen generated from slos/. After a few
seconds of traffic, every query of every generated dashboard (and every KEDA trigger) is sent to
Prometheus' HTTP API with Grafana's variables filled in as "All": each must return at least one
sample, and each KEDA query exactly one. A panel that names a series nobody produces, or
filters on a label nobody sets, fails here.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
import yaml

from demo.stack import LocalStack, StackSettings
from llmslo import conventions as c
from slogen.artifacts.dashboards import dashboard_files
from slogen.artifacts.keda import keda_files
from slogen.autoscaling import load_paths as load_autoscaling
from slogen.loaders import load_paths
from slogen.rules import generate
from slogen.rules.options import GenOptions
from slogen.views import from_context
from slogen.writers import rule_file
from tests.helpers.dashboards import iter_queries

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RATE_INTERVAL = "10s"  # Grafana's $__rate_interval for a 1 s scrape interval is at least 4 scrapes


def grafana_to_promql(expr: str) -> str:
    """What Grafana sends with every variable on "All" (allValue .*)."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL).replace("$__range", "1h").replace("$__interval", "2s")
    return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", ".*", expr)


def test_every_dashboard_panel_and_keda_query_returns_data(tmp_path):
    results = generate(load_paths([REPO / "slos"]).slos, GenOptions())
    rules = tmp_path / "slos.rules.yaml"
    rules.write_text(rule_file([g for r in results for g in r.rules.groups()]))
    views = [from_context(r.ctx) for r in results]
    dashboards = {path: json.loads(text) for path, text in dashboard_files(views).items()}
    pools = load_autoscaling([REPO / "autoscaling"]).pools
    keda_queries = [t["metadata"]["query"] for text in keda_files(pools, views).values()
                    for obj in yaml.safe_load_all(text) if obj for t in obj["spec"]["triggers"]]
    assert len(dashboards) == len(views) + 2 and keda_queries  # the fleet and the overview
    # The health alerts' operands, thresholds relaxed: each must match the real exporter's series
    # (the KV alert's `and` only works if usage and queue carry the same labels).
    health_rules = REPO / "alerts" / f"{c.HEALTH.GROUP}.rules.yaml"
    health_operands = [f"{c.KV_CACHE_USAGE.name} >= 0 and {c.REQUESTS_WAITING.name} >= 0",
                       f"rate({c.PREEMPTIONS.name}[{RATE_INTERVAL}]) >= 0", c.GPU_UP.name, c.EXPORTER_TARGET_UP.name,
                       f'{c.GPU_ECC_ERRORS.name}{{{c.LABEL_ECC_TYPE}="{c.HEALTH.ECC_UNCORRECTED}"}}',
                       f'rate({c.TAP_REFUSALS.name}{{{c.LABEL_REASON}=~"{"|".join(c.REFUSED_CAPACITY_REASONS)}"}}'
                       f'[{RATE_INTERVAL}]) >= 0']

    capacity_rules = REPO / "alerts" / f"{c.CAPACITY.GROUP}.rules.yaml"

    def operand(expr: str) -> str:
        """The query to check for a panel. The forecast is absent while no pool's net free tokens are falling (as
        under this steady load): its operand, the pool's seats, is checked instead. The pool-holder panel needs a
        GPU held by a pod and an exporter told its pool, which a stack without a kubelet has not: its GPU operand is
        checked here, its join on synthetic holders by the generated dashboards.test.yaml."""
        if c.CAPACITY.POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION in expr:
            return c.CAPACITY.POOL_SEATS_P99
        if c.EXPORTER_NODE_POOL_INFO.name in expr:
            return c.GPU_MEMORY_TOTAL.name
        return grafana_to_promql(expr)

    async def run() -> tuple[list[str], list[str]]:
        settings = StackSettings.fast(prebuilt_rules=(rules, health_rules, capacity_rules), workdir=tmp_path / "stack")
        async with LocalStack(settings) as stack:
            await stack.drive_load(6.0)
            prom = stack.prom()
            empty: list[str] = []
            # Rules evaluate every second; give the longest chain (events -> ratios -> budget) a few rounds.
            for _ in range(30):
                empty = [f"health operand: {q}" for q in health_operands if not await prom.query(q)]
                for path, dash in sorted(dashboards.items()):
                    for title, expr in iter_queries(dash):
                        query = operand(expr)
                        if not await prom.query(query):
                            empty.append(f"{path}: {title}: {expr}")
                if not empty:
                    break
                await asyncio.sleep(1.0)
            not_one = []
            for q in keda_queries:
                result = await prom.query(q)
                if len(result) != 1:
                    not_one.append(f"{q} -> {len(result)} samples")
            return empty, not_one

    empty, not_one = asyncio.run(asyncio.wait_for(run(), timeout=120))
    assert empty == [], "panels without data:\n" + "\n".join(empty)
    assert not_one == [], "KEDA queries not returning exactly one sample:\n" + "\n".join(not_one)
