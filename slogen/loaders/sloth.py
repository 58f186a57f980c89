"""Sloth `prometheus/v1` specs (and, with camelCase keys under `spec:`, the Kubernetes CRD).

Mapping follows Sloth v0.16: SLO id = `<service>-<name>`, labels = spec labels overlaid by
SLO labels, page/ticket alerts inherit `alerting.labels`/`annotations` and add their own.
slogen extensions, ignored by Sloth itself so specs stay loadable there:
  * `period: 28d` at the top (all SLOs) or on one SLO: a per-SLO period;
  * `page_min_bad_events: 3` (CRD `pageMinBadEvents`) at the top or on one SLO: the low-traffic
    guard's minimum of bad events in a page tier's long window (0 turns it off);
  * `sli.plugin.id: llmslo/...`: built-in LLM SLI plugins (see slogen/plugins/llm.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from llmslo.durations import format_prometheus_duration, parse_prometheus_duration
from llmslo.ranges import ALLOW_KEY
from llmslo.sli_plugins import OPTIONS as PLUGIN_OPTIONS
from llmslo.suggest import closest
from slogen import plugins
from slogen.loaders import common as f
from slogen.loaders.common import Reporter
from slogen.loaders.sloth_common import events_equivalent
from slogen.model import SLI, SLO, Alerting, AlertMeta, EventsSLI, Origin, RawSLI, SLOPluginRef
from slogen.plugins.contract import PluginError, SLIPluginRequest
from slogen.plugins.sloth_contrib import UNSUPPORTED as UNSUPPORTED_SLO_PLUGINS

ALERT_NAME_RE = __import__("re").compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


@dataclass(frozen=True)
class Dialect:
    """Key spellings and placement: prometheus/v1 uses snake_case at the top, the CRD camelCase under spec."""

    spec: str
    mode: str
    root: str  # "" or "spec"
    error_query: str
    total_query: str
    error_ratio_query: str
    page_alert: str
    ticket_alert: str
    slo_plugins: str
    page_min_bad_events: str
    allow_out_of_range: str = ALLOW_KEY


PROMETHEUS_V1 = Dialect("prometheus/v1", "cli-gen-prom", "", "error_query", "total_query", "error_ratio_query",
                        "page_alert", "ticket_alert", "slo_plugins", "page_min_bad_events")
K8S_V1 = Dialect("sloth.slok.dev/v1", "cli-gen-k8s", "spec", "errorQuery", "totalQuery", "errorRatioQuery",
                 "pageAlert", "ticketAlert", "sloPlugins", "pageMinBadEvents", "allowOutOfRange")


# The keys each mapping may hold (slogen/schema.py writes the same lists into the JSON Schema).
SLI_KEYS = ("events", "raw", "plugin")
PLUGIN_KEYS = ("id", "options")
ALERT_KEYS = ("disable", "labels", "annotations", "for")  # page_alert, ticket_alert
SLO_PLUGIN_KEYS = ("id", "priority", "config")  # each entry of plugins.chain


def spec_keys(d: Dialect) -> tuple[str, ...]:
    return ("version", "service", "labels", "slo_plugins", "slos", "period", d.page_min_bad_events)


def slo_keys(d: Dialect) -> tuple[str, ...]:
    return ("name", "description", "objective", "plugins", "labels", "sli", "alerting", "period",
            d.page_min_bad_events, d.allow_out_of_range)


def alerting_keys(d: Dialect) -> tuple[str, ...]:
    return ("name", "labels", "annotations", d.page_alert, d.ticket_alert)


def load(doc: dict, r: Reporter, doc_index: int, dialect: Dialect = PROMETHEUS_V1) -> list[SLO]:
    """Map one Sloth document to SLOs, reporting every problem into `r`."""
    origin_extra: dict[str, Any] = {}
    if dialect.root:
        meta = f.mapping(r, doc, "metadata", "")
        origin_extra = {
            "k8s_name": f.string(r, meta, "name", "metadata"),
            "k8s_namespace": f.string(r, meta, "namespace", "metadata"),
            "k8s_labels": f.labels(r, meta, "labels", "metadata"),
            "k8s_annotations": f.labels(r, meta, "annotations", "metadata", what="annotation"),
        }
        root = f.mapping(r, doc, dialect.root, "", required=True)
        prefix = dialect.root
    else:
        root, prefix = doc, ""
        f.unknown_keys(r, doc, spec_keys(dialect), "", elsewhere=_slo_keys("each SLO of slos", dialect))

    service = f.string(r, root, "service", prefix)
    f.check_name(r, service, "service", f.join(prefix, "service"), line=f.line_of(root, "service"))
    if len(service.encode()) > MAX_SERVICE_BYTES:
        r.error(f"service name is {len(service.encode())} bytes long: build names files after it "
                f"(deploy/generated/prometheusrule-<service>.yaml) and a file name has at most {NAME_MAX} bytes",
                f.join(prefix, "service"), line=f.line_of(root, "service"),
                fix=f"shorten the service name to at most {MAX_SERVICE_BYTES} characters")
    spec_labels = f.labels(r, root, "labels", prefix)
    f.check_reserved(r, spec_labels, f.join(prefix, "labels"), slo="", line=f.line_of(root, "labels"))
    spec_period = _period(r, root, prefix, "")
    spec_min_bad = _min_bad_events(r, root, dialect.page_min_bad_events, prefix, "")
    group_plugins, group_override = _slo_plugins(r, root, dialect.slo_plugins, prefix, "")

    slos_node = root.get("slos") if isinstance(root, dict) else None
    if not isinstance(slos_node, list) or not slos_node:
        r.error("at least one SLO is required", f.join(prefix, "slos"), line=f.line_of(root, "slos"),
                fix="add a `slos:` list with at least one SLO")
        return []

    out: list[SLO] = []
    for i, node in enumerate(slos_node):
        p = f"{f.join(prefix, 'slos')}[{i}]"
        if not isinstance(node, dict):
            r.error("each SLO must be a mapping", p, line=f.line_of(slos_node), fix="indent the SLO's fields under `- name:`")
            continue
        slo = _load_slo(r, node, p, service, spec_labels, spec_period, group_plugins, group_override, dialect,
                        Origin(file=r.file, doc=doc_index, path=p, line=f.line_of(node), spec=dialect.spec,
                               mode=dialect.mode, **origin_extra))
        if slo is not None:
            if slo.page_min_bad_events is None and spec_min_bad is not None:
                slo = replace(slo, page_min_bad_events=spec_min_bad)
            out.append(slo)
    _check_spec_grouped(r, root, prefix, out)
    return out


# A file name has at most NAME_MAX bytes (Linux, every common file system); the longest name build makes of a
# service is deploy/generated/prometheusrule-<service>.yaml (outtree writes it under that name, no temp name).
NAME_MAX = 255
MAX_SERVICE_BYTES = NAME_MAX - len("prometheusrule-.yaml")
MAX_SLO_ID_BYTES = NAME_MAX - len("slo-.json")  # dashboards/slo-<service>-<name>.json


def _load_slo(r: Reporter, node: dict, p: str, service: str, spec_labels: dict[str, str], spec_period: int | None,
              group_plugins: list[SLOPluginRef], group_override: bool, d: Dialect, origin: Origin) -> SLO | None:
    name = f.string(r, node, "name", p)
    slo_id = f"{service}-{name}"
    who = slo_id if name else f"#{p}"
    if name and len(service.encode()) <= MAX_SERVICE_BYTES and len(slo_id.encode()) > MAX_SLO_ID_BYTES:
        r.error(f"SLO id {service}-<name> is {len(slo_id.encode())} bytes long: build names its dashboard "
                f"dashboards/slo-<id>.json and a file name has at most {NAME_MAX} bytes", f.join(p, "name"), slo=who,
                line=f.line_of(node, "name"), fix=f"shorten the service or SLO name (together at most {MAX_SLO_ID_BYTES})")
    f.unknown_keys(r, node, slo_keys(d), p, slo=who, elsewhere=_misplaced_in_slo(d))
    f.check_name(r, name, "SLO name", f"{p}.name", slo=who, line=f.line_of(node, "name"))
    allow = f.boolean(r, node, d.allow_out_of_range, p, slo=who)
    objective = f.number(r, node, "objective", p, slo=who)
    f.check_objective(r, objective, f"{p}.objective", slo=who, line=f.line_of(node, "objective"),
                      given=node.get("objective") is not None, plausible=not allow)
    slo_labels = f.labels(r, node, "labels", p, slo=who)
    f.check_reserved(r, slo_labels, f"{p}.labels", slo=who, line=f.line_of(node, "labels"))
    period = _period(r, node, p, who)
    plugins_, override = _slo_plugins(r, node, "plugins", p, who)
    if override:
        chain = plugins_
    else:
        chain = group_plugins + plugins_
    if override and not plugins_:
        r.error("plugins.overridePrevious is set but no plugins are declared", f"{p}.plugins", slo=who,
                fix="declare plugins in the chain or drop overridePrevious")
    sli = _load_sli(r, node, p, who, service, name, slo_id, objective or 0.0, spec_labels, d, allow)
    min_bad = _min_bad_events(r, node, d.page_min_bad_events, p, who)
    if min_bad and isinstance(sli, RawSLI):
        r.warn(f"{d.page_min_bad_events} has no effect on a raw SLI: an error ratio has no event counts",
               f.join(p, d.page_min_bad_events), slo=who, line=f.line_of(node, d.page_min_bad_events),
               fix="use an events SLI (error and total queries) to guard its pages, or remove the key")
    alerting = _load_alerting(r, node, p, who, d)
    if sli is not None:
        _check_grouped(r, sli, node, p, who, d)
    if sli is None or objective is None:
        return None
    origin = replace(origin, tool=_tool(node), objective_field=f"{p}.objective",
                     objective_line=f.line_of(node, "objective"))
    return SLO(
        id=slo_id, service=service, name=name, objective=objective, sli=sli,
        description=f.string(r, node, "description", p, slo=who),
        period=period if period is not None else spec_period,
        labels={**spec_labels, **slo_labels}, alerting=alerting, plugins=tuple(chain),
        override_plugins=override or group_override, page_min_bad_events=min_bad, origin=origin,
    )


def _grouped(sli: SLI) -> tuple[str, ...]:
    """The labels an SLI's rules keep through `sum by` (a built-in plugin's `by`, cluster by default)."""
    return tuple(sli.by) if isinstance(sli, EventsSLI) else ()


def _check_grouped(r: Reporter, sli: SLI, node: dict, p: str, who: str, d: Dialect) -> None:
    """Refuse a label the SLI's rules group by wherever the SLO writes one: its labels, alerting.labels and each
    alert's labels (on the recording rules it collides two clusters' series; on an alert, two clusters' alerts)."""
    grouped = _grouped(sli)
    if not grouped:
        return
    f.check_grouped(r, grouped, f.mapping_or_empty(node, "labels"), f"{p}.labels", slo=who, alert=False)
    al = f.mapping_or_empty(node, "alerting")
    f.check_grouped(r, grouped, f.mapping_or_empty(al, "labels"), f"{p}.alerting.labels", slo=who, alert=True)
    for key in (d.page_alert, d.ticket_alert):
        block = f.mapping_or_empty(al, key)
        f.check_grouped(r, grouped, f.mapping_or_empty(block, "labels"), f"{p}.alerting.{key}.labels", slo=who,
                        alert=True)


def _check_spec_grouped(r: Reporter, root: dict, prefix: str, slos: list[SLO]) -> None:
    """The spec's own `labels:` go onto every SLO: refuse each one that some SLO's rules group by, once, naming the
    first such SLO."""
    raw = f.mapping_or_empty(root, "labels")
    for key in raw:
        slo = next((s for s in slos if key in _grouped(s.sli)), None)
        if slo is not None:
            problem, fix = f.grouped_label(str(key), _grouped(slo.sli), alert=False)
            r.error(problem, f"{f.join(prefix, 'labels')}.{key}", slo=slo.id, line=f.line_of(raw, key), fix=fix)


def _tool(node: dict) -> str:
    """"Sloth" for an SLO Sloth itself loads; "" for slogen's own (an llmslo/* SLI plugin, which only slogen reads)."""
    sli = node.get("sli")
    plugin = sli.get("plugin") if isinstance(sli, dict) else None
    pid = plugin.get("id") if isinstance(plugin, dict) else None
    return "" if isinstance(pid, str) and pid in PLUGIN_OPTIONS else "Sloth"


_ALL_OPTIONS = tuple(dict.fromkeys(o for opts in PLUGIN_OPTIONS.values() for o in opts))


def _slo_keys(where: str, d: Dialect) -> dict[str, str]:
    """Keys of one SLO that a spec wrote at the top of the file (dedented): where they belong."""
    return {k: where for k in ("name", "objective", "sli", "alerting", "description", d.allow_out_of_range)}


def _misplaced_in_slo(d: Dialect) -> dict[str, str]:
    """Keys written on an SLO that belong deeper (a dedent, or a level left out): where they go."""
    out = {"options": "sli.plugin", "id": "sli.plugin", "events": "sli", "raw": "sli", "plugin": "sli",
           d.error_query: "sli.events", d.total_query: "sli.events", d.error_ratio_query: "sli.raw",
           d.page_alert: "alerting", d.ticket_alert: "alerting", "slos": "the top level"}
    out.update({k: "sli.plugin.options" for k in _ALL_OPTIONS if k not in out})
    return out


def _misplaced_in_sli(d: Dialect) -> dict[str, str]:
    """Keys written on `sli` that belong deeper (a dedented `options:`): where they go, from the SLO down."""
    out = {"options": "sli.plugin", "id": "sli.plugin", d.error_query: "sli.events",
           d.total_query: "sli.events", d.error_ratio_query: "sli.raw"}
    out.update({k: "sli.plugin.options" for k in _ALL_OPTIONS if k not in out})
    return out


def _period(r: Reporter, node: dict, p: str, who: str) -> int | None:
    text = f.string(r, node, "period", p, slo=who)
    if not text:
        return None
    try:
        ms = parse_prometheus_duration(text)
    except ValueError as e:
        r.error(str(e), f.join(p, "period"), slo=who, line=f.line_of(node, "period"), fix="write e.g. period: 28d")
        return None
    if ms <= 0:
        r.error("period must be positive", f.join(p, "period"), slo=who, line=f.line_of(node, "period"),
                fix="write e.g. period: 30d")
        return None
    return ms


def _min_bad_events(r: Reporter, node: dict, key: str, p: str, who: str) -> int | None:
    """The low-traffic guard's minimum (a whole number >= 0), or None when not set."""
    value = node.get(key) if isinstance(node, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        r.error(f"{key} must be a whole number of bad events >= 0, got {value!r}", f.join(p, key), slo=who,
                line=f.line_of(node, key), fix=f"write e.g. {key}: 3 (0 turns the low-traffic guard off)")
        return None
    return value


def _slo_plugins(r: Reporter, node: dict, key: str, p: str, who: str) -> tuple[list[SLOPluginRef], bool]:
    block = f.mapping(r, node, key, p, slo=who)
    if not block:
        return [], False
    override = f.boolean(r, block, "overridePrevious", f.join(p, key), slo=who)
    chain = block.get("chain") or []
    refs = []
    for i, item in enumerate(chain if isinstance(chain, list) else []):
        ip = f"{f.join(p, key)}.chain[{i}]"
        if not isinstance(item, dict) or not item.get("id"):
            r.error("plugin ID is required", f"{ip}.id", slo=who, line=f.line_of(item) if isinstance(item, dict) else None,
                    fix="set id: to a registered SLO plugin")
            continue
        pid = str(item["id"])
        if pid in UNSUPPORTED_SLO_PLUGINS:
            why, fix = UNSUPPORTED_SLO_PLUGINS[pid]
            r.error(f"Sloth's SLO plugin {pid} is not supported: {why}", f"{ip}.id", slo=who, line=f.line_of(item, "id"),
                    fix=fix)
            continue
        if plugins.slo_plugin_factory(pid) is None:
            known = ", ".join(plugins.slo_plugin_ids()) or "none registered"
            r.error(f"unknown SLO plugin {pid!r}", f"{ip}.id", slo=who, line=f.line_of(item, "id"),
                    fix=f"use a registered SLO plugin ({known}); Sloth's Go plugins are not loaded by slogen")
            continue
        priority = item.get("priority", 0)
        if not isinstance(priority, int) or isinstance(priority, bool):
            r.error("priority must be an integer", f"{ip}.priority", slo=who, line=f.line_of(item, "priority"),
                    fix="write priority: 100")
            priority = 0
        refs.append(SLOPluginRef(pid, item.get("config"), priority))
    return refs, override


def _load_sli(r: Reporter, node: dict, p: str, who: str, service: str, name: str, slo_id: str, objective: float,
              spec_labels: dict[str, str], d: Dialect, allow_out_of_range: bool = False) -> SLI | None:
    sli = f.mapping(r, node, "sli", p, slo=who)
    sp = f"{p}.sli"
    f.unknown_keys(r, sli, SLI_KEYS, sp, slo=who, elsewhere=_misplaced_in_sli(d))
    kinds = [k for k in ("events", "raw", "plugin") if sli.get(k) is not None]
    if not kinds:
        r.error("the SLI is empty: one of events, raw or plugin is required", sp, slo=who, line=f.line_of(node, "sli"),
                fix=f"write sli: {{events: {{{d.error_query}: ..., {d.total_query}: ...}}}} or a plugin")
        return None
    if len(kinds) > 1:
        r.error(f"only one SLI type is allowed, found {', '.join(kinds)}", sp, slo=who, line=f.line_of(node, "sli"),
                fix="keep one of events, raw or plugin")
        return None
    kind = kinds[0]
    if kind == "events":
        ev = f.mapping(r, sli, "events", sp, slo=who)
        err = f.string(r, ev, d.error_query, f"{sp}.events", slo=who)
        tot = f.string(r, ev, d.total_query, f"{sp}.events", slo=who)
        f.check_query_template(r, err, f"{sp}.events.{d.error_query}", slo=who, line=f.line_of(ev, d.error_query))
        f.check_query_template(r, tot, f"{sp}.events.{d.total_query}", slo=who, line=f.line_of(ev, d.total_query))
        if err and err == tot:
            r.error("error and total queries are the same", f"{sp}.events", slo=who, line=f.line_of(sli, "events"),
                    fix="the error query must select only the bad events")
        return EventsSLI(err, tot)
    if kind == "raw":
        raw = f.mapping(r, sli, "raw", sp, slo=who)
        q = f.string(r, raw, d.error_ratio_query, f"{sp}.raw", slo=who)
        f.check_query_template(r, q, f"{sp}.raw.{d.error_ratio_query}", slo=who, line=f.line_of(raw, d.error_ratio_query))
        return RawSLI(q)
    plug = f.mapping(r, sli, "plugin", sp, slo=who)
    f.unknown_keys(r, plug, PLUGIN_KEYS, f"{sp}.plugin", slo=who,
                   elsewhere={k: "sli.plugin.options" for k in _ALL_OPTIONS})
    pid = f.string(r, plug, "id", f"{sp}.plugin", slo=who)
    options = f.labels(r, plug, "options", f"{sp}.plugin", slo=who, what="option") if plug.get("options") else {}
    fn = plugins.sli_plugin(pid)
    if fn is None:
        near = closest(pid, plugins.sli_plugin_ids())
        inline = events_equivalent(pid, options, d.error_query, d.total_query)
        r.error(f"unknown SLI plugin {pid!r}", f"{sp}.plugin.id", slo=who, line=f.line_of(plug, "id"),
                fix=(f"slogen does not load Sloth's Go plugins; write the same SLI inline: {inline}" if inline else
                     (f"did you mean {near}? " if near else "")
                     + f"use one of the built-in plugins: {', '.join(plugins.sli_plugin_ids())}"))
        return None
    try:
        return fn(SLIPluginRequest(service=service, slo=name, slo_id=slo_id, objective=objective,
                                   labels=spec_labels, options=options, allow_out_of_range=allow_out_of_range))
    except PluginError as e:
        for one in getattr(e, "errors", [e]):  # PluginOptionErrors: every option a plugin refused
            _plugin_error(r, one, plug, pid, sp, who)
        return None


def _plugin_error(r: Reporter, e: PluginError, plug: dict, pid: str, sp: str, who: str) -> None:
    """One option a plugin refused, at the option's own field and line."""
    field = f"{sp}.plugin.options" + (f".{e.option}" if e.option else "")
    raw_options = plug.get("options")
    line = (f.line_of(raw_options, e.option) if e.option and isinstance(raw_options, dict) and e.option in raw_options
            else f.line_of(plug, "options"))
    r.error(f"plugin {pid}: {e}", field, slo=who, line=line, fix=e.fix)


def _load_alerting(r: Reporter, node: dict, p: str, who: str, d: Dialect) -> Alerting:
    al = f.mapping(r, node, "alerting", p, slo=who)
    ap = f"{p}.alerting"
    f.unknown_keys(r, al, alerting_keys(d), ap, slo=who)
    name = f.string(r, al, "name", ap, slo=who)
    base_labels = f.labels(r, al, "labels", ap, slo=who)
    f.check_reserved(r, base_labels, f"{ap}.labels", slo=who, line=f.line_of(al, "labels"))
    base_ann = f.labels(r, al, "annotations", ap, slo=who, what="annotation")
    metas = []
    refused: set[str] = set()  # an invalid name shared by page and ticket alerts is reported once
    for key in (d.page_alert, d.ticket_alert):
        block = f.mapping(r, al, key, ap, slo=who)
        bp = f"{ap}.{key}"
        f.unknown_keys(r, block, ALERT_KEYS, bp, slo=who)
        disable = f.boolean(r, block, "disable", bp, slo=who)
        labels = f.labels(r, block, "labels", bp, slo=who)
        f.check_reserved(r, labels, f"{bp}.labels", slo=who, line=f.line_of(block, "labels"))
        ann = f.labels(r, block, "annotations", bp, slo=who, what="annotation")
        if disable:
            metas.append(AlertMeta(disable=True))
            continue
        if not name:
            r.error(f"alerting.name is required while the {key} is enabled", f"{ap}.name", slo=who,
                    line=f.line_of(al, "name") or f.line_of(node, "alerting"),
                    fix=f"set alerting.name (e.g. {f.alert_name_for(who)}) or set {key}: {{disable: true}}")
        elif not ALERT_NAME_RE.match(name) and name not in refused:
            refused.add(name)
            r.error(f"alert name {name!r} is not a valid Prometheus alert name", f"{ap}.name", slo=who,
                    line=f.line_of(al, "name"), fix="use letters, digits, '_' and ':' only, e.g. ChatTTFTBudgetBurn")
        metas.append(AlertMeta(name=name, labels={**base_labels, **labels}, annotations={**base_ann, **ann}, disable=False,
                               for_=_alert_for(r, block, bp, who)))
    return Alerting(name=name, page=metas[0], ticket=metas[1])



def _alert_for(r: Reporter, block: dict, bp: str, who: str) -> str:
    """`for:` of a page or ticket alert (the field of Sloth's alert_for contrib plugin): how long the burn must
    last before the alert fires, in Prometheus' spelling; "" when unset."""
    value = block.get("for") if isinstance(block, dict) else None
    if value is None or value == "":
        return ""
    try:
        return format_prometheus_duration(parse_prometheus_duration(str(value)))
    except ValueError:
        r.error(f"for {value!r} is not a Prometheus duration", f"{bp}.for", slo=who, line=f.line_of(block, "for"),
                fix="write e.g. for: 5m (how long the burn must last before the alert fires)")
        return ""
