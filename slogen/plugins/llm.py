"""Built-in LLM-serving SLIs: one line of spec each for TTFT/TPOT/E2E/ITL latency, goodput,
availability and KV-cache headroom.

Every plugin resolves into an events SLI (error and total queries with `{{.window}}`), so the
generators treat it like any Sloth events SLI and the period SLI is traffic-weighted. Metric
and label names come from `llmslo.conventions` only. Queries aggregate `by (cluster)` (option
`by`) so that one rule set serves a fleet: labels added by federation or remote-write survive.
Each plugin also names its source selectors (for the no-data alert) and how to synthesize
its source series (for generated promtool tests).

Ids, options, defaults and their validation are the `llmslo/*` contract's (llmslo/sli_plugins.py),
which the tap reads the same files through; each plugin turns the resolved parameters into queries
and keeps them on the SLI (`EventsSLI.params`), so later stages never read the option strings again.
"""

from __future__ import annotations

from typing import Any

from llmslo import conventions as c
from llmslo import gateways as gw
from llmslo import sli_plugins as sp
from llmslo.bucket_edges import edge_text
from llmslo.globs import glob_regex
from llmslo.selectors import parse_selector
from llmslo.sli_plugins import (
    AVAILABILITY,
    GOODPUT,
    KV_HEADROOM,
    LATENCY,
    SOURCE_ENGINE,
    SOURCE_TAP,
    TAP_OUTCOMES,
    AvailabilityParams,
    GoodputParams,
    KvHeadroomParams,
    LatencyParams,
    Selection,
)
from slogen import promql
from slogen.model import EventsSLI, RecordingRule, SeriesFixture
from slogen.plugins.contract import SLIPluginRequest
from slogen.plugins.gateway_sli import gateway_availability, gateway_latency
from slogen.plugins.queries import aggregate, fixture_labels, glob_example, le_label, le_regex, measurable
from slogen.promql import Matcher, any_of, quote, rule_selector

# --------------------------------------------------------------------------------------
# PromQL building blocks
# --------------------------------------------------------------------------------------


def late_selector(matchers: list[Matcher]) -> str:
    """The tap's requests that ended late (conventions.TAP_LATE_OUTCOMES) among those `matchers` pick.

    The tap's latency histograms observe completed requests only: one that hit the tap's deadline
    or whose client gave up after its objective had passed has no latency sample, yet it is the
    slowest request of all. A latency SLI over the tap adds these to its bad and total events.
    """
    late = Matcher(c.LABEL_OUTCOME, "=~", any_of(TAP_OUTCOMES.late))
    return rule_selector(c.TAP_REQUESTS.name, matchers + [late])


def late_fixtures(metric: str, labels: dict[str, str]) -> tuple[SeriesFixture, ...]:
    """One "late" test series per late outcome, so the generated tests stage a hang ending in each."""
    return tuple(SeriesFixture(metric, {**labels, c.LABEL_OUTCOME: outcome}, "late", incident=outcome)
                 for outcome in TAP_OUTCOMES.late)


def _model_matchers(selection: Selection) -> tuple[list[Matcher], dict[str, str]]:
    models = selection.models_text
    if not models:
        return [], {}
    regex = glob_regex(models)
    return [promql.matcher(c.LABEL_MODEL, "=~", regex)], {c.LABEL_MODEL: glob_example(models)}


def engine_latency_selectors(sli: EventsSLI) -> tuple[str, str, str] | None:
    """(count, bucket at the threshold, bucket of any `le`) selectors of an engine-sourced llmslo/latency SLI;
    None for any other SLI. The first two are the SLI's `sources`, as `latency` builds them."""
    if not isinstance(sli.params, LatencyParams) or sli.params.source != SOURCE_ENGINE or len(sli.sources) != 2:
        return None
    count_sel, bucket_sel = sli.sources
    name, brace, _ = bucket_sel.partition("{")
    kept = [m for m in parse_selector(brace + _) if m.label != c.LABEL_LE] if brace else []
    return count_sel, bucket_sel, rule_selector(name, kept)


# --------------------------------------------------------------------------------------
# The plugins
# --------------------------------------------------------------------------------------


def _read(plugin: str, req: SLIPluginRequest):
    """The contract's resolved parameters (llmslo.sli_plugins.read_options); its errors are PluginErrors."""
    return sp.read_options(plugin, req.options, allow_out_of_range=req.allow_out_of_range)


def _written(req: SLIPluginRequest) -> dict[str, str]:
    """The options as the spec wrote them (shown in runbooks and info labels; never parsed again)."""
    return {str(k): ("" if v is None else str(v)) for k, v in (req.options or {}).items()}


def _events(plugin: str, req: SLIPluginRequest, p: LatencyParams | GoodputParams | AvailabilityParams | KvHeadroomParams,
            options: dict[str, str] | None = None, **queries: Any) -> EventsSLI:
    """A built-in plugin's SLI: `queries` (error, total, sources, fixtures, ...) with the plugin's id, its options
    as written (unless `options`), its `by` and its resolved parameters."""
    return EventsSLI(plugin=plugin, plugin_options=_written(req) if options is None else options,
                     by=p.selection.by, params=p, **queries)


def _scope(selection: Selection, slo_class: str) -> tuple[list[Matcher], dict[str, str]]:
    """The matchers of an SLI over `selection` and the fixture labels they imply: with a tap class, the class
    (its `models` are the tap's mapping, which the slo_class label already applies), else the model globs."""
    if slo_class:
        return [promql.matcher(c.LABEL_SLO_CLASS, "=", slo_class)] + list(selection.matchers), {c.LABEL_SLO_CLASS: slo_class}
    model_m, model_l = _model_matchers(selection)
    return list(selection.matchers) + model_m, dict(model_l)


def latency(req: SLIPluginRequest) -> EventsSLI:
    """Share of requests slower than `threshold` seconds: count - bucket{le=threshold}, over count, where
    count is only that of the series that have the bucket at the threshold (`measurable`).

    Over the tap, requests that ended late (a deadline hit, a client that gave up) count as slower
    than any threshold, so a hung engine burns the budget instead of silencing the SLI. The
    engine's own histograms cannot see a hang (it never finishes the request): no such term.

    Over the engine, the threshold must be a bucket edge of every engine kind and version the
    selector may pick, or `threshold_rounding` must name the common edge to measure instead (the
    contract's reader checks it: llmslo/engine_thresholds.py); the tap makes every threshold an edge.
    """
    p: LatencyParams = _read(LATENCY, req)
    if p.source in gw.GATEWAYS:
        return gateway_latency(p, _written(req))
    family = p.family
    by = p.selection.by
    matchers, base = _scope(p.selection, p.slo_class)
    plugin_options = _written(req)
    if p.rounded:  # everything downstream (runbooks, dashboards) shows what is measured
        plugin_options.update(threshold=edge_text(p.threshold), threshold_as_written=plugin_options["threshold"].strip())
    threshold = p.threshold
    le = promql.matcher(c.LABEL_LE, "=~", le_regex(threshold))
    count_sel = rule_selector(family.count(), matchers)
    bucket_sel = rule_selector(family.bucket(), matchers + [le])
    count = aggregate(measurable(count_sel, bucket_sel), by)
    good = aggregate(promql.rate(bucket_sel), by)
    error_query, total_query = f"{count}\n-\n{good}", count
    fixtures: tuple[SeriesFixture, ...] = ()
    labels = fixture_labels(base, matchers, by)
    if labels is not None:
        fixtures = (
            SeriesFixture(family.count(), labels, "total"),
            SeriesFixture(family.bucket(), {**labels, c.LABEL_LE: le_label(threshold)}, "good"),
        )
    if p.source == SOURCE_TAP:
        error_query, total_query = _with_late(count, good, aggregate(promql.rate(late_selector(matchers)), by))
        if labels is not None:
            fixtures += late_fixtures(c.TAP_REQUESTS.name, labels)
    return _events(LATENCY, req, p, plugin_options, error_query=error_query, total_query=total_query,
                   sources=(count_sel, bucket_sel), fixtures=fixtures)


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
    """Share of a class's requests not delivered within its TTFT and TPOT objectives (the tap decides, reading
    ttft, tpot and models from the same spec through the same contract)."""
    p: GoodputParams = _read(GOODPUT, req)
    by = p.selection.by
    matchers, base = _scope(p.selection, p.slo_class)
    # Every outcome but the neutral ones: the bad ones (a deadline hit, a client that gave up) count
    # in the total and never as good, so a hung engine burns goodput at a ratio of 1.
    neutral = any_of(TAP_OUTCOMES.neutral)
    total_sel = rule_selector(c.TAP_REQUESTS.name, matchers + [Matcher(c.LABEL_OUTCOME, "!~", neutral)])
    good_sel = rule_selector(c.GOODPUT_REQUESTS.name, matchers)
    total = aggregate(promql.rate(total_sel), by)
    good = aggregate(promql.rate(good_sel), by)
    fixtures: tuple[SeriesFixture, ...] = ()
    labels = fixture_labels(base, list(p.selection.matchers), by)
    if labels is not None:
        fixtures = (
            SeriesFixture(c.TAP_REQUESTS.name, {**labels, c.LABEL_OUTCOME: TAP_OUTCOMES.ok}, "total"),
            SeriesFixture(c.GOODPUT_REQUESTS.name, labels, "good"),
        ) + late_fixtures(c.TAP_REQUESTS.name, labels)
    # `or 0 * total`: the tap may create the good counter only on the first good request.
    return _events(GOODPUT, req, p, error_query=f"{total}\n-\n({good} or 0 * {total})", total_query=total,
                   sources=(total_sel,), fixtures=fixtures)


def availability(req: SLIPluginRequest) -> EventsSLI:
    """Share of requests that failed: the tap's bad outcomes (neutral ones left out), or the engine's finished reasons."""
    p: AvailabilityParams = _read(AVAILABILITY, req)
    if p.source in gw.GATEWAYS:
        return gateway_availability(p, _written(req))
    by = p.selection.by
    matchers, base = _scope(p.selection, p.slo_class)  # slo_class: source tap only (the contract)
    if p.source == SOURCE_TAP:
        metric = c.TAP_REQUESTS.name
        label = c.LABEL_OUTCOME
        bad, neutral = TAP_OUTCOMES.bad, TAP_OUTCOMES.neutral
        good_value = TAP_OUTCOMES.ok
    else:
        metric = c.REQUESTS_FINISHED.name
        label = c.LABEL_REASON
        bad, neutral = p.error_reasons, ()
        good_value = next(r for r in c.FINISHED_REASONS if r not in bad)  # the contract leaves one
    bad_sel = rule_selector(metric, matchers + [Matcher(label, "=~", any_of(bad))])
    total_sel = rule_selector(metric, matchers + ([Matcher(label, "!~", any_of(neutral))] if neutral else []))
    fixtures: tuple[SeriesFixture, ...] = ()
    labels = fixture_labels(base, list(p.selection.matchers), by)
    if labels is not None:
        fixtures = (
            SeriesFixture(metric, {**labels, label: good_value}, "good"),
            SeriesFixture(metric, {**labels, label: bad[0]}, "bad"),
        )
        if p.source == SOURCE_TAP:
            fixtures += late_fixtures(metric, labels)
    return _events(AVAILABILITY, req, p, error_query=aggregate(promql.rate(bad_sel), by),
                   total_query=aggregate(promql.rate(total_sel), by), sources=(total_sel,), fixtures=fixtures)


def kv_headroom(req: SLIPluginRequest) -> EventsSLI:
    """Share of engine-time with KV-cache usage above `threshold`: a time-based SLI as events.

    An auxiliary rule samples `usage > bool threshold` per engine at every evaluation; each
    sample is one event (1 = saturated). Errors are the saturated samples in a window, the
    total all samples, so the ratio is the fraction of engine-time without headroom.
    """
    p: KvHeadroomParams = _read(KV_HEADROOM, req)
    threshold = p.threshold
    by = p.selection.by
    model_m, model_l = _model_matchers(p.selection)
    matchers = list(p.selection.matchers) + model_m
    usage_sel = rule_selector(c.KV_CACHE_USAGE.name, matchers)
    aux_sel = f'{c.SLO.KV_SATURATED}{{{c.SLO.LABEL_ID}="{quote(req.slo_id)}"}}'
    aux = RecordingRule(
        record=c.SLO.KV_SATURATED,
        expr=f"{usage_sel} > bool {threshold!r}",
        labels={c.SLO.LABEL_ID: req.slo_id},
    )
    fixtures: tuple[SeriesFixture, ...] = ()
    labels = fixture_labels(dict(model_l), list(p.selection.matchers), by)
    if labels is not None:
        fixtures = (SeriesFixture(c.KV_CACHE_USAGE.name, labels, "gauge", good_value=round(threshold * 0.6, 6),
                                  bad_value=round(threshold + (1 - threshold) * 0.5, 6)),)
    return _events(KV_HEADROOM, req, p, error_query=aggregate(promql.over_time("sum", aux_sel, promql.WINDOW), by),
                   total_query=aggregate(promql.over_time("count", aux_sel, promql.WINDOW), by), aux_rules=(aux,),
                   sources=(usage_sel,), fixtures=fixtures, time_based=True)

