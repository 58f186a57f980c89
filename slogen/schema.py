"""The JSON Schema of the files slogen reads, for editors' YAML language servers: generated, never written by hand.

Every key list comes from the loader that checks it (slogen/loaders/sloth.py, slogen/autoscaling.py: KEYS), the
`llmslo/*` plugin options and choices from the plugin contract (llmslo/sli_plugins.py), the numeric ranges from
llmslo/ranges.py, each threshold's kind, range and help from its row (slogen/rules/knobs.py); `slogen schema`
writes it to schemas/slogen.schema.json and a test regenerates it, so the committed file cannot drift from what `slogen validate` accepts. The schema is a typing aid: it refuses unknown
keys and misspelt options as the loader does, but `slogen validate` stays the judge (PromQL, bucket edges,
reachability are beyond a schema).
"""

from __future__ import annotations

import json
import math
from typing import Any

from llmslo import sli_plugins as sp
from llmslo.engine_thresholds import ROUNDINGS
from llmslo.ranges import ALLOW_KEY, RANGES
from slogen import autoscaling, thresholds
from slogen.loaders import sloth, windows
from slogen.rules.knobs import Threshold, thresholds_of

SCHEMA_PATH = "schemas/slogen.schema.json"  # relative to the repository root; the examples reference it
DRAFT = "https://json-schema.org/draft/2020-12/schema"
DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|y|w|d|h|m|s))+$", "description": "a Prometheus duration, e.g. 30d"}
SCALAR = {"type": ["string", "number", "boolean"]}  # plugin options and labels: YAML scalars, read as text


def _closed(keys: tuple[str, ...], props: dict[str, Any], required: tuple[str, ...] = (), **extra: Any) -> dict:
    """An object holding exactly `keys` (a key without a typed property may hold anything)."""
    out: dict[str, Any] = {"type": "object", "properties": {k: props.get(k, {}) for k in keys},
                           "additionalProperties": False}
    if required:
        out["required"] = list(required)
    out.update(extra)
    return out


def _ranged(name: str) -> dict:
    r = RANGES[name]
    return {"minimum": r.lo, "maximum": r.hi}


def _option_props(plugin: str, ranged: bool) -> dict[str, Any]:
    props: dict[str, Any] = {k: dict(SCALAR) for k in sp.OPTIONS[plugin]}
    enums = {"metric": tuple(sp.LATENCY_METRICS), "source": sp.SOURCES, "threshold_rounding": ROUNDINGS}
    for key, choices in enums.items():
        if key in props:
            props[key] = {"enum": list(choices)}
    if ranged:
        for key in ("ttft", "tpot"):
            if key in props:
                props[key] = {"type": ["string", "number"], **_ranged(key), "description": RANGES[key].describe()}
        if plugin == sp.KV_HEADROOM:
            props["threshold"] = {"type": ["string", "number"], **_ranged("kv_ratio"),
                                  "description": RANGES["kv_ratio"].describe()}
    return props


def _plugin(ranged: bool) -> dict:
    """sli.plugin: an `llmslo/*` id gets its exact options (a latency threshold its metric's range); any other id
    (a Sloth plugin registered with slogen) a mapping of scalars."""
    cases: list[dict] = []
    for pid in sp.PLUGIN_IDS:
        options = _closed(sp.OPTIONS[pid], _option_props(pid, ranged))
        if pid == sp.LATENCY and ranged:
            options["allOf"] = [{"if": {"properties": {"metric": {"const": m}}, "required": ["metric"]},
                                 "then": {"properties": {"threshold": {"type": ["string", "number"], **_ranged(m),
                                                                       "description": RANGES[m].describe()}}}}
                                for m in sp.LATENCY_METRICS]
        cases.append({"if": {"properties": {"id": {"const": pid}}, "required": ["id"]},
                      "then": {"properties": {"options": options}}})
    return _closed(sloth.PLUGIN_KEYS, {"id": {"type": "string"},
                                       "options": {"type": "object", "additionalProperties": SCALAR}},
                   ("id",), allOf=cases)


def _sli(ranged: bool) -> dict:
    d = sloth.PROMETHEUS_V1
    return _closed(sloth.SLI_KEYS, {
        "events": _closed((d.error_query, d.total_query), {}, (d.error_query, d.total_query)),
        "raw": _closed((d.error_ratio_query,), {}, (d.error_ratio_query,)),
        "plugin": _plugin(ranged),
    }, minProperties=1, maxProperties=1)


def _sloth_spec() -> dict:
    d = sloth.PROMETHEUS_V1
    labels = {"type": "object", "additionalProperties": SCALAR}
    alert = _closed(sloth.ALERT_KEYS, {"disable": {"type": "boolean"}, "labels": labels, "annotations": labels})
    slo_plugins = _closed(("overridePrevious", "chain"), {
        "overridePrevious": {"type": "boolean"},
        "chain": {"type": "array", "items": _closed(sloth.SLO_PLUGIN_KEYS, {"id": {"type": "string"},
                                                                             "priority": {"type": "integer"}},
                                                    ("id",))}})
    min_bad = {"type": "integer", "minimum": 0}
    objective = {"type": "number", "exclusiveMinimum": 0, "maximum": 100}
    slo = _closed(sloth.slo_keys(d), {
        "name": {"type": "string"}, "description": {"type": "string"}, "objective": objective,
        "plugins": slo_plugins, "labels": labels, "sli": {"$ref": "#/$defs/sli"}, "period": DURATION,
        "alerting": _closed(sloth.alerting_keys(d), {"name": {"type": "string"}, "labels": labels,
                                                    "annotations": labels, d.page_alert: alert,
                                                    d.ticket_alert: alert}),
        d.page_min_bad_events: min_bad,
        d.allow_out_of_range: {"type": "boolean", "description": "accept values outside llmslo/ranges.py"},
    }, ("name", "objective", "sli"))
    # Unless the SLO allows values out of range, the objective and every plugin threshold stay in their range.
    slo["allOf"] = [{"if": {"properties": {ALLOW_KEY: {"const": True}}, "required": [ALLOW_KEY]},
                     "then": {"properties": {"sli": {"$ref": "#/$defs/sli"}}},
                     "else": {"properties": {"objective": {**_ranged("objective"),
                                                           "description": RANGES["objective"].describe()},
                                             "sli": {"$ref": "#/$defs/sli_ranged"}}}}]
    return _closed(sloth.spec_keys(d), {
        "version": {"const": d.spec}, "service": {"type": "string"}, "labels": labels, "slo_plugins": slo_plugins,
        "slos": {"type": "array", "minItems": 1, "items": slo}, "period": DURATION, d.page_min_bad_events: min_bad,
    }, ("version", "service", "slos"))


def _autoscaling_spec() -> dict:
    keys = autoscaling.KEYS

    def obj(name: str, props: dict[str, Any] | None = None) -> dict:
        allowed, required = keys[name]
        return _closed(allowed, props or {}, required)

    number = {"type": "number"}
    policy = obj("policy")
    triggers = obj("triggers", {
        "queue_depth": obj("queue_depth", {"per_replica": number}),
        "kv_cache_utilization": obj("kv_cache_utilization", {"per_replica": number}),
        "kv_seats": obj("kv_seats", {"min_free": number}),
        "ttft_burn_rate": obj("ttft_burn_rate", {"slo": {"type": "string", "pattern": "^[^/]+/[^/]+$"},
                                                 "above": number,
                                                 "window": {"enum": list(autoscaling.SHORT_WINDOWS)}}),
    })
    pool = obj("pool", {
        "name": {"type": "string"}, "namespace": {"type": "string"},
        "target": obj("target", {"kind": {"enum": list(autoscaling.TARGET_KINDS)}, "name": {"type": "string"}}),
        "replicas": obj("replicas", {"min": {"type": "integer", "minimum": 0}, "max": {"type": "integer"}}),
        "match": _closed(autoscaling.MATCH_LABELS, {k: {"type": "string"} for k in autoscaling.MATCH_LABELS}),
        "triggers": triggers, "wake": obj("wake", {"window": {"enum": list(autoscaling.SHORT_WINDOWS)}}),
        "scale_up": policy, "scale_down": policy,
    })
    return obj("spec", {"version": {"const": autoscaling.VERSION},
                        "pools": {"type": "array", "items": pool}})


def _alert_windows() -> dict:
    tier = _closed(("errorBudgetPercent", "shortWindow", "longWindow", "burnFactor", "for"),
                   {"errorBudgetPercent": {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
                    "shortWindow": DURATION, "longWindow": DURATION,
                    "burnFactor": {"type": "number", "exclusiveMinimum": 0}, "for": DURATION},
                   ("shortWindow", "longWindow"))
    severity = _closed(("quick", "slow"), {"quick": tier, "slow": tier}, ("quick", "slow"))
    spec = _closed(("sloPeriod", "page", "ticket"), {"sloPeriod": DURATION, "page": severity, "ticket": severity},
                   ("sloPeriod", "page", "ticket"))
    return _closed(("apiVersion", "kind", "metadata", "spec"), {
        "apiVersion": {"const": windows.API_VERSION}, "kind": {"const": windows.KIND}, "metadata": {"type": "object"},
        "spec": spec}, ("apiVersion", "kind", "spec"))


def _threshold(t: Threshold) -> dict:
    """One threshold's property from its row (slogen/rules/knobs.py): its kind, range and what it sets."""
    described = {"description": f"{t.help()} (default {t.show(t.default)})"}
    if t.duration:
        return {**DURATION, **described}
    k = t.knob
    prop: dict[str, Any] = {"type": "number", ("exclusiveMinimum" if k.low_open else "minimum"): k.low}
    if math.isfinite(k.high):
        prop["exclusiveMaximum"] = k.high
    return {**prop, **described}


def _thresholds() -> dict:
    sections = {name: _closed(tuple(t.name for t in rows), {t.name: _threshold(t) for t in rows})
                for name, rows in ((n, thresholds_of(cls)) for n, cls in thresholds.SECTIONS.items())}
    return _closed(("version", *sections), {"version": {"const": thresholds.VERSION}, **sections}, ("version",))


def schema() -> dict:
    """The schema: one document is a Sloth prometheus/v1 spec, an llmslo autoscaling spec, the alert thresholds
    or AlertWindows."""
    return {
        "$schema": DRAFT,
        "$id": "https://github.com/llmslo/llmslo/" + SCHEMA_PATH,
        "title": "slogen input (Sloth prometheus/v1 with llmslo SLI plugins, llmslo/autoscaling/v1, "
                 "llmslo/thresholds/v1, AlertWindows)",
        "description": "Generated by `slogen schema` (slogen/schema.py); do not edit.",
        "$defs": {"sli": _sli(False), "sli_ranged": _sli(True), "sloth_prometheus_v1": _sloth_spec(),
                  "llmslo_autoscaling_v1": _autoscaling_spec(), "alert_windows": _alert_windows(),
                  "llmslo_thresholds_v1": _thresholds()},
        # Dispatch on the version (so an editor reports the errors of the one format a file is in).
        "if": {"properties": {"version": {"const": sloth.PROMETHEUS_V1.spec}}, "required": ["version"]},
        "then": {"$ref": "#/$defs/sloth_prometheus_v1"},
        "else": {"if": {"properties": {"version": {"const": autoscaling.VERSION}}, "required": ["version"]},
                 "then": {"$ref": "#/$defs/llmslo_autoscaling_v1"},
                 "else": {"if": {"properties": {"version": {"const": thresholds.VERSION}}, "required": ["version"]},
                          "then": {"$ref": "#/$defs/llmslo_thresholds_v1"},
                          "else": {"if": {"properties": {"kind": {"const": windows.KIND}}, "required": ["kind"]},
                                   "then": {"$ref": "#/$defs/alert_windows"},
                                   "else": {"oneOf": [{"$ref": "#/$defs/sloth_prometheus_v1"},
                                                      {"$ref": "#/$defs/llmslo_autoscaling_v1"},
                                                      {"$ref": "#/$defs/llmslo_thresholds_v1"},
                                                      {"$ref": "#/$defs/alert_windows"}]}}}},
    }


def render() -> str:
    return json.dumps(schema(), indent=2) + "\n"
