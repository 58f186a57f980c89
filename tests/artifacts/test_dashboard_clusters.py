"""Generated dashboards and runbooks keep clusters apart when they read a fleet store (docs/scaling.md).

With the cluster variable on All, a panel that aggregates per engine `by (namespace, pod)` or per pool
`by (namespace, model)` sums two clusters' pods of one name (a StatefulSet's chat-0 exists in each) into one
line. Every aggregation that names a pod or a pool must keep `cluster` too, and a legend must show it; the
runbooks' per-engine queries likewise.
The fleet integration test (tests/integration/test_fleet.py) runs these queries against VictoriaMetrics.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llmslo import conventions as c

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((ROOT / "dashboards").glob("*.json"))
RUNBOOKS = sorted((ROOT / "docs" / "runbooks").glob("*.md"))
BY = re.compile(r"\bby\s*\(([^)]*)\)")


def _targets(panels):
    for panel in panels:
        for target in panel.get("targets", []):
            if "expr" in target:
                yield panel.get("title", ""), target["expr"], target.get("legendFormat", "")
        yield from _targets(panel.get("panels", []))


def _per_engine_or_pool(groups: set[str]) -> bool:
    return c.LABEL_POD in groups or {c.LABEL_NAMESPACE, c.LABEL_MODEL} <= groups


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_per_engine_and_per_pool_panels_keep_the_cluster(path):
    dashboard = json.loads(path.read_text(encoding="utf-8"))
    wrong = []
    for title, expr, legend in _targets(dashboard.get("panels", [])):
        for clause in BY.findall(expr):
            groups = {g.strip() for g in clause.split(",") if g.strip()}
            if _per_engine_or_pool(groups) and c.LABEL_CLUSTER not in groups:
                wrong.append(f"{title}: by ({clause}) drops {c.LABEL_CLUSTER}: {expr}")
        if "{{pod}}" in legend and "{{cluster}}" not in legend:
            wrong.append(f"{title}: legend {legend!r} hides the cluster")
    assert wrong == [], "\n".join(wrong)


def test_the_fleet_dashboard_has_per_engine_and_per_pool_panels():
    """The check above is not vacuous: the fleet dashboard aggregates per engine and per pool."""
    dashboard = json.loads((ROOT / "dashboards" / "llm-serving-fleet.json").read_text(encoding="utf-8"))
    clauses = [{g.strip() for g in clause.split(",")} for _, expr, _ in _targets(dashboard["panels"])
               for clause in BY.findall(expr)]
    assert sum(1 for g in clauses if c.LABEL_POD in g) >= 10
    assert sum(1 for g in clauses if {c.LABEL_NAMESPACE, c.LABEL_MODEL} <= g) >= 4


def test_runbook_queries_per_engine_keep_the_cluster():
    wrong, per_engine = [], 0
    for path in RUNBOOKS:
        for clause in BY.findall(path.read_text(encoding="utf-8")):
            groups = {g.strip() for g in clause.split(",") if g.strip()}
            if c.LABEL_POD in groups:
                per_engine += 1
                if c.LABEL_CLUSTER not in groups:
                    wrong.append(f"{path.name}: by ({clause})")
    assert per_engine >= 10 and wrong == [], wrong
