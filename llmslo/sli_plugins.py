"""The `llmslo/*` SLI-plugin contract: ids, options, defaults, who measures what, and one option reader.

slogen compiles these plugins into rules and the tap reads the same SLO files for its goodput classes and
histogram edges; both call `read_options`, so `slogen validate` and the tap accept and refuse the same
plugin options, and slogen's later stages use the resolved parameters instead of re-reading strings.

What a spec may write (options are strings, as in Sloth; YAML numbers and booleans are read as their text):

| plugin                 | options                                                          | defaults            |
|------------------------|------------------------------------------------------------------|---------------------|
| llmslo/latency         | metric (ttft tpot e2e itl), threshold (s), source, slo_class,     | source tap          |
|                        | threshold_rounding (down up; not tap), selector, models, by,      | by cluster          |
|                        | engine_versions (engine only), buckets (engine or a gateway)      |                     |
| llmslo/goodput         | slo_class (required), ttft (s), tpot (s), selector, models, by    | by cluster          |
| llmslo/availability    | source, slo_class (tap only), error_reasons (engine only), ...    | source tap, reasons |
|                        |                                                                  | abort,error         |
| llmslo/kv-headroom     | threshold (ratio in (0, 1]), selector, models, by                | threshold 0.9       |

Rules every reader applies (slogen and the tap both read options through here, so they agree):
* Unknown options are refused (a typo such as `treshold` must not pass silently), and so is an empty value.
* Numbers are plain decimals (`0.5`, `2`, `1e-1`); nan and inf are refused: an infinite objective holds
  every request good and measures nothing.
* Thresholds lie in the plausible range of what they measure (llmslo/ranges.py: `500` as a TTFT is
  refused with "500 looks like milliseconds: write 0.5"), unless the SLO sets `allow_out_of_range: true`.
* Goodput needs `slo_class` and at least one of `ttft` and `tpot`; the one left out is not constrained
  (a batch class may care about TTFT only). Two goodput SLOs naming the same class must give it the same
  ttft, tpot and models (`same_class`).
* Source `tap` measures ttft, tpot and e2e; `itl` (per token) only the engine measures. An engine-sourced
  latency threshold must be a bucket edge of every engine the selector picks, or `threshold_rounding` must
  name the common edge to measure (llmslo/engine_thresholds.py); the tap adds every threshold it reads to
  its histograms' edges, so a tap threshold is never rounded.
* Sources `llm-d`, `envoy-ai-gateway` and `dynamo` read that gateway's own series (llmslo/gateways.py), by
  model (`models` on the gateway's model label); each measures the latencies its histograms hold, and its
  threshold must be an edge of the gateway's current histogram (llmslo/bucket_edges.py GATEWAY_ROWS), or of the
  `buckets` the spec declares, or `threshold_rounding` must name one. Goodput takes no source: the tap's.
* A latency threshold must print as a plain decimal bucket bound (from 1e-4 s): the `le` label of a
  bucket is matched as written.
SLO files are found the same way by both (llmslo.specfile.discover: a file as given, or every *.yaml and
*.yml below a directory, recursively, sorted).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Union

from llmslo import conventions as c
from llmslo import fields
from llmslo import gateways as gw
from llmslo.durations import parse_go_duration
from llmslo.engine_thresholds import ROUND_DOWN, ROUND_UP, ROUNDINGS, gateway_threshold, measurable_threshold
from llmslo.engine_versions import BUCKETS_OPTION, VERSIONS_OPTION, declared, parse_buckets
from llmslo.fields import FieldError
from llmslo.plugin_errors import PluginOptionError, PluginOptionErrors
from llmslo.ranges import ALLOW_KEY
from llmslo.ranges import check as range_check
from llmslo.selectors import LABEL_NAME_RE, Matcher, parse_selector
from llmslo.suggest import closest

LATENCY = "llmslo/latency"
GOODPUT = "llmslo/goodput"
AVAILABILITY = "llmslo/availability"
KV_HEADROOM = "llmslo/kv-headroom"
PLUGIN_IDS = (LATENCY, GOODPUT, AVAILABILITY, KV_HEADROOM)
PLUGIN_ID_PREFIX = "llmslo/"

SOURCE_TAP = "tap"  # the goodput tap's per-request series (client side of the proxy)
SOURCE_ENGINE = "engine"  # the engines' own series, normalized by the exporter
# A gateway's own series, as Prometheus scrapes them from it (llmslo/gateways.py): llm-d, envoy-ai-gateway, dynamo.
SOURCES = (SOURCE_TAP, SOURCE_ENGINE) + gw.GATEWAY_SOURCES

DEFAULT_SOURCE = SOURCE_TAP
DEFAULT_BY = (c.LABEL_CLUSTER,)  # one rule set serves a fleet: federation's cluster label survives
DEFAULT_KV_THRESHOLD = "0.9"
DEFAULT_ERROR_REASONS = c.FINISHED_BAD_REASONS

COMMON_OPTIONS = ("selector", "models", "by")
OPTIONS: dict[str, tuple[str, ...]] = {
    LATENCY: ("metric", "threshold", "source", "slo_class", "threshold_rounding", VERSIONS_OPTION, BUCKETS_OPTION)
    + COMMON_OPTIONS,
    GOODPUT: ("slo_class", "ttft", "tpot") + COMMON_OPTIONS,
    AVAILABILITY: ("source", "slo_class", "error_reasons") + COMMON_OPTIONS,
    KV_HEADROOM: ("threshold",) + COMMON_OPTIONS,
}

__all__ = [
    "AVAILABILITY", "GOODPUT", "KV_HEADROOM", "LATENCY", "PLUGIN_IDS", "SOURCE_TAP", "SOURCE_ENGINE", "SOURCES",
    "OPTIONS", "LATENCY_METRICS", "TAP_LATENCY_METRICS", "TAP_OUTCOMES", "ROUND_DOWN", "ROUND_UP", "ROUNDINGS",
    "Matcher", "PluginOptionError", "PluginOptionErrors", "UnknownPluginError", "LatencyParams", "GoodputParams",
    "AvailabilityParams", "KvHeadroomParams", "PluginParams", "read_options", "same_class", "is_llmslo",
]


@dataclass(frozen=True)
class LatencyMetric:
    """A latency the `metric` option names, and the histogram each side writes it to (None: not measured)."""

    name: str
    tap: c.MetricDef | None
    engine: c.MetricDef


LATENCY_METRICS: dict[str, LatencyMetric] = {m.name: m for m in (
    LatencyMetric("ttft", c.TAP_TTFT, c.TTFT),
    LatencyMetric("tpot", c.TAP_TPOT, c.TPOT),
    LatencyMetric("e2e", c.TAP_E2E, c.E2E),
    LatencyMetric("itl", None, c.ITL),  # per token: the tap times requests, not tokens
)}
TAP_LATENCY_METRICS = tuple(name for name, m in LATENCY_METRICS.items() if m.tap is not None)


@dataclass(frozen=True)
class OutcomeSplit:
    """How the tap-sourced SLIs count the tap's request outcomes (names in llmslo.conventions).

    availability: bad / (every outcome but the neutral ones); goodput: the goodput counter / (every outcome
    but the neutral ones), so a bad outcome is never good; latency: a late outcome (a deadline hit, a client
    that gave up after its objective passed) has no latency sample and counts as slower than any threshold.
    """

    ok: str
    bad: tuple[str, ...]
    neutral: tuple[str, ...]  # nobody's fault: left out of every total
    late: tuple[str, ...]  # bad outcomes that mean "too slow"


TAP_OUTCOMES = OutcomeSplit(c.OUTCOME_OK, c.TAP_BAD_OUTCOMES, c.TAP_NEUTRAL_OUTCOMES, c.TAP_LATE_OUTCOMES)


class UnknownPluginError(PluginOptionError):
    """An `llmslo/` plugin id that does not exist (a typo): the spec's `sli.plugin.id` is wrong, not an option."""


# --------------------------------------------------------------------------------------
# Resolved parameters
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Selection:
    """The options every plugin takes: which series (`selector`, `models`) and what to keep (`by`)."""

    matchers: tuple[Matcher, ...] = ()
    models: tuple[str, ...] = ()  # model-name globs (llmslo.globs), "" -> none
    by: tuple[str, ...] = DEFAULT_BY

    @property
    def models_text(self) -> str:
        return ",".join(self.models)


@dataclass(frozen=True)
class LatencyParams:
    plugin = LATENCY
    metric: str
    source: str
    threshold: float  # seconds, as measured (a rounded engine threshold: the common edge)
    threshold_written: float  # seconds, as the spec wrote it
    rounding: str  # "" | down | up
    slo_class: str  # "" | a tap class (source tap only)
    selection: Selection

    @property
    def family(self) -> c.MetricDef:
        m = LATENCY_METRICS[self.metric]
        family = m.tap if self.source == SOURCE_TAP else m.engine
        assert family is not None  # read_options refuses a metric the source does not measure
        return family

    @property
    def rounded(self) -> bool:
        return self.threshold != self.threshold_written


@dataclass(frozen=True)
class GoodputParams:
    plugin = GOODPUT
    slo_class: str
    ttft: float | None  # seconds; None: not constrained
    tpot: float | None
    selection: Selection


@dataclass(frozen=True)
class AvailabilityParams:
    plugin = AVAILABILITY
    source: str
    slo_class: str  # source tap only
    error_reasons: tuple[str, ...]  # source engine only: the finished reasons that are failures
    selection: Selection


@dataclass(frozen=True)
class KvHeadroomParams:
    plugin = KV_HEADROOM
    threshold: float  # KV-cache usage ratio above which an engine has no headroom
    selection: Selection


PluginParams = Union[LatencyParams, GoodputParams, AvailabilityParams, KvHeadroomParams]


def same_class(a: GoodputParams, b: GoodputParams) -> bool:
    """Whether two goodput SLOs define their (same-named) class alike: the tap holds a class to one objective."""
    return (a.ttft, a.tpot, a.selection.models) == (b.ttft, b.tpot, b.selection.models)


def is_llmslo(plugin_id: str) -> bool:
    return plugin_id.startswith(PLUGIN_ID_PREFIX)


# --------------------------------------------------------------------------------------
# The reader
# --------------------------------------------------------------------------------------
_NUMBER_RE = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$")
_EXAMPLES = {"threshold": "0.5", "ttft": "0.5", "tpot": "0.05", "models": "llama-3-8b,chat-*",
             "selector": '{namespace="llm"}', "by": "cluster,region", "slo_class": "interactive"}


def _text(options: Any) -> dict[str, str]:
    """Option values as strings (YAML numbers and booleans as their text); other shapes refused."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise PluginOptionError(f"options must be a mapping of option names to strings, not {type(options).__name__}",
                                "", "write options: {name: \"value\", ...}")
    out: dict[str, str] = {}
    for key, value in options.items():
        name = str(key)
        try:
            text = fields.scalar(value)
        except FieldError:
            hint = " (comma-separated globs)" if name == "models" else ""
            raise PluginOptionError(f"option {name!r} must have a string value, not {value!r}", name,
                                    f'write {name}: "{_EXAMPLES.get(name, "value")}"{hint}') from None
        if text == "":
            raise PluginOptionError(f"option {name!r} has an empty value", name, f"give {name} a value or remove it")
        out[name] = text
    return out


def _duration_seconds(text: str) -> float | None:
    """The seconds a duration with its unit means (`800ms`, `1.2s`, `1m30s`: Go's grammar), or None for text that
    is none. Options in seconds take the plain number, the histogram's `le` bound as written, so a duration is
    refused and its fix says the number it meant."""
    try:
        seconds = parse_go_duration(text)
    except ValueError:
        return None
    return seconds if seconds > 0 and math.isfinite(seconds) else None


class _Reader:
    """One plugin's options as strings: typed getters, each error naming the option and the fix."""

    def __init__(self, plugin: str, options: Any, allow_out_of_range: bool = False):
        self.plugin = plugin
        self.allow_out_of_range = allow_out_of_range
        self.raw = _text(options)
        known = OPTIONS[plugin]
        unknown = sorted(set(self.raw) - set(known))
        if unknown:
            near = closest(unknown[0], known)
            fix = f"did you mean {near}? (known: {', '.join(known)})" if near else f"use only: {', '.join(known)}"
            if unknown[0] == ALLOW_KEY:
                fix = f"{ALLOW_KEY} is a key of the SLO, beside objective, not a plugin option"
            if plugin == GOODPUT and "source" in unknown:
                raise PluginOptionError(f"plugin {GOODPUT} takes no source: the goodput tap measures it, because "
                                        f"{gw.GOODPUT_NOT_FROM_GATEWAYS}", "source",
                                        "remove source and put the tap in front of the engine (docs/deploy.md); "
                                        f"for a gateway's TTFT or TPOT alone use {LATENCY} with source: "
                                        f"{' or '.join(gw.GATEWAY_SOURCES)}")
            raise PluginOptionError(f"unknown option(s) {', '.join(unknown)} for plugin {plugin}", unknown[0], fix)

    def get(self, name: str, default: str = "") -> str:
        """The option, stripped; a control character in it (a newline in a class, a label value) is refused, as
        the rules would hold it where PromQL and promtool cannot parse it. A PromQL selector may span lines."""
        value = self.raw.get(name, default).strip()
        bad = next((ch for ch in value if ord(ch) < 32 or ord(ch) == 127), None) if name != "selector" else None
        if bad is not None:
            raise PluginOptionError(f"option {name!r} holds a control character ({bad!r}): it ends up in a label value",
                                    name, f"write {name} on one line, without control characters")
        return value

    def required(self, name: str, fix: str) -> str:
        value = self.get(name)
        if not value:
            raise PluginOptionError(f"option {name!r} is missing: plugin {self.plugin} needs it", name, fix)
        return value

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        value = self.get(name, default)
        if not value:
            raise PluginOptionError(f"option {name!r} is missing: plugin {self.plugin} needs it", name,
                                    f"set {name} to one of: {', '.join(choices)} (under sli.plugin.options)")
        if value not in choices:
            raise PluginOptionError(f"option {name!r} is {value!r}, not one of {', '.join(choices)}", name,
                                    f"set {name} to one of: {', '.join(choices)}")
        return value

    def number(self, name: str, *, default: str = "", hi: float | None = None, unit: str = "seconds",
               plausible: str = "") -> float:
        """A finite number above 0 (at most `hi`), within llmslo.ranges.RANGES[plausible] unless the SLO allows
        values out of range."""
        text = self.get(name, default)
        example = _EXAMPLES.get(name, "0.5")
        if not text:
            raise PluginOptionError(f"option {name!r} is missing: plugin {self.plugin} needs it", name,
                                    f'set {name}: "{example}" ({unit})')
        if not _NUMBER_RE.match(text):
            if text.lower().lstrip("+-") in ("inf", "infinity", "nan"):
                raise PluginOptionError(f"option {name!r} is not a finite number: {text!r}", name,
                                        f'write {name}: "0.5" (a finite decimal; nan and inf cannot be a threshold)')
            seconds = _duration_seconds(text) if unit == "seconds" else None
            if seconds is not None:
                raise PluginOptionError(f"option {name!r} is {text!r}, a duration: it takes plain seconds", name,
                                        f'write {name}: "{seconds:.12g}"')
            plain = " (plain seconds, not 500ms)" if unit == "seconds" else ""
            raise PluginOptionError(f"option {name!r} is {text!r}, not a number", name,
                                    f'write {name}: "{example}"{plain}')
        try:
            value = fields.finite(text, strings=True)
        except FieldError:  # a decimal too large for a float
            raise PluginOptionError(f"option {name!r} is not a finite number: {text!r}", name,
                                    f'write {name}: "0.5" (a finite decimal; nan and inf cannot be a threshold)') from None
        if plausible and value > 0 and not self.allow_out_of_range:
            wrong = range_check(plausible, value)
            if wrong is not None:
                keep = f"or set {ALLOW_KEY}: true on the SLO to keep {text}"
                fix = (f'write {name}: "{wrong.suggested:.12g}", {keep}' if wrong.suggested is not None
                       else f"choose a value in the range, {keep}")
                raise PluginOptionError(f"option {name!r}: {wrong.message}", name, fix)
        if hi is not None and not 0 < value <= hi:
            rng = f"(0, {hi:g}]"
            raise PluginOptionError(f"option {name!r} is {value:g}, outside {rng}", name, f"choose {name} in {rng}")
        if value <= 0:
            raise PluginOptionError(f"option {name!r} is {text!r}: it must be a positive number of {unit}", name,
                                    f'write {name}: "{example}"')
        return value

    def each(self, *reads: Callable[[], Any]) -> list[Any]:
        """Every read's value; where some fail, every failure at once (PluginOptionErrors), not only the first."""
        values, errors = [], []
        for read in reads:
            try:
                values.append(read())
            except PluginOptionError as e:
                errors.append(e)
        if len(errors) > 1:
            raise PluginOptionErrors(errors)
        if errors:
            raise errors[0]
        return values

    def selection(self, *, models: bool = True) -> Selection:
        by: tuple[str, ...] = DEFAULT_BY
        if "by" in self.raw:
            by = tuple(x.strip() for x in self.raw["by"].split(",") if x.strip())
            for label in by:
                if not LABEL_NAME_RE.match(label):
                    raise PluginOptionError(f"option 'by' has {label!r}, not a label name", "by",
                                            'write by: "cluster,region"')
        globs = tuple(g.strip() for g in self.get("models").split(",") if g.strip()) if models else ()
        return Selection(parse_selector(self.get("selector")), globs, by)


def _latency(r: _Reader) -> LatencyParams:
    metric = r.choice("metric", tuple(LATENCY_METRICS), "")
    source = r.choice("source", SOURCES, DEFAULT_SOURCE)
    threshold = r.number("threshold", plausible=metric)
    rounding = r.get("threshold_rounding")
    if rounding and rounding not in ROUNDINGS:
        raise PluginOptionError(f"option 'threshold_rounding' is {rounding!r}, not one of {', '.join(ROUNDINGS)}",
                                "threshold_rounding", 'write threshold_rounding: "down" or "up", or leave it out')
    if rounding and source == SOURCE_TAP:
        raise PluginOptionError("threshold_rounding applies to source: engine or a gateway "
                                f"({', '.join(gw.GATEWAY_SOURCES)}), not the tap", "threshold_rounding",
                                "remove it: the tap adds every threshold it reads to its histograms' edges")
    if source == SOURCE_TAP and LATENCY_METRICS[metric].tap is None:
        raise PluginOptionError(f"metric {metric!r} is only measured by the engine, not the tap", "source",
                                f'set source: engine, or use one of {", ".join(TAP_LATENCY_METRICS)} with the tap')
    slo_class = r.get("slo_class")
    selection = r.selection()
    if slo_class and source != SOURCE_TAP:
        raise PluginOptionError("slo_class is a label of the tap's series only", "slo_class",
                                f'use models: "<globs>" to pick requests with source: {source}, or source: "tap"')
    if source in gw.GATEWAYS:
        measured = _gateway_latency(r, source, metric, threshold, rounding, selection)
    else:
        decl = declared(r.get(VERSIONS_OPTION), r.get(BUCKETS_OPTION))
        if decl.any and source != SOURCE_ENGINE:
            name = VERSIONS_OPTION if decl.versions else BUCKETS_OPTION
            where = "source: engine only" if decl.versions else "source: engine or a gateway, not the tap"
            raise PluginOptionError(f"{name} applies to {where}", name,
                                    "remove it: the tap adds every threshold it reads to its histograms' edges")
        # Only `selector` can name engine kinds (a `models` matcher is on the model label).
        measured = measurable_threshold(metric, threshold, selection.matchers, rounding, decl) \
            if source == SOURCE_ENGINE else threshold
    _plain_bound(measured)
    return LatencyParams(metric, source, measured, threshold, rounding, slo_class, selection)


def _gateway_latency(r: _Reader, source: str, metric: str, threshold: float, rounding: str,
                     selection: Selection) -> float:
    """The threshold a gateway-sourced latency SLI measures (an edge of the gateway's histogram, or of the
    spec's `buckets`); the metric must be one the gateway measures."""
    gateway = gw.GATEWAYS[source]
    if metric not in gateway.latency:
        raise PluginOptionError(f"metric {metric!r} is not measured by {gateway.title} (source {source}): it has no "
                                f"such histogram", "metric",
                                f"use one of {', '.join(gateway.latency)} with source {source}, or another source")
    if r.get(VERSIONS_OPTION):
        raise PluginOptionError(f"{VERSIONS_OPTION} names engine kinds and applies to source: engine only",
                                VERSIONS_OPTION, f'remove it; if your {source} runs other buckets, declare them: '
                                f'{BUCKETS_OPTION}: "<edges, seconds>"')
    _gateway_models(gateway, selection)
    text = r.get(BUCKETS_OPTION)
    if ":" in text:
        raise PluginOptionError(f"option {BUCKETS_OPTION!r} names a kind, but source {source} is one gateway",
                                BUCKETS_OPTION, f'write the edges alone: {BUCKETS_OPTION}: "0.5, 1, 2"')
    buckets = parse_buckets(text)[""] if text else None
    return gateway_threshold(source, metric, threshold, rounding, buckets)


def _gateway_models(gateway: gw.Gateway, selection: Selection) -> None:
    """A `models` glob with capitals never matches a gateway that lowercases its model label (Dynamo's frontend)."""
    upper = next((g for g in selection.models if g != g.lower()), None)
    if gateway.lowercase_models and upper is not None:
        raise PluginOptionError(f"models glob {upper!r} has capitals, but {gateway.title} writes its "
                                f"{gateway.model_label} label in lower case: it would match nothing", "models",
                                f'write models: "{selection.models_text.lower()}"')


def _plain_bound(threshold: float) -> None:
    """A bucket bound slogen can match however the exporter spells it (`le="0.5"` or `le="0.50"`)."""
    text = repr(threshold)
    if "e" in text:
        raise PluginOptionError(f"threshold {threshold!r} must be a plain decimal bucket bound", "threshold",
                                "write the bound as it appears in the histogram, e.g. 0.5 or 2.5")


def _goodput(r: _Reader) -> GoodputParams:
    slo_class, ttft, tpot = r.each(
        lambda: r.required("slo_class", 'set slo_class: "<the tap class name>", e.g. "interactive"'),
        lambda: r.number("ttft", plausible="ttft") if r.get("ttft") else None,
        lambda: r.number("tpot", plausible="tpot") if r.get("tpot") else None)
    if ttft is None and tpot is None:
        raise PluginOptionError(f"plugin {GOODPUT} needs ttft and/or tpot: a class without objectives has no goodput",
                                "ttft", 'give ttft and/or tpot in seconds, e.g. ttft: "0.5", tpot: "0.05"')
    return GoodputParams(slo_class, ttft, tpot, r.selection())


def _availability(r: _Reader) -> AvailabilityParams:
    source = r.choice("source", SOURCES, DEFAULT_SOURCE)
    slo_class = r.get("slo_class")
    reasons: tuple[str, ...] = ()
    if source in gw.GATEWAYS:
        if slo_class or r.get("error_reasons"):
            name = "slo_class" if slo_class else "error_reasons"
            owner = "the tap's series" if slo_class else "the engine's finished reasons"
            raise PluginOptionError(f"{name} applies to {owner} only, not to source {source}", name,
                                    f"remove it: {source}'s own error counter decides which requests failed "
                                    "(docs/slogen.md, Gateways as SLI sources); pick requests with models")
        selection = r.selection()
        _gateway_models(gw.GATEWAYS[source], selection)
        return AvailabilityParams(source, "", (), selection)
    if source == SOURCE_TAP:
        if r.get("error_reasons"):
            raise PluginOptionError("error_reasons applies to source: engine", "error_reasons",
                                    "remove it; the tap's bad outcomes are fixed: " + ", ".join(TAP_OUTCOMES.bad))
    else:
        if slo_class:
            raise PluginOptionError("slo_class is a label of the tap's series only", "slo_class",
                                    'use models: "<globs>" with source: "engine"')
        text = r.get("error_reasons", ",".join(DEFAULT_ERROR_REASONS))
        reasons = tuple(x.strip() for x in text.split(",") if x.strip())
        unknown = [x for x in reasons if x not in c.FINISHED_REASONS]
        if unknown:
            raise PluginOptionError(f"unknown finished reason(s) {', '.join(unknown)}", "error_reasons",
                                    f"use reasons among: {', '.join(c.FINISHED_REASONS)}")
        if not reasons or set(reasons) >= set(c.FINISHED_REASONS):
            raise PluginOptionError(f"error_reasons {text!r} leaves no bad or no good finished reason", "error_reasons",
                                    f"name some, not all, of: {', '.join(c.FINISHED_REASONS)}")
    return AvailabilityParams(source, slo_class, reasons, r.selection())


def _kv_headroom(r: _Reader) -> KvHeadroomParams:
    return KvHeadroomParams(r.number("threshold", default=DEFAULT_KV_THRESHOLD, hi=1, unit="ratio",
                                     plausible="kv_ratio"), r.selection())


def _plugin_fix(plugin_id: str) -> str:
    near = closest(plugin_id, PLUGIN_IDS)
    return (f"did you mean {near}? " if near else "") + f"use one of the built-in plugins: {', '.join(PLUGIN_IDS)}"


_RESOLVERS: dict[str, Callable[[_Reader], PluginParams]] = {
    LATENCY: _latency, GOODPUT: _goodput, AVAILABILITY: _availability, KV_HEADROOM: _kv_headroom}


def read_options(plugin_id: str, options: Any, *, allow_out_of_range: bool = False) -> PluginParams:
    """The resolved parameters of one `llmslo/*` SLI: `options` as a spec wrote them (a mapping, or None).

    Thresholds must lie in their plausible range (llmslo.ranges) unless the SLO sets `allow_out_of_range`.

    PluginOptionError names the option and the fix (UnknownPluginError: the id itself is wrong); the
    caller adds the file, line and SLO. Pure: the same options give the same parameters everywhere.
    """
    resolve = _RESOLVERS.get(plugin_id)
    if resolve is None:
        raise UnknownPluginError(f"unknown SLI plugin {plugin_id!r}", "",
                                 _plugin_fix(plugin_id))
    return resolve(_Reader(plugin_id, options, allow_out_of_range))
