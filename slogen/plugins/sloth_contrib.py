"""Sloth's small built-in SLO plugins (`sloth.dev/contrib/...`), so Sloth specs that chain them load.

Behaviour follows each plugin's README in Sloth (internal/plugin/slo/contrib, checked against its newest
source); written here from those descriptions. `alert_for/v1` is not in Sloth's tree: the `for:` it stands
for is read by the loader from `page_alert.for` / `ticket_alert.for`, so the plugin has nothing left to do.
Sloth's other contrib plugins are refused by name, with the reason (UNSUPPORTED).
"""

from __future__ import annotations

from typing import Any

from llmslo.conventions import SLO as C
from llmslo.durations import format_prometheus_duration, parse_prometheus_duration
from llmslo.gofloat import go_g
from slogen.gofmt import label_filter
from slogen.model import SLO, Rule, SLORules
from slogen.plugins.contract import PluginError, SLOPlugin

INFO_LABELS = "sloth.dev/contrib/info_labels/v1"
RULE_INTERVALS = "sloth.dev/contrib/rule_intervals/v1"
ALERT_FOR = "sloth.dev/contrib/alert_for/v1"
REMOVE_LABELS = "sloth.dev/contrib/remove_labels/v1"
BUDGET_EXHAUSTED = "sloth.dev/contrib/error_budget_exhausted_alert/v1"

# Sloth's contrib plugins slogen does not run, and why (the loader's error says it, naming the plugin).
UNSUPPORTED = {
    "sloth.dev/contrib/denominator_corrected_rules/v1": (
        "it replaces every SLI rule with traffic-corrected ones; slogen's SLIs are traffic-weighted already and "
        "its low-traffic guard keeps a few failures at night from paging (docs/slogen.md, \"Low traffic\")",
        "remove it from the chain"),
    "sloth.dev/contrib/validate_victoria_metrics/v1": (
        "slogen checks the queries as PromQL (run `slogen validate --promtool`), not as MetricsQL",
        "remove it from the chain"),
}


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


def _strings(cfg: dict, key: str, plugin: str) -> list[str]:
    value = cfg.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PluginError(f"{plugin}: {key} must be a list of names", key)
    return list(value)


def _string_map(cfg: dict, key: str, plugin: str) -> dict[str, str]:
    value = cfg.get(key) or {}
    if not isinstance(value, dict) or any(isinstance(v, (dict, list)) or v is None for v in value.values()):
        raise PluginError(f"{plugin}: {key} must be a mapping of names to strings", key)
    return {str(k): str(v) for k, v in value.items()}


def remove_labels(config: Any) -> SLOPlugin:
    """Drop the spec's own labels from the SLI and metadata recording rules (they break the period's rule
    when they change), keeping the SLO id labels, `sloth_window` on SLI rules, `preserveLabels`, and every
    label of the info metric and of the `skipMetrics`."""
    cfg = _mapping(config, REMOVE_LABELS)
    _known(cfg, REMOVE_LABELS, ("preserveLabels", "skipMetrics"))
    preserve = set(_strings(cfg, "preserveLabels", REMOVE_LABELS))
    skip = {C.INFO, *_strings(cfg, "skipMetrics", REMOVE_LABELS)}

    def apply(slo: SLO, rules: SLORules) -> None:
        keep = preserve | set(slo.id_labels)
        for group, kept in ((rules.sli, keep | {C.LABEL_WINDOW}), (rules.meta, keep)):
            for rule in group.rules:
                if rule.record not in skip:
                    rule.labels = {k: v for k, v in rule.labels.items() if k in kept}

    return apply


def error_budget_exhausted_alert(config: Any) -> SLOPlugin:
    """One more alert: the period's remaining error budget at or below `threshold` (default 0) for `for`
    (default 5m), named `alert_name` (ErrorBudgetExhausted), selected by the SLO's id and labels and
    `selector_labels`, labelled `alert_labels`, annotated `annotations`."""
    p = BUDGET_EXHAUSTED
    cfg = _mapping(config, p)
    _known(cfg, p, ("threshold", "for", "annotations", "alert_name", "alert_labels", "selector_labels"))
    threshold = cfg.get("threshold", 0)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
        raise PluginError(f"{p}: threshold must be a number (the remaining budget ratio, e.g. 0.05)", "threshold")
    try:
        wait = format_prometheus_duration(parse_prometheus_duration(str(cfg.get("for") or "5m")))
    except ValueError:
        raise PluginError(f"{p}: for {cfg.get('for')!r} is not a Prometheus duration (e.g. 5m)", "for") from None
    name = str(cfg.get("alert_name") or "ErrorBudgetExhausted")
    labels, annotations = _string_map(cfg, "alert_labels", p), _string_map(cfg, "annotations", p)
    selector = _string_map(cfg, "selector_labels", p)

    def apply(slo: SLO, rules: SLORules) -> None:
        match = {**slo.id_labels, **slo.labels, **selector}
        expr = f"{C.PERIOD_ERROR_BUDGET_REMAINING}{label_filter(match)} <= {go_g(float(threshold))}"
        rules.alerts.rules.append(Rule(expr=expr, alert=name, for_=wait, labels=dict(labels),
                                       annotations=dict(annotations)))

    return apply


PLUGINS = {INFO_LABELS: info_labels, RULE_INTERVALS: rule_intervals, ALERT_FOR: alert_for,
           REMOVE_LABELS: remove_labels, BUDGET_EXHAUSTED: error_budget_exhausted_alert}
