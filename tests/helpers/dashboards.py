"""Read the Prometheus queries back out of a generated Grafana dashboard JSON (tests check every one)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any


def iter_queries(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(panel title, expr) for every Prometheus query in a dashboard JSON, rows included."""
    def walk(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                if "expr" in target:
                    yield panel.get("title", ""), target["expr"]
            yield from walk(panel.get("panels", []))
    yield from walk(dashboard.get("panels", []))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            yield f"variable {variable['name']}", variable_series(variable["query"])


_LABEL_VALUES = re.compile(r"^label_values\((?P<series>.+),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)$", re.DOTALL)


def variable_series(query: str) -> str:
    """The series selector inside Grafana's `label_values(series, label)` (a PromQL expression)."""
    m = _LABEL_VALUES.match(query.strip())
    return m.group("series") if m else query
