"""Pyrra `pyrra.dev/v1alpha1` `ServiceLevelObjective` (the CRD, or a file in Pyrra's filesystem mode).

Mapping (docs/slogen.md, "Moving from Pyrra"):
  * SLO name = `metadata.name`, service = `metadata.namespace` (`pyrra` without one); `target` is a
    percent string, `window` the period, and the SLO carries Pyrra's alert windows for it
    (`slogen.loaders.windows.pyrra`: factors 14, 7, 2, 1 with Pyrra's `for:`), not the period's catalog;
  * indicators: `ratio` (errors / total), `latency` (total - success bucket), `latencyNative`
    (`histogram_fraction` up to `latency`) and `bool_gauge` (samples at 0 over all samples), each
    aggregated `by` its `grouping`, as Pyrra's burn-rate rules are;
  * `pyrra.dev/*` metadata labels and annotations go onto the rules and alerts without the prefix, as
    Pyrra propagates them; the other metadata labels label the generated PrometheusRule;
  * `alerting.name` names the burn alert (default `ErrorBudgetBurn`); `alerting.disabled` or
    `burnrates: false` turn the alerts off; `severities` set the `severity` label per severity.
What would change when an alert fires and has no equal here is refused (`ruleOutput` label splits,
different severities within a page or ticket pair); Pyrra's rule-shape knobs are ignored with a warning.
"""

from __future__ import annotations

import re

from llmslo import fields
from llmslo.durations import parse_prometheus_duration
from slogen.loaders import common as f
from slogen.loaders.common import Reporter
from slogen.loaders.sloth import ALERT_NAME_RE
from slogen.loaders.windows import pyrra as pyrra_windows
from slogen.model import SLI, SLO, Alerting, AlertMeta, AlertWindows, EventsSLI, Origin

API_VERSION = "pyrra.dev/v1alpha1"
KIND = "ServiceLevelObjective"
PREFIX = "pyrra.dev/"  # Pyrra's PropagationLabelsPrefix
DEFAULT_SERVICE = "pyrra"  # an SLO without metadata.namespace
DEFAULT_ALERT = "ErrorBudgetBurn"  # Pyrra's default alert name
SLO_LABEL = "slo"  # the label naming the SLO on each of Pyrra's alerts
W = "{{.window}}"

SPEC_KEYS = ("description", "target", "window", "indicator", "alerting", "partial_response_strategy",
             "performanceOverAccuracy", "ruleOutput")
INDICATORS = ("ratio", "latency", "latencyNative", "bool_gauge")
ALERTING_KEYS = ("disabled", "burnrates", "absent", "name", "absentName", "severities")
SEVERITY_KEYS = ("absent", "fastBurn", "mediumBurn", "slowBurn", "longTermBurn")
# A vector selector: an optional metric name and an optional {matchers} (the lexical check does the rest).
_SELECTOR = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(\{.*\})?\s*$", re.S)
_LE = re.compile(r'\ble\s*=\s*"([^"]*)"')


def is_spec(doc: object) -> bool:
    return isinstance(doc, dict) and doc.get("apiVersion") == API_VERSION and doc.get("kind") == KIND


def load(doc: dict, r: Reporter, doc_index: int) -> list[SLO]:
    """Map one ServiceLevelObjective to an SLO, reporting every problem into `r`."""
    meta = f.mapping(r, doc, "metadata", "", required=True)
    spec = f.mapping(r, doc, "spec", "", required=True)
    name = f.string(r, meta, "name", "metadata")
    namespace = f.string(r, meta, "namespace", "metadata")
    service = namespace or DEFAULT_SERVICE
    f.check_name(r, name, "SLO name", "metadata.name", line=f.line_of(meta, "name"))
    who = f"{service}-{name}" if name else "#metadata.name"
    f.unknown_keys(r, spec, SPEC_KEYS, "spec", slo=who, elsewhere={k: "spec.indicator" for k in INDICATORS})
    all_labels = _k8s_map(r, meta, "labels", who)
    all_ann = _k8s_map(r, meta, "annotations", who)
    labels = _propagated(r, all_labels, meta, "labels", who, check=True)
    annotations = _propagated(r, all_ann, meta, "annotations", who, check=False)

    objective = _target(r, spec, who)
    period, windows = _window(r, spec, who)
    sli = _indicator(r, spec, who)
    alerting = _alerting(r, spec, who, annotations, {SLO_LABEL: name})
    _ignored(r, spec, who)
    if not name or objective is None or period is None or windows is None or sli is None:
        return []
    origin = Origin(file=r.file, doc=doc_index, path="spec", line=f.line_of(doc), spec=API_VERSION, mode="cli-gen-pyrra",
                    tool="Pyrra", objective_field="spec.target", objective_line=f.line_of(spec, "target"),
                    k8s_name=name, k8s_namespace=namespace,
                    k8s_labels={k: v for k, v in all_labels.items() if not k.startswith(PREFIX)},
                    k8s_annotations={k: v for k, v in all_ann.items() if not k.startswith(PREFIX)})
    return [SLO(id=f"{service}-{name}", service=service, name=name, objective=objective, sli=sli,
                description=f.string(r, spec, "description", "spec", slo=who), period=period, labels=labels,
                alerting=alerting, windows=windows, origin=origin)]


def _k8s_map(r: Reporter, meta: dict, key: str, who: str) -> dict[str, str]:
    """metadata.labels / annotations as Kubernetes allows them (keys like pyrra.dev/team), values as strings."""
    raw = f.mapping(r, meta, key, "metadata", slo=who)
    out = {}
    for k, v in raw.items():
        if v is None or isinstance(v, (dict, list)):
            r.error(f"{key[:-1]} {k!r} must have a string value", f"metadata.{key}.{k}", slo=who,
                    line=f.line_of(raw, k), fix=f'write {k}: "value"')
            continue
        out[str(k)] = fields.scalar(v)
    return out


def _propagated(r: Reporter, values: dict[str, str], meta: dict, key: str, who: str, check: bool) -> dict[str, str]:
    """`pyrra.dev/<name>` entries as `<name>`: what Pyrra copies onto its rules (labels) and alerts."""
    out = {k[len(PREFIX):]: v for k, v in values.items() if k.startswith(PREFIX)}
    for k in out:
        if not f.LABEL_NAME_RE.match(k):
            r.error(f"{key[:-1]} {PREFIX}{k}: {k!r} is not a valid Prometheus label name", f"metadata.{key}.{PREFIX}{k}",
                    slo=who, line=f.line_of(meta, key), fix="use letters, digits and underscores after pyrra.dev/")
    if check:
        f.check_reserved(r, out, f"metadata.{key}", slo=who, line=f.line_of(meta, key))
    return out


def _target(r: Reporter, spec: dict, who: str) -> float | None:
    if spec.get("target") is None:
        r.error("target is required", "spec.target", slo=who, line=f.line_of(spec), fix='write target: "99.9" (a percent)')
        return None
    value = f.number(r, spec, "target", "spec", slo=who, example='"99.9"')
    if value is None:
        return None
    if not 0 < value < 100:
        r.error(f"target {value:g} is out of range: it must be above 0 and below 100", "spec.target", slo=who,
                line=f.line_of(spec, "target"), fix='write the target as a percent, e.g. target: "99.9" (not 0.999)')
        return None
    if value < 1:
        r.warn(f"target {value:g} is a percent: {value:g}% of events must be good", "spec.target", slo=who,
               line=f.line_of(spec, "target"), fix=f'write target: "{value * 100:g}" if you meant {value * 100:g}%')
    return value


def _window(r: Reporter, spec: dict, who: str) -> tuple[int | None, AlertWindows | None]:
    text = f.string(r, spec, "window", "spec", slo=who)
    line = f.line_of(spec, "window") or f.line_of(spec)
    if not text:
        r.error("window is required", "spec.window", slo=who, line=line, fix="write window: 28d")
        return None, None
    try:
        period = parse_prometheus_duration(text)
    except ValueError as e:
        r.error(str(e), "spec.window", slo=who, line=line, fix="write a Prometheus duration, e.g. window: 28d")
        return None, None
    windows = pyrra_windows(period) if period > 0 else None
    if windows is None:
        r.error(f"window {text} is too short for Pyrra's alert windows: its shortest (window/8064) rounds to 0m",
                "spec.window", slo=who, line=line, fix="use a window of 7d or more, e.g. window: 28d")
        return None, None
    return period, windows


def _by(r: Reporter, node: dict, p: str, who: str) -> tuple[str, ...]:
    raw = node.get("grouping")
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(g, str) and f.LABEL_NAME_RE.match(g) for g in raw):
        r.error("grouping must be a list of label names", f"{p}.grouping", slo=who, line=f.line_of(node, "grouping"),
                fix="write grouping: [handler, method]")
        return ()
    return tuple(sorted(set(raw)))


def _selector(r: Reporter, node: dict, key: str, p: str, who: str) -> str:
    """`<key>.metric` (or, for bool_gauge, `metric` itself when key is ""): a vector selector."""
    q = f.mapping(r, node, key, p, slo=who, required=True) if key else node
    qp = f.join(p, key)
    metric = f.string(r, q, "metric", qp, slo=who).strip()
    line = f.line_of(q, "metric") or f.line_of(node, key or None)
    if not metric:
        r.error("metric is required", f"{qp}.metric", slo=who, line=line, fix='write metric: http_requests_total{job="api"}')
        return ""
    m = _SELECTOR.match(metric)
    problem = f.promql_lexical_problem(metric)
    if m is None or not (m.group(1) or m.group(2)) or "[" in metric or problem:
        r.error(f"metric {metric!r} is not a vector selector" + (f" ({problem})" if problem else ""), f"{qp}.metric",
                slo=who, line=line, fix='write a metric name with optional matchers, e.g. http_requests_total{code=~"5.."}; '
                                        "Pyrra takes no functions or ranges here")
        return ""
    return metric


def _sum(by: tuple[str, ...], inner: str) -> str:
    return f"sum by ({', '.join(by)}) ({inner})" if by else f"sum({inner})"


def _indicator(r: Reporter, spec: dict, who: str) -> SLI | None:
    ind = f.mapping(r, spec, "indicator", "spec", slo=who, required=True)
    if not ind:
        return None
    if "boolGauge" in ind and "bool_gauge" not in ind:
        r.error("Pyrra spells this indicator bool_gauge", "spec.indicator.boolGauge", slo=who,
                line=f.line_of(ind, "boolGauge"), fix="rename boolGauge to bool_gauge")
        return None
    f.unknown_keys(r, ind, INDICATORS, "spec.indicator", slo=who)
    kinds = [k for k in INDICATORS if ind.get(k) is not None]
    if len(kinds) != 1:
        r.error("exactly one indicator is required" + (f", found {', '.join(kinds)}" if kinds else ""),
                "spec.indicator", slo=who, line=f.line_of(spec, "indicator"),
                fix=f"keep one of {', '.join(INDICATORS)}")
        return None
    kind = kinds[0]
    p = f"spec.indicator.{kind}"
    node = f.mapping(r, ind, kind, "spec.indicator", slo=who)
    by = _by(r, node, p, who)
    if kind == "ratio":
        f.unknown_keys(r, node, ("errors", "total", "grouping"), p, slo=who)
        errors, total = _selector(r, node, "errors", p, who), _selector(r, node, "total", p, who)
        if not (errors and total):
            return None
        return EventsSLI(_sum(by, f"rate({errors}[{W}])"), _sum(by, f"rate({total}[{W}])"), sources=(total,), by=by)
    if kind == "latency":
        f.unknown_keys(r, node, ("success", "total", "grouping"), p, slo=who)
        success, total = _selector(r, node, "success", p, who), _selector(r, node, "total", p, who)
        if success and not _le_ok(success):
            r.error('the success metric needs an le="<seconds>" matcher: the bucket of the fast enough requests',
                    f"{p}.success.metric", slo=who, line=f.line_of(node.get("success"), "metric"),
                    fix='add the bucket bound, e.g. http_request_duration_seconds_bucket{le="0.5"}')
            return None
        if not (success and total):
            return None
        tot = _sum(by, f"rate({total}[{W}])")
        return EventsSLI(f"{tot}\n-\n{_sum(by, f'rate({success}[{W}])')}", tot, sources=(total,), by=by)
    if kind == "latencyNative":
        f.unknown_keys(r, node, ("total", "latency", "grouping"), p, slo=who)
        total = _selector(r, node, "total", p, who)
        seconds = _latency(r, node, p, who)
        if not total or seconds is None:
            return None
        hist = _sum(by, f"rate({total}[{W}])")
        return EventsSLI(f"histogram_count({hist})\n*\n(1 - histogram_fraction(0, {seconds:g}, {hist}))",
                         f"histogram_count({hist})", sources=(total,), by=by)
    f.unknown_keys(r, node, ("metric", "grouping"), p, slo=who)
    metric = _selector(r, node, "", p, who)
    if not metric:
        return None
    # Each sample is an event (a probe, a scrape of `up`): bad when 0. Samples never run low, as the
    # rule-evaluation samples of a time-based SLI, so no low-traffic guard.
    count = _sum(by, f"count_over_time({metric}[{W}])")
    return EventsSLI(f"{count}\n-\n{_sum(by, f'sum_over_time({metric}[{W}])')}", count, sources=(metric,), by=by,
                     time_based=True)


def _le_ok(selector: str) -> bool:
    m = _LE.search(selector)
    if m is None:
        return False
    try:
        float(m.group(1))
    except ValueError:
        return False
    return True


def _latency(r: Reporter, node: dict, p: str, who: str) -> float | None:
    text = f.string(r, node, "latency", p, slo=who)
    line = f.line_of(node, "latency") or f.line_of(node)
    try:
        ms = parse_prometheus_duration(text) if text else 0
    except ValueError as e:
        r.error(str(e), f"{p}.latency", slo=who, line=line, fix="write a duration, e.g. latency: 200ms")
        return None
    if ms <= 0:
        r.error("latency must be a positive duration", f"{p}.latency", slo=who, line=line,
                fix="write the objective's latency, e.g. latency: 200ms")
        return None
    return ms / 1000


def _alerting(r: Reporter, spec: dict, who: str, annotations: dict[str, str], own: dict[str, str]) -> Alerting:
    """The burn alerts; `own`: the label Pyrra puts on each (slo: <metadata.name>), which tells apart the alerts
    of several SLOs sharing one alert name (promtool's duplicate-rules lint, Alertmanager's grouping)."""
    al = f.mapping(r, spec, "alerting", "spec", slo=who)
    ap = "spec.alerting"
    f.unknown_keys(r, al, ALERTING_KEYS, ap, slo=who)
    disabled = f.boolean(r, al, "disabled", ap, slo=who)
    burnrates = True if al.get("burnrates") is None else f.boolean(r, al, "burnrates", ap, slo=who)
    name = f.string(r, al, "name", ap, slo=who) or DEFAULT_ALERT
    if not ALERT_NAME_RE.match(name):
        r.error(f"alert name {name!r} is not a valid Prometheus alert name", f"{ap}.name", slo=who,
                line=f.line_of(al, "name"), fix="use letters, digits, '_' and ':' only, e.g. APIServerErrorBudgetBurn")
    if al.get("absent") is False:
        r.warn("absent: false is not followed: slogen always adds its no-data alert to an SLO's burn alerts",
               f"{ap}.absent", slo=who, line=f.line_of(al, "absent"),
               fix="remove absent: false (route or silence the no-data alert, slo_tier=\"no-data\", in Alertmanager)")
    if al.get("absentName"):
        r.warn("absentName is not followed: slogen's no-data alert is named after the burn alert",
               f"{ap}.absentName", slo=who, line=f.line_of(al, "absentName"),
               fix='route the no-data alert on its slo_tier="no-data" label instead, and remove absentName')
    page_labels, ticket_labels = _severities(r, al, ap, who)
    if disabled or not burnrates:
        return Alerting(name=name)  # both severities disabled
    return Alerting(name=name,
                    page=AlertMeta(name=name, labels={**own, **page_labels}, annotations=dict(annotations), disable=False),
                    ticket=AlertMeta(name=name, labels={**own, **ticket_labels}, annotations=dict(annotations),
                                     disable=False))


def _severities(r: Reporter, al: dict, ap: str, who: str) -> tuple[dict[str, str], dict[str, str]]:
    """Pyrra's per-tier `severity` values; slogen labels a page and a ticket (two tiers each) alike."""
    sev = f.mapping(r, al, "severities", ap, slo=who)
    sp = f"{ap}.severities"
    f.unknown_keys(r, sev, SEVERITY_KEYS, sp, slo=who)
    out = []
    for first, second, kind in (("fastBurn", "mediumBurn", "page"), ("slowBurn", "longTermBurn", "ticket")):
        a, b = f.string(r, sev, first, sp, slo=who), f.string(r, sev, second, sp, slo=who)
        if a and b and a != b:
            r.error(f"{first} ({a}) and {second} ({b}) differ: slogen labels both {kind} tiers alike", f"{sp}.{second}",
                    slo=who, line=f.line_of(sev, second), fix=f"give {first} and {second} the same severity")
        value = a or b
        out.append({"severity": value} if value else {})
    if sev.get("absent"):
        r.warn("severities.absent is not followed: slogen's no-data alert is a ticket (severity warning)",
               f"{sp}.absent", slo=who, line=f.line_of(sev, "absent"), fix="remove severities.absent")
    return out[0], out[1]


def _ignored(r: Reporter, spec: dict, who: str) -> None:
    """Pyrra's knobs: rule shapes and Thanos options are not needed here; label splits cannot be kept."""
    for key, why in (("performanceOverAccuracy", "slogen's long windows always come from its 5m rates"),
                     ("partial_response_strategy", "a Thanos ruler option, not part of the rules")):
        if spec.get(key) is not None:
            r.warn(f"{key} is ignored: {why}", f"spec.{key}", slo=who, line=f.line_of(spec, key), fix=f"remove {key}")
    out = f.mapping(r, spec, "ruleOutput", "spec", slo=who)
    for key in ("shortRulesLabels", "longRulesLabels"):
        if out.get(key):
            r.error(f"ruleOutput.{key} is not supported: slogen writes one rule group per SLO and cannot send short- "
                    "and long-window rules to different rulers", f"spec.ruleOutput.{key}", slo=who,
                    line=f.line_of(out, key), fix="remove it and load the generated rules into one ruler")
    if out.get("enableDescriptionAsLabel") is not None:
        r.warn("ruleOutput.enableDescriptionAsLabel is ignored: the description is the SLO's own (in its dashboard "
               "and alert text)", "spec.ruleOutput.enableDescriptionAsLabel", slo=who,
               line=f.line_of(out, "enableDescriptionAsLabel"), fix="remove it")
    f.unknown_keys(r, out, ("shortRulesLabels", "longRulesLabels", "enableDescriptionAsLabel"), "spec.ruleOutput",
                   slo=who)

