"""The no-data alert's generated tests: no source series at all, one cluster of two going dark (it fires for that
cluster only) and every cluster dark (it fires once, from `absent()`)."""

from __future__ import annotations

from dataclasses import replace

from llmslo.conventions import SLO as C
from llmslo.durations import format_prometheus_duration
from llmslo.selectors import parse_selector
from slogen.model import SeriesFixture
from slogen.plugins.contract import PluginError
from slogen.promtests.checks import expected
from slogen.promtests.series import fixture_series, staged
from slogen.rules import SLOResult
from slogen.rules.alerts import no_data_lookback, no_data_scope, no_data_selectors, sli_by


def no_data_group(r: SLOResult, step: int) -> dict:
    rule = next(x for x in r.rules.alerts.rules if x.labels.get(C.LABEL_TIER) == "no-data")
    wait = 2 * r.ctx.base_window
    label_sets = []
    for sel in no_data_selectors(r.ctx):
        labels = _equality_labels(sel)
        if labels not in label_sets:
            label_sets.append(labels)
    return {
        "name": f"{r.slo.id}: no source series, so the no-data alert fires after {format_prometheus_duration(wait)}",
        "interval": format_prometheus_duration(step),
        "input_series": [{"series": 'up{job="unrelated"}', "values": f"1+0x{wait // step + 2}"}],
        "alert_rule_test": [
            {"eval_time": format_prometheus_duration(wait - step), "alertname": rule.alert, "exp_alerts": []},
            {"eval_time": format_prometheus_duration(wait + step), "alertname": rule.alert,
             "exp_alerts": [expected(rule, labels) for labels in label_sets]},
        ],
    }


LOOKBACK_DELTA_MS = 300_000  # Prometheus' default: how long an instant selector still sees a series after its last sample


def scope_dark_groups(r: SLOResult, fixtures: tuple[SeriesFixture, ...], step: int) -> list[dict]:
    """Per cluster (the SLI's first `by` label, or the `cluster` of its sources when it sums them):
    two clusters report clean traffic and one goes dark, so the no-data alert fires for that cluster
    only, after its recorded rate (or its sources) lapses plus `for`; and both go dark, so it fires
    once, from `absent()`, not once per cluster."""
    scope = no_data_scope(r.ctx)
    fixtures = tuple(staged(fixtures, ""))
    # The SLI keeps the scope labels (its `by`), so the arm watches its recorded rate; or it sums
    # them away, so the arm watches its sources, whose series carry `cluster` (added below).
    recorded = bool(sli_by(r.slo.sli))
    if not scope or (recorded and not all(label in f.labels for f in fixtures for label in scope)):
        return []
    rule = next(x for x in r.rules.alerts.rules if x.labels.get(C.LABEL_TIER) == "no-data")
    label = scope[0]
    others = {name: {f.labels.get(name, "") for f in fixtures} for name in scope[1:]}
    if any(len(values) != 1 for values in others.values()):
        return []
    w = max(1, r.ctx.base_window // step)  # steps per base window
    wait = -(-2 * r.ctx.base_window // step)  # the alert's `for`, in steps
    stop = 2 * w + 2  # samples of a cluster that goes dark: enough for its recorded rate to exist
    # Its recorded rate lapses within one base window of its last sample (its sources, within the
    # instant lookback); then `for` runs.
    lapse = w if recorded else -(-LOOKBACK_DELTA_MS // step)
    quiet_until, firing_at = stop + wait - 1, stop + lapse + wait + 2
    if (firing_at - stop + 1) * step >= no_data_lookback(r.ctx):
        return []

    def series(lengths: dict[str, int]) -> list[dict]:
        return [fixture_series(replace(f, labels={**f.labels, label: value}), [0.0] * n)
                for value, n in lengths.items() for f in fixtures]

    one_dark = {label: "dark", **{name: values.pop() for name, values in others.items()}}
    # Both dark: absent() holds once the sources leave the instant lookback; then `for` runs.
    absent_from = -(-((stop - 1) * step + LOOKBACK_DELTA_MS) // step) + 1
    label_sets = []
    for sel in no_data_selectors(r.ctx):
        if (labels := _equality_labels(sel)) not in label_sets:
            label_sets.append(labels)
    return [
        {"name": f"{r.slo.id}: one {label} of two goes dark, so the no-data alert fires for that {label} only",
         "interval": format_prometheus_duration(step),
         "input_series": series({"lit": firing_at + 1, "dark": stop}),
         "alert_rule_test": [
             {"eval_time": format_prometheus_duration(quiet_until * step), "alertname": rule.alert, "exp_alerts": []},
             {"eval_time": format_prometheus_duration(firing_at * step), "alertname": rule.alert,
              "exp_alerts": [expected(rule, one_dark)]}]},
        {"name": f"{r.slo.id}: every {label} goes dark, so the no-data alert fires once, not once per {label}",
         "interval": format_prometheus_duration(step),
         "input_series": series({"dark": stop, "also-dark": stop}),
         "alert_rule_test": [
             {"eval_time": format_prometheus_duration((absent_from + wait + 1) * step), "alertname": rule.alert,
              "exp_alerts": [expected(rule, labels) for labels in label_sets]}]},
    ]


def _equality_labels(sel: str) -> dict[str, str]:
    body = sel[sel.index("{"):] if "{" in sel else ""
    try:
        return {n: v for n, op, v in parse_selector(body) if op == "=" and n != "__name__"}
    except PluginError:
        return {}
