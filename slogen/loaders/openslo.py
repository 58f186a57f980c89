"""OpenSLO: `openslo/v1alpha` `SLO` as Sloth reads it, and OpenSLO v1 `SLO`/`SLI` documents.

v1alpha (Sloth's mapping): one SLO per objective, id `<service>-<name>-<i>`, objective =
target x 100, `ratioMetrics.good/total` with `source: prometheus`, `queryType: promql`,
`timeWindows` of one `count: N, unit: Day`; alerts disabled.

v1: `SLO` with an inline `indicator` or an `indicatorRef` to an `SLI` document (same load);
`ratioMetric` with `good` or `bad` over `total`, or `raw` (`rawType: success|failure`);
`metricSource.type: Prometheus` queries must use `[{{.window}}]`; `timeWindow[0].duration`
is the period (rolling windows only); budgeting `Occurrences` only. One objective gives
the SLO `metadata.name`; several give `<name>-<i>`.

v1 alert policies (inline `AlertPolicy` or `alertPolicyRef`, conditions inline or by
`conditionRef`, from the same load) switch alerting on: slogen's multi-window multi-burn-rate
tiers, page tiers for conditions of severity page or critical, ticket tiers for the others,
labelled `openslo_alert_policy` for routing. A burn-rate condition's own threshold and windows
are not single rules here, since the tiers already cover fast and slow burns; a warning says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeGuard

from llmslo.durations import DAY, parse_prometheus_duration
from slogen.loaders import common as f
from slogen.loaders.common import Reporter
from slogen.model import SLI, SLO, Alerting, AlertMeta, EventsSLI, Origin, RatioSLI, RawSLI

V1ALPHA = "openslo/v1alpha"
V1 = "openslo/v1"
V1_KINDS_IGNORED = ("Service", "DataSource", "AlertPolicy", "AlertCondition", "AlertNotificationTarget")


def is_v1alpha(doc: object) -> bool:
    return isinstance(doc, dict) and doc.get("apiVersion") == V1ALPHA and doc.get("kind") == "SLO"


def is_v1(doc: object) -> TypeGuard[dict]:
    return isinstance(doc, dict) and doc.get("apiVersion") == V1


# --------------------------------------------------------------------------------------
# v1alpha
# --------------------------------------------------------------------------------------


def _identity(doc: dict, r: Reporter) -> tuple[dict, dict, str, str]:
    """metadata, spec, metadata.name and spec.service of an SLO document (both versions), checked."""
    meta = f.mapping(r, doc, "metadata", "", required=True)
    spec = f.mapping(r, doc, "spec", "", required=True)
    name = f.string(r, meta, "name", "metadata")
    service = f.string(r, spec, "service", "spec")
    f.check_name(r, service, "service", "spec.service", line=f.line_of(spec, "service"))
    f.check_name(r, name, "SLO name", "metadata.name", line=f.line_of(meta, "name"))
    return meta, spec, name, service


def load_v1alpha(doc: dict, r: Reporter, doc_index: int) -> list[SLO]:
    meta, spec, name, service = _identity(doc, r)
    period = None
    windows = spec.get("timeWindows") or []
    if isinstance(windows, list) and windows:
        if len(windows) > 1:
            r.error("only one time window is supported", "spec.timeWindows", line=f.line_of(spec, "timeWindows"),
                    fix="keep a single timeWindows entry")
        w = windows[0] if isinstance(windows[0], dict) else {}
        if str(w.get("unit", "")).lower() != "day":
            r.error("only day-based time windows are supported", "spec.timeWindows[0].unit",
                    line=f.line_of(w, "unit"), fix="write unit: Day")
        count = w.get("count")
        if not isinstance(count, int) or count <= 0:
            r.error("timeWindows[0].count must be a positive number of days", "spec.timeWindows[0].count",
                    line=f.line_of(w, "count"), fix="write count: 30")
        else:
            period = count * DAY
    objectives = spec.get("objectives")
    if not isinstance(objectives, list) or not objectives:
        r.error("at least one objective is required", "spec.objectives", line=f.line_of(spec, "objectives"),
                fix="add objectives: [{ratioMetrics: ..., target: 0.999}]")
        return []
    out = []
    for i, obj in enumerate(objectives):
        op = f"spec.objectives[{i}]"
        slo_name = f"{name}-{i}"
        slo_id = f"{service}-{slo_name}"
        if not isinstance(obj, dict):
            r.error("objective must be a mapping", op, slo=slo_id, fix="indent the objective's fields")
            continue
        target = f.number(r, obj, "target", op, slo=slo_id)
        objective = None if target is None else target * 100
        f.check_objective(r, objective, f"{op}.target", slo=slo_id, line=f.line_of(obj, "target"),
                          given=obj.get("target") is not None or obj.get("targetPercent") is not None)
        rm = f.mapping(r, obj, "ratioMetrics", op, slo=slo_id)
        if not rm:
            r.error("missing ratioMetrics", f"{op}.ratioMetrics", slo=slo_id, line=f.line_of(obj),
                    fix="add ratioMetrics: {good: {...}, total: {...}}")
            continue
        queries = {}
        for part in ("good", "total"):
            m = f.mapping(r, rm, part, f"{op}.ratioMetrics", slo=slo_id, required=True)
            mp = f"{op}.ratioMetrics.{part}"
            if m.get("source") not in ("prometheus", "sloth"):
                r.error(f"{part} source must be prometheus or sloth", f"{mp}.source", slo=slo_id,
                        line=f.line_of(m, "source"), fix="write source: prometheus")
            if m.get("queryType") != "promql":
                r.error(f"unsupported {part} query type {m.get('queryType')!r}", f"{mp}.queryType", slo=slo_id,
                        line=f.line_of(m, "queryType"), fix="write queryType: promql")
            queries[part] = f.string(r, m, "query", mp, slo=slo_id)
            f.check_query_template(r, queries[part], f"{mp}.query", slo=slo_id, line=f.line_of(m, "query"))
        if objective is None or not all(queries.values()):
            continue
        out.append(SLO(
            id=slo_id, service=service, name=slo_name, objective=objective,
            sli=RatioSLI(queries["good"], queries["total"]),
            description=f.string(r, spec, "description", "spec"), period=period,
            origin=Origin(file=r.file, doc=doc_index, path=op, line=f.line_of(obj), spec=V1ALPHA, mode="cli-gen-openslo",
                          tool="OpenSLO", objective_field=f"{op}.target", objective_line=f.line_of(obj, "target")),
        ))
    return out


# --------------------------------------------------------------------------------------
# v1
# --------------------------------------------------------------------------------------


def doc_name(doc: dict) -> str:
    meta = f.mapping_or_empty(doc, "metadata")
    return str(meta.get("name", ""))


@dataclass
class V1Refs:
    """The documents an OpenSLO v1 SLO may name, by kind and then by name, from the same load."""

    slis: dict[str, dict] = field(default_factory=dict)
    policies: dict[str, dict] = field(default_factory=dict)
    conditions: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def collect(cls, docs: list[object]) -> V1Refs:
        refs = cls()
        by_kind = {"SLI": refs.slis, "AlertPolicy": refs.policies, "AlertCondition": refs.conditions}
        for d in docs:
            if is_v1(d) and d.get("kind") in by_kind:
                by_kind[d["kind"]][doc_name(d)] = d
        return refs


def load_v1(doc: dict, r: Reporter, doc_index: int, refs: V1Refs) -> list[SLO]:
    kind = doc.get("kind")
    if kind == "SLI" or kind in V1_KINDS_IGNORED:
        return []  # SLIs are used through SLOs; the other kinds carry nothing slogen generates
    if kind != "SLO":
        r.error(f"unsupported OpenSLO v1 kind {kind!r}", "kind", line=f.line_of(doc, "kind"),
                fix="slogen reads SLO and SLI documents")
        return []
    meta, spec, name, service = _identity(doc, r)
    who = f"{service}-{name}"
    method = spec.get("budgetingMethod", "Occurrences")
    if method != "Occurrences":
        r.error(f"budgetingMethod {method!r} is not supported", "spec.budgetingMethod", slo=who,
                line=f.line_of(spec, "budgetingMethod"),
                fix="use Occurrences (for a time-based SLI, count good and bad time slices as events)")
    period = _v1_period(r, spec, who)
    sli = _v1_indicator(r, spec, who, refs.slis)
    labels = _v1_labels(r, meta, who)
    policies = _v1_alert_policies(r, spec, who, refs)
    objectives = spec.get("objectives")
    if not isinstance(objectives, list) or not objectives:
        r.error("at least one objective is required", "spec.objectives", slo=who, line=f.line_of(spec, "objectives"),
                fix="add objectives: [{target: 0.999}]")
        return []
    out = []
    for i, obj in enumerate(objectives):
        op = f"spec.objectives[{i}]"
        slo_name = name if len(objectives) == 1 else f"{name}-{i}"
        slo_id = f"{service}-{slo_name}"
        if not isinstance(obj, dict):
            r.error("objective must be a mapping", op, slo=slo_id, fix="indent the objective's fields")
            continue
        if obj.get("targetPercent") is not None:
            objective = f.number(r, obj, "targetPercent", op, slo=slo_id)
        else:
            target = f.number(r, obj, "target", op, slo=slo_id)
            objective = None if target is None else target * 100
        f.check_objective(r, objective, f"{op}.target", slo=slo_id, line=f.line_of(obj, "target"),
                          given=obj.get("target") is not None or obj.get("targetPercent") is not None)
        if sli is None or objective is None:
            continue
        key = "targetPercent" if obj.get("targetPercent") is not None else "target"
        out.append(SLO(
            id=slo_id, service=service, name=slo_name, objective=objective, sli=sli,
            description=f.string(r, spec, "description", "spec"), period=period, labels=labels,
            alerting=_alerting(slo_id, *policies),
            origin=Origin(file=r.file, doc=doc_index, path=op, line=f.line_of(obj), spec=V1, mode="cli-gen-openslo",
                          tool="OpenSLO", objective_field=f"{op}.{key}", objective_line=f.line_of(obj, key)),
        ))
    return out


PAGE_SEVERITIES = ("page", "critical")
LABEL_ALERT_POLICY = "openslo_alert_policy"


def _v1_alert_policies(r: Reporter, spec: dict, who: str, refs: V1Refs) -> tuple[list[str], list[str]]:
    """The names of the SLO's alert policies that want page alerts, and of those that want tickets."""
    items = spec.get("alertPolicies") or []
    if not isinstance(items, list):
        r.error("alertPolicies must be a list", "spec.alertPolicies", slo=who, line=f.line_of(spec, "alertPolicies"),
                fix="write alertPolicies: [{alertPolicyRef: name}] or inline AlertPolicy objects")
        return [], []
    page: list[str] = []
    ticket: list[str] = []
    for i, item in enumerate(items):
        p = f"spec.alertPolicies[{i}]"
        policy = _resolve(r, item, "alertPolicyRef", "AlertPolicy", refs.policies, p, who)
        if policy is None:
            continue
        name = doc_name(policy) or f"policy-{i}"
        pspec = f.mapping_or_empty(policy, "spec")
        if pspec.get("alertWhenBreaching") is False:
            r.warn(f"alert policy {name!r} does not alert when breaching, so it adds no alert", p, slo=who,
                   line=f.line_of(item), fix="set alertWhenBreaching: true, or remove the policy")
            continue
        severities = []
        for j, cond in enumerate(pspec.get("conditions") or []):
            cp = f"{p}.spec.conditions[{j}]"
            condition = _resolve(r, cond, "conditionRef", "AlertCondition", refs.conditions, cp, who)
            if condition is None:
                continue
            cspec = f.mapping_or_empty(condition, "spec")
            c = f.mapping_or_empty(cspec, "condition")
            if str(c.get("kind", "burnrate")).lower() != "burnrate":
                r.error(f"condition kind {c.get('kind')!r} is not supported", f"{cp}.spec.condition.kind", slo=who,
                        line=f.line_of(c, "kind"), fix="use kind: burnrate")
                continue
            severity = str(cspec.get("severity", "")).lower()
            severities.append(severity)
            r.warn(f"alert condition {doc_name(condition)!r} (burn rate {c.get('op', 'gt')} {c.get('threshold')} over "
                   f"{c.get('lookbackWindow')}) is served by slogen's multi-window multi-burn-rate "
                   f"{'page' if severity in PAGE_SEVERITIES else 'ticket'} tiers, not by a rule of its own",
                   f"{cp}.spec.condition", slo=who, line=f.line_of(cond),
                   fix="to change the tiers' windows and factors, load an AlertWindows catalog (--windows)")
        if not severities or any(s in PAGE_SEVERITIES for s in severities):
            page.append(name)
        if not severities or any(s not in PAGE_SEVERITIES for s in severities):
            ticket.append(name)
    return page, ticket


def _alerting(slo_id: str, page: list[str], ticket: list[str]) -> Alerting:
    """Alerting for one SLO from its policies' names; off (as without policies) when there are none."""
    if not page and not ticket:
        return Alerting()
    alert = f.alert_name_for(slo_id)

    def meta(names: list[str]) -> AlertMeta:
        if not names:
            return AlertMeta(disable=True)
        return AlertMeta(name=alert, labels={LABEL_ALERT_POLICY: ",".join(names)}, disable=False)

    return Alerting(name=alert, page=meta(page), ticket=meta(ticket))


def _resolve(r: Reporter, item: object, ref_key: str, kind: str, known: dict[str, dict], p: str, who: str) -> dict | None:
    """An inline object of `kind`, or the document its `ref_key` names."""
    if isinstance(item, dict) and ref_key in item:
        ref = str(item[ref_key])
        if ref not in known:
            r.error(f"{ref_key} {ref!r} names no {kind} document in the loaded files", f"{p}.{ref_key}", slo=who,
                    line=f.line_of(item, ref_key), fix=f"add an `apiVersion: openslo/v1, kind: {kind}` document named "
                                                       f"{ref}, or inline the {kind}")
            return None
        return known[ref]
    if isinstance(item, dict) and item.get("kind") == kind:
        return item
    r.error(f"expected an inline {kind} or a {ref_key}", p, slo=who, line=f.line_of(item) if isinstance(item, dict) else None,
            fix=f"write {{{ref_key}: name}} or an object with kind: {kind}")
    return None


def _v1_period(r: Reporter, spec: dict, who: str) -> int | None:
    tw = spec.get("timeWindow")
    if not tw:
        return None
    if not isinstance(tw, list) or len(tw) != 1 or not isinstance(tw[0], dict):
        r.error("timeWindow must be a list with one entry", "spec.timeWindow", slo=who,
                line=f.line_of(spec, "timeWindow"), fix="write timeWindow: [{duration: 30d, isRolling: true}]")
        return None
    w = tw[0]
    if w.get("isRolling") is False or w.get("calendar"):
        r.error("calendar-aligned time windows are not supported", "spec.timeWindow[0].isRolling", slo=who,
                line=f.line_of(w, "isRolling"), fix="use a rolling window: isRolling: true")
    try:
        return parse_prometheus_duration(str(w.get("duration", "")))
    except ValueError as e:
        r.error(str(e), "spec.timeWindow[0].duration", slo=who, line=f.line_of(w, "duration"),
                fix="write duration: 30d")
        return None


def _v1_labels(r: Reporter, meta: dict, who: str) -> dict[str, str]:
    out = {}
    raw = f.mapping_or_empty(meta, "labels")
    for k, v in raw.items():
        if not f.LABEL_NAME_RE.match(str(k)):
            r.warn(f"label {k!r} is not a Prometheus label name and is left out", f"metadata.labels.{k}", slo=who,
                   line=f.line_of(raw, k), fix="use letters, digits and underscores")
            continue
        out[str(k)] = ",".join(map(str, v)) if isinstance(v, list) else str(v)
    f.check_reserved(r, out, "metadata.labels", slo=who, line=f.line_of(meta, "labels"))
    return out


def _v1_indicator(r: Reporter, spec: dict, who: str, slis: dict[str, dict]) -> SLI | None:
    if spec.get("indicatorRef"):
        ref = str(spec["indicatorRef"])
        doc = slis.get(ref)
        if doc is None:
            r.error(f"indicatorRef {ref!r} names no SLI document in the loaded files", "spec.indicatorRef", slo=who,
                    line=f.line_of(spec, "indicatorRef"),
                    fix=f"add an `apiVersion: openslo/v1, kind: SLI` document named {ref} or inline the indicator")
            return None
        return _v1_sli_spec(r, doc.get("spec") or {}, "spec.indicatorRef->spec", who)
    ind = f.mapping(r, spec, "indicator", "spec", slo=who)
    if not ind:
        r.error("an indicator or indicatorRef is required", "spec.indicator", slo=who, line=f.line_of(spec),
                fix="add indicator: {metadata: {name: ...}, spec: {ratioMetric: ...}}")
        return None
    return _v1_sli_spec(r, f.mapping(r, ind, "spec", "spec.indicator", slo=who), "spec.indicator.spec", who)


def _v1_sli_spec(r: Reporter, s: dict, p: str, who: str) -> SLI | None:
    if s.get("thresholdMetric") is not None:
        r.error("thresholdMetric SLIs are not supported", f"{p}.thresholdMetric", slo=who,
                line=f.line_of(s, "thresholdMetric"), fix="express the SLI as a ratioMetric of good (or bad) and total events")
        return None
    rm = f.mapping(r, s, "ratioMetric", p, slo=who)
    if not rm:
        r.error("ratioMetric is required", f"{p}.ratioMetric", slo=who, line=f.line_of(s),
                fix="add ratioMetric: {good: ..., total: ...}")
        return None
    rp = f"{p}.ratioMetric"
    if rm.get("raw") is not None:
        q = _v1_query(r, rm, "raw", rp, who)
        raw_type = rm.get("rawType", "failure")
        if raw_type not in ("success", "failure"):
            r.error(f"rawType {raw_type!r} must be success or failure", f"{rp}.rawType", slo=who,
                    line=f.line_of(rm, "rawType"), fix="write rawType: failure")
            return None
        if q is None:
            return None
        return RawSLI(q if raw_type == "failure" else f"1 - (\n{q}\n)")
    total = _v1_query(r, rm, "total", rp, who)
    if rm.get("good") is not None and rm.get("bad") is not None:
        r.error("ratioMetric has both good and bad", rp, slo=who, line=f.line_of(rm), fix="keep one of them")
        return None
    if rm.get("bad") is not None:
        bad = _v1_query(r, rm, "bad", rp, who)
        return EventsSLI(bad, total) if bad and total else None
    good = _v1_query(r, rm, "good", rp, who)
    return RatioSLI(good, total) if good and total else None


def _v1_query(r: Reporter, rm: dict, part: str, rp: str, who: str) -> str | None:
    m = f.mapping(r, rm, part, rp, slo=who, required=True)
    ms = f.mapping(r, m, "metricSource", f"{rp}.{part}", slo=who, required=bool(m))
    mp = f"{rp}.{part}.metricSource"
    if not ms:
        return None
    if str(ms.get("type", "")).lower() != "prometheus":
        r.error(f"metric source type {ms.get('type')!r} is not supported", f"{mp}.type", slo=who,
                line=f.line_of(ms, "type"), fix="slogen generates Prometheus rules: use type: Prometheus")
        return None
    sp = f.mapping(r, ms, "spec", mp, slo=who, required=True)
    q = f.string(r, sp, "query", f"{mp}.spec", slo=who)
    f.check_query_template(r, q, f"{mp}.spec.query", slo=who, line=f.line_of(sp, "query"))
    return q or None
