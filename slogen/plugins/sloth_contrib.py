"""Sloth's small built-in SLO plugins (`sloth.dev/contrib/...`), so Sloth specs that chain them load.

Behaviour follows each plugin's README in Sloth (v0.16, internal/plugin/slo/contrib); written here
from those descriptions. `alert_for/v1` is newer than v0.16: the `for:` it stands for is read by the
loader from `page_alert.for` / `ticket_alert.for`, so the plugin itself has nothing left to do.
"""

from __future__ import annotations

from typing import Any

from llmslo.conventions import SLO as C
from llmslo.durations import format_prometheus_duration, parse_prometheus_duration
from slogen.model import SLO, SLORules
from slogen.plugins.contract import PluginError, SLOPlugin

INFO_LABELS = "sloth.dev/contrib/info_labels/v1"
RULE_INTERVALS = "sloth.dev/contrib/rule_intervals/v1"
ALERT_FOR = "sloth.dev/contrib/alert_for/v1"


def _mapping(config: Any, plugin: str) -> dict:
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise PluginError(f"{plugin}: config must be a mapping, got {type(config).__name__}", "config")
    return config


def _known(config: dict, plugin: str, keys: tuple[str, ...]) -> None:
    extra = sorted(str(k) for k in config if k not in keys)
    if extra:
        raise PluginError(f"{plugin}: unknown config key(s) {', '.join(extra)} (known: {', '.join(keys)})",
                          extra[0])


def info_labels(config: Any) -> SLOPlugin:
    """Add `labels` to the info metric (`metricName`, default sloth_slo_info)."""
    cfg = _mapping(config, INFO_LABELS)
    _known(cfg, INFO_LABELS, ("labels", "metricName"))
    labels = cfg.get("labels")
    if not isinstance(labels, dict) or not labels:
        raise PluginError(f"{INFO_LABELS}: config.labels (a mapping of label to value) is required", "labels")
    labels = {str(k): str(v) for k, v in labels.items()}
    metric = str(cfg.get("metricName") or C.INFO)

    def apply(slo: SLO, rules: SLORules) -> None:
        for rule in rules.meta.rules:
            if rule.record == metric:
                rule.labels.update(labels)

    return apply


def _interval(value: Any, key: str) -> str:
    try:
        return format_prometheus_duration(parse_prometheus_duration(str(value)))
    except ValueError:
        raise PluginError(f"{RULE_INTERVALS}: interval.{key} {value!r} is not a Prometheus duration (e.g. 1m)",
                          f"interval.{key}") from None


def rule_intervals(config: Any) -> SLOPlugin:
    """Set the rule groups' evaluation interval: `interval.default`, overridden per group by
    `sliError`, `metadata` and `alert`."""
    cfg = _mapping(config, RULE_INTERVALS)
    _known(cfg, RULE_INTERVALS, ("interval",))
    iv = cfg.get("interval")
    if not isinstance(iv, dict) or not iv.get("default"):
        raise PluginError(f"{RULE_INTERVALS}: interval.default is required (e.g. interval: {{default: 1m}})",
                          "interval.default")
    _known(iv, RULE_INTERVALS, ("default", "sliError", "metadata", "alert"))
    default = _interval(iv["default"], "default")
    sli, meta, alert = (_interval(iv[k], k) if iv.get(k) else default for k in ("sliError", "metadata", "alert"))

    def apply(slo: SLO, rules: SLORules) -> None:
        rules.sli.interval, rules.meta.interval, rules.alerts.interval = sli, meta, alert

    return apply


def alert_for(config: Any) -> SLOPlugin:
    """Accepted for Sloth specs that chain it; `page_alert.for` / `ticket_alert.for` set the alerts' `for:`."""
    _known(_mapping(config, ALERT_FOR), ALERT_FOR, ())

    def apply(slo: SLO, rules: SLORules) -> None:
        return None

    return apply


PLUGINS = {INFO_LABELS: info_labels, RULE_INTERVALS: rule_intervals, ALERT_FOR: alert_for}
