"""Built-in LLM-serving SLIs: one line of spec each for TTFT/TPOT/E2E/ITL latency, goodput,
availability and KV-cache headroom.

Every plugin resolves into an events SLI (error and total queries with `{{.window}}`), so the
generators treat it like any Sloth events SLI and the period SLI is traffic-weighted. Metric
and label names come from `llmslo.conventions` only. Queries aggregate `by (cluster)` (option
`by`) so that one rule set serves a fleet: labels added by federation or remote-write survive.
Each plugin also names its source selectors (for the no-data alert) and how to synthesize
its source series (for generated promtool tests).
"""

from __future__ import annotations

import math
import re

from llmslo import bucket_edges as be
from llmslo import conventions as c
from llmslo.globs import glob_regex
from slogen import promql
from slogen.promql import Matcher, any_of, quote, rule_selector
from slogen.model import EventsSLI, RecordingRule, SeriesFixture
from slogen.plugins import PluginError, SLIPluginRequest, register_sli_plugin

DEFAULT_AGGREGATE_BY = (c.LABEL_CLUSTER,)

LATENCY = "llmslo/latency"
GOODPUT = "llmslo/goodput"
AVAILABILITY = "llmslo/availability"
KV_HEADROOM = "llmslo/kv-headroom"

SOURCE_TAP = "tap"
SOURCE_ENGINE = "engine"

# threshold_rounding (source: engine): measure at the nearest bucket edge that every selected engine has.
ROUND_DOWN = "down"  # the edge below: a stricter objective than written
ROUND_UP = "up"  # the edge above: a looser one
ROUNDINGS = (ROUND_DOWN, ROUND_UP)

LATENCY_METRICS = {
    # option value: (tap family, engine family)
    "ttft": (c.TAP_TTFT, c.TTFT),
    "tpot": (c.TAP_TPOT, c.TPOT),
    "e2e": (c.TAP_E2E, c.E2E),
    "itl": (None, c.ITL),
}

_MATCHER_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')
_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

# --------------------------------------------------------------------------------------
# PromQL building blocks
# --------------------------------------------------------------------------------------


def parse_selector(text: str) -> list[Matcher]:
    """`{namespace="llm", model=~"x.*"}` -> matchers; PluginError naming `selector` otherwise."""
    body = text.strip()
    if not body:
        return []
    if not (body.startswith("{") and body.endswith("}")):
        raise PluginError(f"selector {text!r} must be label matchers in braces", "selector",
                          'write it like {namespace="llm"}')
    body = body[1:-1].strip()
    matchers: list[Matcher] = []
    pos = 0
    while pos < len(body):
        m = _MATCHER_RE.match(body, pos)
        if not m:
            raise PluginError(f"cannot parse label matchers in selector {text!r} at {body[pos:]!r}", "selector",
                              'use name="value", name!="value", name=~"regex" or name!~"regex", comma-separated')
        matchers.append(Matcher(m.group(1), m.group(2), m.group(3)))
        pos = m.end()
        if pos < len(body):
            if body[pos] != ",":
                raise PluginError(f"expected ',' in selector {text!r} at {body[pos:]!r}", "selector",
                                  "separate matchers with commas")
            pos += 1
    return matchers


def glob_example(globs: str) -> str:
    """A model name that the first glob matches (for synthesized test series)."""
    first = next((g.strip() for g in globs.split(",") if g.strip()), "model")
    return first.replace("*", "x").replace("?", "x")


def le_regex(threshold: float) -> str:
    """A regex matching a bucket bound however it is spelled: `1`, `1.0`, `0.5`, `0.50`.

    Prometheus 3 and the Python client write `1.0`; Go clients and Prometheus 2 write `1`.
    """
    text = repr(float(threshold))
    if "e" in text or "inf" in text or "nan" in text:
        raise PluginError(f"threshold {threshold!r} must be a plain decimal bucket bound", "threshold",
                          "write the bound as it appears in the histogram, e.g. 0.5 or 2.5")
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0")
    if not frac:
        return whole + r"(\.0*)?"
    return whole + r"\." + frac + "0*"


def le_label(threshold: float) -> str:
    """The bound as the Python client (the tap, the simulator) spells it: `0.5`, `1.0`."""
    return repr(float(threshold))


def aggregate(inner: str, by: tuple[str, ...]) -> str:
    return promql.agg("sum", inner, by)


def late_selector(matchers: list[Matcher]) -> str:
    """The tap's requests that ended late (conventions.TAP_LATE_OUTCOMES) among those `matchers` pick.

    The tap's latency histograms observe completed requests only: one that hit the tap's deadline
    or whose client gave up after its objective had passed has no latency sample, yet it is the
    slowest request of all. A latency SLI over the tap adds these to its bad and total events.
    """
    late = Matcher(c.LABEL_OUTCOME, "=~", any_of(c.TAP_LATE_OUTCOMES))
    return rule_selector(c.TAP_REQUESTS.name, matchers + [late])


def late_fixtures(metric: str, labels: dict[str, str]) -> tuple[SeriesFixture, ...]:
    """One "late" test series per late outcome, so the generated tests stage a hang ending in each."""
    return tuple(SeriesFixture(metric, {**labels, c.LABEL_OUTCOME: outcome}, "late", incident=outcome)
                 for outcome in c.TAP_LATE_OUTCOMES)


# --------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------


class _Options:
    """Typed access to a plugin's string options; unknown options are errors (typos must not pass)."""

    def __init__(self, plugin: str, options: dict[str, str], known: tuple[str, ...]):
        self.plugin = plugin
        self.raw = {str(k): ("" if v is None else str(v)) for k, v in (options or {}).items()}
        unknown = sorted(set(self.raw) - set(known))
        if unknown:
            raise PluginError(f"unknown option(s) {', '.join(unknown)} for plugin {plugin}", unknown[0],
                              f"use only: {', '.join(known)}")

    def get(self, name: str, default: str = "") -> str:
        return self.raw.get(name, default).strip()

    def required(self, name: str, hint: str) -> str:
        value = self.get(name)
        if not value:
            raise PluginError(f"plugin {self.plugin} needs option {name!r}", name, hint)
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        value = self.get(name, default)
        if value not in choices:
            raise PluginError(f"option {name!r} is {value!r}, not one of {', '.join(choices)}", name,
                              f"set {name} to one of: {', '.join(choices)}")
        return value

    def number(self, name: str, default: str = "", lo: float | None = None, hi: float | None = None) -> float:
        text = self.get(name, default)
        if not text:
            raise PluginError(f"plugin {self.plugin} needs option {name!r}", name, f'set {name}: "<number>"')
        try:
            value = float(text)
        except ValueError:
            raise PluginError(f"option {name!r} is {text!r}, not a number", name, f'write {name}: "0.5"') from None
        if not math.isfinite(value):
            raise PluginError(f"option {name!r} is {text!r}, not a finite number", name,
                              f'write {name}: "0.5" (a finite decimal; nan and inf cannot be a threshold)')
        if (lo is not None and value <= lo) or (hi is not None and value > hi):
            rng = f"({'' if lo is None else lo}, {'' if hi is None else hi}]"
            raise PluginError(f"option {name!r} is {value}, outside {rng}", name, f"choose {name} in {rng}")
        return value

    def by(self) -> tuple[str, ...]:
        text = self.raw.get("by")
        if text is None:
            return DEFAULT_AGGREGATE_BY
        labels = tuple(x.strip() for x in text.split(",") if x.strip())
        for label in labels:
            if not _LABEL_NAME_RE.match(label):
                raise PluginError(f"option 'by' has {label!r}, not a label name", "by", 'write by: "cluster,region"')
        return labels

    def matchers(self) -> list[Matcher]:
        return parse_selector(self.get("selector"))


COMMON = ("selector", "models", "by")


def _fixture_labels(base: dict[str, str], matchers: list[Matcher], by: tuple[str, ...]) -> dict[str, str] | None:
    """Labels for a synthesized series satisfying `matchers`; None when a regex matcher defeats us."""
    labels = dict(base)
    for name, op, value in matchers:
        if op == "=":
            labels[name] = value.replace('\\"', '"').replace("\\\\", "\\")
        elif op == "=~":
            candidate = value.replace(".*", "x").replace(".+", "x").replace("\\\\", "").split("|")[0]
            if not re.fullmatch(value.replace("\\\\", "\\"), candidate):
                return None
            labels[name] = candidate
        elif op in ("!=", "!~"):
            labels.setdefault(name, "fixture")
    for label in by:
        labels.setdefault(label, f"{label}-a")
    return labels


def _model_matchers(opts: _Options) -> tuple[list[Matcher], dict[str, str]]:
    models = opts.get("models")
    if not models:
        return [], {}
    regex = glob_regex(models)
    return [promql.matcher(c.LABEL_MODEL, "=~", regex)], {c.LABEL_MODEL: glob_example(models)}


# --------------------------------------------------------------------------------------
# Measurable thresholds (source: engine): the threshold must be a bucket edge of every engine
# the SLI may select (llmslo/bucket_edges.py), or the SLI is blind where it is not
# --------------------------------------------------------------------------------------


def _unquote(value: str) -> str:
    """A matcher value as written between PromQL's double quotes, unescaped (a doubled backslash becomes one)."""
    return re.sub(r"\\(.)", r"\1", value)


def _matches_kind(op: str, value: str, kind: str) -> bool:
    literal = _unquote(value)
    if op == "=":
        return kind == literal
    if op == "!=":
        return kind != literal
    try:
        hit = re.fullmatch(literal, kind) is not None
    except re.error:
        return True  # a regex Python cannot read: the kind may be selected (the check stays on the safe side)
    return hit if op == "=~" else not hit


def engine_kinds(matchers: list[Matcher]) -> tuple[str, ...]:
    """The engine kinds (the exporter's `engine` label values) that the SLI's `engine` matchers let through."""
    engine = [(op, value) for name, op, value in matchers if name == c.LABEL_ENGINE]
    return tuple(k for k in be.ENGINE_KINDS if all(_matches_kind(op, value, k) for op, value in engine))


def _where(edges: tuple[float, ...], threshold: float) -> str:
    if not edges:
        return "no finite edge (count and sum only)"
    lo, hi = be.nearest(edges, threshold)
    t = be.edge_text(threshold)
    if lo is None:
        return f"{t} < {be.edge_text(hi)}, its first edge"
    if hi is None:
        return f"{be.edge_text(lo)}, its last edge, < {t}"
    return f"{be.edge_text(lo)} < {t} < {be.edge_text(hi)}"


def _pin_example(kinds: tuple[str, ...]) -> str:
    inner = f'engine="{kinds[0]}"' if len(kinds) == 1 else f'engine=~"{"|".join(kinds)}"'
    return f"selector: '{{{inner}}}'"


def measurable_threshold(metric: str, threshold: float, matchers: list[Matcher], rounding: str) -> float:
    """The threshold an engine-sourced latency SLI measures: `threshold` itself when it is a bucket edge
    of every engine kind and version (llmslo/bucket_edges.py) the SLI's selector may pick, else the
    common edge `rounding` names; PluginError naming the nearest edges and the fixes otherwise."""
    kinds = engine_kinds(matchers)
    if not kinds:
        raise PluginError(f"the selector's engine matchers pick no engine kind the exporter knows "
                          f"({', '.join(be.ENGINE_KINDS)}), so the SLI would measure nothing", "selector",
                          "match the engine label against those kind names, e.g. " + _pin_example((be.VLLM,)))
    selected = be.rows(kinds, metric)
    if not selected:
        exporters = tuple(dict.fromkeys(r.kind for r in be.rows(metric=metric)))
        raise PluginError(f"no engine kind this SLI selects ({', '.join(kinds)}) exports a {metric} histogram",
                          "metric", f"select an engine that does ({_pin_example(exporters)}), or use source: \"tap\"")
    off = [r for r in selected if not r.has_edge(metric, threshold)]
    if not off:
        return threshold
    common = be.common_edges(selected, metric)
    down, up = be.nearest(common, threshold)
    if rounding == ROUND_DOWN and down is not None:
        return down
    if rounding == ROUND_UP and up is not None:
        return up
    t = be.edge_text(threshold)
    groups: dict[tuple[str, str], list[str]] = {}
    for r in off:
        groups.setdefault((r.kind, _where(r.edges[metric], threshold)), []).append(r.versions)
    where = "; ".join(f"{kind}{' ' + ', '.join(v for v in versions if v) if any(versions) else ''}: {text}"
                      for (kind, text), versions in groups.items())
    scope = (f"engine kind{'s' if len(kinds) > 1 else ''} {', '.join(kinds)}, as the selector picks them"
             if any(name == c.LABEL_ENGINE for name, _, _ in matchers)
             else "every engine kind, as the selector has no engine matcher")
    message = (f"threshold {t} s is not a bucket edge of the {metric} histogram of every engine this SLI may "
               f"select ({scope}); "
               f"where it is not, the exporter has no bucket le={t}, so the SLI is blind there (its burn alerts "
               f"cannot fire) or counts every request as too slow. Nearest edges: {where}")
    if rounding:
        message += (f". threshold_rounding: {rounding} finds no edge {'below' if rounding == ROUND_DOWN else 'above'} "
                    f"{t} that every selected engine has")
    fixes = []
    if down is not None or up is not None:
        choices = " or ".join(be.edge_text(e) for e in (down, up) if e is not None)
        fixes.append(f"write threshold {choices} (an edge every selected engine has)")
    on_edge = tuple(k for k in kinds if be.rows([k], metric) and all(r.has_edge(metric, threshold)
                                                                       for r in be.rows([k], metric)))
    if on_edge:
        fixes.append(f"select only the engines where {t} is an edge ({_pin_example(on_edge)})")
    elif len(kinds) > 1:
        fixes.append(f"select fewer engine kinds (e.g. {_pin_example((off[0].kind,))}) and choose among their edges")
    if down is not None:
        fixes.append(f'set threshold_rounding: "down" to measure le={be.edge_text(down)} instead (a stricter objective)')
    if up is not None:
        fixes.append(f'set threshold_rounding: "up" to measure le={be.edge_text(up)} instead (a looser objective)')
    raise PluginError(message, "threshold_rounding" if rounding else "threshold", "; or ".join(fixes))


def engine_latency_selectors(sli: EventsSLI) -> tuple[str, str, str] | None:
    """(count, bucket at the threshold, bucket of any `le`) selectors of an engine-sourced llmslo/latency SLI;
    None for any other SLI. The first two are the SLI's `sources`, as `latency` builds them."""
    if sli.plugin != LATENCY or sli.plugin_options.get("source") != SOURCE_ENGINE or len(sli.sources) != 2:
        return None
    count_sel, bucket_sel = sli.sources
    name, brace, _ = bucket_sel.partition("{")
    kept = [m for m in parse_selector(brace + _) if m.label != c.LABEL_LE] if brace else []
    return count_sel, bucket_sel, rule_selector(name, kept)


# --------------------------------------------------------------------------------------
# The plugins
# --------------------------------------------------------------------------------------


def latency(req: SLIPluginRequest) -> EventsSLI:
    """Share of requests slower than `threshold` seconds: count - bucket{le=threshold}, over count.

    Over the tap, requests that ended late (a deadline hit, a client that gave up) count as slower
    than any threshold, so a hung engine burns the budget instead of silencing the SLI. The
    engine's own histograms cannot see a hang (it never finishes the request): no such term.

    Over the engine, the threshold must be a bucket edge of every engine kind and version the
    selector may pick (`measurable_threshold`), or `threshold_rounding` must name the common edge
    to measure instead; the tap makes every threshold an edge, so it needs no check.
    """
    opts = _Options(LATENCY, req.options, ("metric", "threshold", "source", "slo_class", "threshold_rounding") + COMMON)
    metric = opts.choice("metric", tuple(LATENCY_METRICS), "")
    source = opts.choice("source", (SOURCE_TAP, SOURCE_ENGINE), SOURCE_TAP)
    threshold = opts.number("threshold", lo=0)
    rounding = opts.get("threshold_rounding")
    if rounding and rounding not in ROUNDINGS:
        raise PluginError(f"option 'threshold_rounding' is {rounding!r}, not one of {', '.join(ROUNDINGS)}",
                          "threshold_rounding", 'write threshold_rounding: "down" or "up", or leave it out')
    if rounding and source != SOURCE_ENGINE:
        raise PluginError("threshold_rounding applies to source: engine only", "threshold_rounding",
                          "remove it: the tap adds every threshold it reads to its histograms' edges")
    tap_family, engine_family = LATENCY_METRICS[metric]
    family = tap_family if source == SOURCE_TAP else engine_family
    if family is None:
        raise PluginError(f"metric {metric!r} is only measured by the engine, not the tap", "source",
                          'set source: "engine" (or use tpot with the tap)')
    by = opts.by()
    matchers = opts.matchers()
    slo_class = opts.get("slo_class")
    # With a class, `models` is the tap's class mapping (the slo_class label already applies it).
    model_m, model_l = _model_matchers(opts) if not slo_class else ([], {})
    base: dict[str, str] = dict(model_l)
    if slo_class:
        if source != SOURCE_TAP:
            raise PluginError("slo_class is a label of the tap's series only", "slo_class",
                              'use models: "<globs>" to pick requests at the engine, or source: "tap"')
        matchers = [promql.matcher(c.LABEL_SLO_CLASS, "=", slo_class)] + matchers
        base[c.LABEL_SLO_CLASS] = slo_class
    matchers = matchers + model_m
    plugin_options = dict(opts.raw)
    if source == SOURCE_ENGINE:
        measured = measurable_threshold(metric, threshold, matchers, rounding)
        if measured != threshold:  # rounded: everything downstream (runbooks, dashboards) shows what is measured
            plugin_options.update(threshold=be.edge_text(measured), threshold_as_written=opts.get("threshold"))
            threshold = measured
    le = promql.matcher(c.LABEL_LE, "=~", le_regex(threshold))
    count_sel = rule_selector(family.count(), matchers)
    bucket_sel = rule_selector(family.bucket(), matchers + [le])
    count = aggregate(promql.rate(count_sel), by)
    good = aggregate(promql.rate(bucket_sel), by)
    error_query, total_query = f"{count}\n-\n{good}", count
    fixtures: tuple[SeriesFixture, ...] = ()
    labels = _fixture_labels(base, matchers, by)
    if labels is not None:
        fixtures = (
            SeriesFixture(family.count(), labels, "total"),
            SeriesFixture(family.bucket(), {**labels, c.LABEL_LE: le_label(threshold)}, "good"),
        )
    if source == SOURCE_TAP:
        error_query, total_query = _with_late(count, good, aggregate(promql.rate(late_selector(matchers)), by))
        if labels is not None:
            fixtures += late_fixtures(c.TAP_REQUESTS.name, labels)
    return EventsSLI(
        error_query=error_query,
        total_query=total_query,
        sources=(count_sel, bucket_sel),
        fixtures=fixtures,
        plugin=LATENCY,
        plugin_options=plugin_options,
        by=by,
    )


def _with_late(count: str, good: str, late: str) -> tuple[str, str]:
    """Error and total queries of a tap latency SLI that counts late requests as too slow.

    error = count - good + late, total = count + late, per `by` group. `late or 0 * count`
    keeps a group whose late series the tap has not created yet (it creates an outcome's series
    on first use); the trailing `or late` keeps a group with late requests only (a hung engine
    completes nothing, so its histograms are flat or absent): its error ratio is then 1, not
    empty, and every burn-rate tier sees the hang.
    """
    late_or_zero = f"({late}\nor\n0 * {count})"
    error = f"{count}\n-\n{good}\n+\n{late_or_zero}\nor\n{late}"
    total = f"{count}\n+\n{late_or_zero}\nor\n{late}"
    return error, total


def goodput(req: SLIPluginRequest) -> EventsSLI:
    """Share of a class's requests not delivered within both its TTFT and TPOT objectives (the tap decides)."""
    opts = _Options(GOODPUT, req.options, ("slo_class", "ttft", "tpot") + COMMON)
    slo_class = opts.required("slo_class", 'set slo_class: "<the tap class name>", e.g. "interactive"')
    for name in ("ttft", "tpot"):  # the tap's thresholds for the class (it reads them from the same spec)
        opts.number(name, lo=0)
    by = opts.by()
    # `models` maps requests to this class in the tap: the slo_class label already applies it.
    matchers = [promql.matcher(c.LABEL_SLO_CLASS, "=", slo_class)] + opts.matchers()
    # Every outcome but the neutral ones: the bad ones (a deadline hit, a client that gave up) count
    # in the total and never as good, so a hung engine burns goodput at a ratio of 1.
    neutral = any_of(c.TAP_NEUTRAL_OUTCOMES)
    total_sel = rule_selector(c.TAP_REQUESTS.name, matchers + [Matcher(c.LABEL_OUTCOME, "!~", neutral)])
    good_sel = rule_selector(c.GOODPUT_REQUESTS.name, matchers)
    total = aggregate(promql.rate(total_sel), by)
    good = aggregate(promql.rate(good_sel), by)
    fixtures: tuple[SeriesFixture, ...] = ()
    labels = _fixture_labels({c.LABEL_SLO_CLASS: slo_class}, opts.matchers(), by)
    if labels is not None:
        fixtures = (
            SeriesFixture(c.TAP_REQUESTS.name, {**labels, c.LABEL_OUTCOME: c.OUTCOME_OK}, "total"),
            SeriesFixture(c.GOODPUT_REQUESTS.name, labels, "good"),
        ) + late_fixtures(c.TAP_REQUESTS.name, labels)
    return EventsSLI(
        # `or 0 * total`: the tap may create the good counter only on the first good request.
        error_query=f"{total}\n-\n({good} or 0 * {total})",
        total_query=total,
        sources=(total_sel,),
        fixtures=fixtures,
        plugin=GOODPUT,
        plugin_options=dict(opts.raw),
        by=by,
    )


def availability(req: SLIPluginRequest) -> EventsSLI:
    """Share of requests that failed: tap outcomes, or the engine's finished reasons."""
    opts = _Options(AVAILABILITY, req.options, ("source", "slo_class", "error_reasons") + COMMON)
    source = opts.choice("source", (SOURCE_TAP, SOURCE_ENGINE), SOURCE_TAP)
    by = opts.by()
    model_m, model_l = _model_matchers(opts) if not opts.get("slo_class") else ([], {})
    matchers = opts.matchers() + model_m
    base = dict(model_l)
    if source == SOURCE_TAP:
        if opts.get("error_reasons"):
            raise PluginError("error_reasons applies to source: engine", "error_reasons",
                              "remove it; the tap's bad outcomes are fixed: " + ", ".join(c.TAP_BAD_OUTCOMES))
        slo_class = opts.get("slo_class")
        if slo_class:
            matchers = [promql.matcher(c.LABEL_SLO_CLASS, "=", slo_class)] + matchers
            base[c.LABEL_SLO_CLASS] = slo_class
        metric = c.TAP_REQUESTS.name
        label = c.LABEL_OUTCOME
        bad, neutral = c.TAP_BAD_OUTCOMES, c.TAP_NEUTRAL_OUTCOMES
        good_value = c.OUTCOME_OK
    else:
        if opts.get("slo_class"):
            raise PluginError("slo_class is a label of the tap's series only", "slo_class",
                              'use models: "<globs>" with source: "engine"')
        bad = tuple(x.strip() for x in opts.get("error_reasons", ",".join(c.FINISHED_BAD_REASONS)).split(",") if x.strip())
        unknown = [r for r in bad if r not in c.FINISHED_REASONS]
        if unknown:
            raise PluginError(f"unknown finished reason(s) {', '.join(unknown)}", "error_reasons",
                              f"use reasons among: {', '.join(c.FINISHED_REASONS)}")
        metric = c.REQUESTS_FINISHED.name
        label = c.LABEL_REASON
        neutral = ()
        good_value = next(r for r in c.FINISHED_REASONS if r not in bad)
    bad_sel = rule_selector(metric, matchers + [Matcher(label, "=~", any_of(bad))])
    total_sel = rule_selector(metric, matchers + ([Matcher(label, "!~", any_of(neutral))] if neutral else []))
    fixtures: tuple[SeriesFixture, ...] = ()
    labels = _fixture_labels(base, opts.matchers(), by)
    if labels is not None:
        fixtures = (
            SeriesFixture(metric, {**labels, label: good_value}, "good"),
            SeriesFixture(metric, {**labels, label: bad[0]}, "bad"),
        )
        if source == SOURCE_TAP:
            fixtures += late_fixtures(metric, labels)
    return EventsSLI(
        error_query=aggregate(promql.rate(bad_sel), by),
        total_query=aggregate(promql.rate(total_sel), by),
        sources=(total_sel,),
        fixtures=fixtures,
        plugin=AVAILABILITY,
        plugin_options=dict(opts.raw),
        by=by,
    )


def kv_headroom(req: SLIPluginRequest) -> EventsSLI:
    """Share of engine-time with KV-cache usage above `threshold`: a time-based SLI as events.

    An auxiliary rule samples `usage > bool threshold` per engine at every evaluation; each
    sample is one event (1 = saturated). Errors are the saturated samples in a window, the
    total all samples, so the ratio is the fraction of engine-time without headroom.
    """
    opts = _Options(KV_HEADROOM, req.options, ("threshold",) + COMMON)
    threshold = opts.number("threshold", "0.9", lo=0, hi=1)
    by = opts.by()
    model_m, model_l = _model_matchers(opts)
    matchers = opts.matchers() + model_m
    usage_sel = rule_selector(c.KV_CACHE_USAGE.name, matchers)
    aux_sel = f'{c.SLO.KV_SATURATED}{{{c.SLO.LABEL_ID}="{quote(req.slo_id)}"}}'
    aux = RecordingRule(
        record=c.SLO.KV_SATURATED,
        expr=f"{usage_sel} > bool {threshold!r}",
        labels={c.SLO.LABEL_ID: req.slo_id},
    )
    fixtures: tuple[SeriesFixture, ...] = ()
    labels = _fixture_labels(dict(model_l), opts.matchers(), by)
    if labels is not None:
        fixtures = (SeriesFixture(c.KV_CACHE_USAGE.name, labels, "gauge", good_value=round(threshold * 0.6, 6),
                                  bad_value=round(threshold + (1 - threshold) * 0.5, 6)),)
    return EventsSLI(
        error_query=aggregate(f"sum_over_time({aux_sel}[{promql.WINDOW}])", by),
        total_query=aggregate(f"count_over_time({aux_sel}[{promql.WINDOW}])", by),
        aux_rules=(aux,),
        sources=(usage_sel,),
        fixtures=fixtures,
        plugin=KV_HEADROOM,
        plugin_options=dict(opts.raw),
        by=by,
        time_based=True,
    )


register_sli_plugin(LATENCY, latency)
register_sli_plugin(GOODPUT, goodput)
register_sli_plugin(AVAILABILITY, availability)
register_sli_plugin(KV_HEADROOM, kv_headroom)
