"""grafanalib, brought up to Grafana's current dashboard JSON model.

Why this module exists: grafanalib (0.7) builds dashboards well, but it serialises legacy
fields (`rows`, `style`, `span`, `null`s everywhere) and its `Heatmap` and `BarGauge` are the
pre-Grafana-9 plugins. Grafana's dashboard JSON schema rejects all of that. So dashboards are
composed with grafanalib's `Dashboard`, `TimeSeries`, `Stat`, `Target`, `Template`, plus the two
modern panels below, and `dashboard_json` drops the legacy keys by name (an explicit list, not
"whatever the schema does not know", so the schema test in tests/artifacts stays meaningful).
"""

from __future__ import annotations

import json
from typing import Any

import attr
from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from slogen.artifacts.jsontext import indented

SCHEMA_VERSION = 39  # Grafana 10.4/11 classic dashboard model
DATASOURCE_VARIABLE = "datasource"
PROMETHEUS = {"type": "prometheus", "uid": "${" + DATASOURCE_VARIABLE + "}"}

# Keys grafanalib writes that the current model no longer has.
_LEGACY_DASHBOARD_KEYS = ("__inputs", "rows", "hideControls", "sharedCrosshair", "style")
_LEGACY_TIMEPICKER_KEYS = ("time_options",)
_LEGACY_PANEL_KEYS = ("editable", "error", "height", "minSpan", "span")
_LEGACY_TARGET_KEYS = ("query", "target", "metric", "step", "intervalFactor")
_LEGACY_VARIABLE_KEYS = ("useTags", "tagsQuery", "tagValuesQuery")


def thresholds(*steps: tuple[float | None, str]) -> list[dict[str, Any]]:
    """Threshold steps; the first step's value is None (-Infinity), as Grafana writes it."""
    return [{"color": color, "value": value} for value, color in steps]


def prom_target(expr: str, legend: str = "", ref_id: str = "A", *, instant: bool = False,
                heatmap: bool = False) -> g.Target:
    return g.Target(
        expr=expr,
        legendFormat=legend,
        refId=ref_id,
        instant=instant,
        format="heatmap" if heatmap else ("table" if instant and not legend else "time_series"),
        datasource=PROMETHEUS,
    )


@attr.s
class Heatmap(g.Panel):
    """Grafana 9+ heatmap over pre-bucketed Prometheus histograms (`calculate: false`)."""

    unit = attr.ib(default="s")
    colorScheme = attr.ib(default="Oranges")

    def to_json_data(self):
        return self.panel_json({
            "type": "heatmap",
            "fieldConfig": {
                "defaults": {"custom": {"hideFrom": {"legend": False, "tooltip": False, "viz": False},
                                        "scaleDistribution": {"type": "linear"}}},
                "overrides": [],
            },
            "options": {
                "calculate": False,
                "cellGap": 1,
                "color": {"mode": "scheme", "scheme": self.colorScheme, "steps": 64, "exponent": 0.5,
                          "fill": "dark-orange", "reverse": False, "scale": "exponential"},
                "exemplars": {"color": "rgba(255,0,255,0.7)"},
                "filterValues": {"le": 1e-9},
                "legend": {"show": True},
                "rowsFrame": {"layout": "auto"},
                "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
                "yAxis": {"axisPlacement": "left", "reverse": False, "unit": self.unit},
            },
        })


@attr.s
class BarGauge(g.Panel):
    """Grafana 8+ bar gauge (fieldConfig-based, unlike grafanalib's legacy `fieldOptions` one)."""

    unit = attr.ib(default="none")
    minValue = attr.ib(default=None)
    maxValue = attr.ib(default=None)
    orientation = attr.ib(default="horizontal")
    displayMode = attr.ib(default="gradient")
    reduceCalc = attr.ib(default="lastNotNull")

    def to_json_data(self):
        defaults: dict[str, Any] = {
            "unit": self.unit,
            "color": {"mode": "thresholds"},
            "thresholds": {"mode": "absolute", "steps": self.thresholds},
        }
        if self.minValue is not None:
            defaults["min"] = self.minValue
        if self.maxValue is not None:
            defaults["max"] = self.maxValue
        return self.panel_json({
            "type": "bargauge",
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {
                "displayMode": self.displayMode,
                "orientation": self.orientation,
                "namePlacement": "auto",
                "showUnfilled": True,
                "sizing": "auto",
                "valueMode": "color",
                "minVizHeight": 16,
                "minVizWidth": 8,
                "maxVizHeight": 300,
                "reduceOptions": {"calcs": [self.reduceCalc], "fields": "", "values": False},
            },
        })


@attr.s
class Table(g.Panel):
    """Grafana 8+ table (fieldConfig-based). Every setting is a default for all columns: the dashboard schema
    allows field overrides only with object values, so a unit or a link per column cannot be written."""

    decimals = attr.ib(default=None)
    mappings: list[dict[str, Any]] = attr.ib(factory=list)
    dataLinks: list[dict[str, Any]] = attr.ib(factory=list)
    noValue = attr.ib(default="")

    def to_json_data(self):
        defaults: dict[str, Any] = {
            "unit": "none", "color": {"mode": "thresholds"}, "mappings": self.mappings, "links": self.dataLinks,
            "thresholds": {"mode": "absolute", "steps": self.thresholds},
            "custom": {"align": "auto", "cellOptions": {"type": "color-text"}, "filterable": True, "inspect": False},
        }
        if self.decimals is not None:
            defaults["decimals"] = self.decimals
        if self.noValue:
            defaults["noValue"] = self.noValue
        return self.panel_json({
            "type": "table",
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": {"showHeader": True, "cellHeight": "sm",
                        "footer": {"show": False, "reducer": ["sum"], "countRows": False, "fields": ""}},
        })


def data_link(title: str, url: str) -> dict[str, Any]:
    """A field's data link; the dashboard schema types field links as dashboard links, hence their extra keys
    (Grafana reads title and url and ignores the rest)."""
    return {"title": title, "url": url, "type": "link", "icon": "dashboard", "tooltip": title, "tags": [],
            "asDropdown": False, "targetBlank": False, "includeVars": False, "keepTime": False}


def query_variable(name: str, label: str, query: str) -> g.Template:
    """A multi-select label_values() variable whose "All" matches series without the label too."""
    return g.Template(
        name=name, label=label, query=query, dataSource=PROMETHEUS, includeAll=True, multi=True,
        allValue=".*", refresh=2, sort=1, regex="", default="All",
    )


def datasource_variable() -> g.Template:
    return g.Template(name=DATASOURCE_VARIABLE, label="Data source", query="prometheus", type="datasource",
                      regex="", default="default")


def _without_none(obj: dict[str, Any]) -> dict[str, Any]:
    """A JSON object without its null members (list items stay): grafanalib writes unset fields as null."""
    return {k: v for k, v in obj.items() if v is not None}


def _drop(mapping: dict[str, Any], keys: tuple[str, ...]) -> None:
    for key in keys:
        mapping.pop(key, None)


# A row holds panels; it has no queries or field config of its own.
_ROW_KEYS = ("type", "collapsed", "title", "datasource", "gridPos", "id", "panels", "repeat")


def _modernise_panel(panel: dict[str, Any]) -> None:
    if panel.get("type") == "row":
        for key in [k for k in panel if k not in _ROW_KEYS]:
            del panel[key]
    _drop(panel, _LEGACY_PANEL_KEYS)
    if "repeat" not in panel:
        _drop(panel, ("repeatDirection", "maxPerRow"))
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    if defaults.get("thresholds", {}).get("steps") in ("", []):
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds((None, "green"))}
    for step in defaults.get("thresholds", {}).get("steps", []):
        step.setdefault("value", None)  # the base step is -Infinity, which JSON writes as null
    if defaults.get("custom") == {}:
        del defaults["custom"]
    for target in panel.get("targets", []):
        _drop(target, _LEGACY_TARGET_KEYS)
    for child in panel.get("panels", []):
        _modernise_panel(child)


def _modernise_variable(variable: dict[str, Any]) -> None:
    _drop(variable, _LEGACY_VARIABLE_KEYS)
    variable.get("current", {}).pop("tags", None)
    if variable.get("type") != "interval":
        _drop(variable, ("auto", "auto_min", "auto_count"))


def dashboard_json(dashboard: g.Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana's current JSON model (plain dicts, ready for json.dumps)."""
    # Nones dropped as the decoder builds each object (C speed; a recursive pass cost 5% of a large build).
    data = json.loads(json.dumps(dashboard.to_json_data(), cls=DashboardEncoder), object_hook=_without_none)
    _drop(data, _LEGACY_DASHBOARD_KEYS)
    _drop(data.get("timepicker", {}), _LEGACY_TIMEPICKER_KEYS)
    for panel in data.get("panels", []):
        _modernise_panel(panel)
    for variable in data.get("templating", {}).get("list", []):
        _modernise_variable(variable)
    return data


def render(dashboard: g.Dashboard) -> str:
    """Deterministic text: sorted keys, two-space indent, trailing newline (json.dumps's, written faster)."""
    return text(dashboard_json(dashboard))


def text(data: dict[str, Any]) -> str:
    """The text `render` writes of a dashboard's JSON model (`dashboard_json`)."""
    return indented(data) + "\n"
