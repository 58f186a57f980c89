"""`llmslo/latency` and `llmslo/availability` over a gateway's own series (sources llm-d, envoy-ai-gateway, dynamo).

The names, the model label and the label values are the gateway's (llmslo/gateways.py), not the exporter's: the
queries read what Prometheus scrapes from the gateway. Latency is `measurable(count) - bucket{le=threshold}` over
`measurable(count)`, as for the engines: a gateway's histogram, like an engine's, observes finished requests only,
so a hang shows as falling traffic and the no-data alert, not as slow requests. Availability is the gateway's own
error counter over every request it counts; a request the gateway refused before its counter of all requests saw
it (llm-d counts a request once it is scheduled) is added to the total from the error counter, so an outage where
every request is refused reads 1, not 0/0.

Test series are shaped as the gateway writes them: its family names, its model label, its other labels, and a
bucket bound spelled as Go's and Rust's clients spell it (`1`, not `1.0`).
"""

from __future__ import annotations

from llmslo import conventions as c
from llmslo import gateways as gw
from llmslo.bucket_edges import edge_text
from llmslo.globs import glob_regex
from llmslo.gofloat import go_g
from llmslo.sli_plugins import AVAILABILITY, LATENCY, AvailabilityParams, LatencyParams, Selection
from slogen import promql
from slogen.model import EventsSLI, SeriesFixture
from slogen.plugins.queries import aggregate, fixture_labels, glob_example, le_regex, measurable
from slogen.promql import Matcher, rule_selector

__all__ = ["gateway_availability", "gateway_latency"]


def _scope(gateway: gw.Gateway, selection: Selection, fixed: gw.Fixed) -> tuple[list[Matcher], dict[str, str]]:
    """The SLI's matchers (the spec's selector, its model globs on the gateway's model label, the series' fixed
    matchers) and the fixture labels they imply, with the gateway's other labels."""
    matchers = list(selection.matchers) + _fixed(fixed)
    base = {label: value for label, op, value in gateway.labels if op == "="}
    if selection.models:
        matchers.append(promql.matcher(gateway.model_label, "=~", glob_regex(selection.models_text)))
        base[gateway.model_label] = glob_example(selection.models_text)
    else:
        base[gateway.model_label] = "model-a"
    return matchers, base


def _example(labels: dict[str, str], example: gw.Fixed) -> dict[str, str]:
    """Labels of one example series: the fixture's, with the example's values ("" drops the label, as Prometheus
    reads an empty label as none)."""
    out = {**labels, **{label: value for label, _, value in example}}
    return {k: v for k, v in out.items() if v != ""}


def gateway_latency(p: LatencyParams, options: dict[str, str]) -> EventsSLI:
    """Share of the gateway's requests slower than the threshold, from its own histogram."""
    gateway = gw.GATEWAYS[p.source]
    hist = gateway.latency[p.metric]
    by = p.selection.by
    matchers, base = _scope(gateway, p.selection, hist.fixed)
    if p.rounded:  # downstream (runbooks, dashboards) shows what is measured
        options = {**options, "threshold": edge_text(p.threshold), "threshold_as_written": options["threshold"].strip()}
    le = promql.matcher(c.LABEL_LE, "=~", le_regex(p.threshold))
    count_sel = rule_selector(hist.count(), matchers)
    bucket_sel = rule_selector(hist.bucket(), matchers + [le])
    count = aggregate(measurable(count_sel, bucket_sel), by)
    good = aggregate(promql.rate(bucket_sel), by)
    fixtures: tuple[SeriesFixture, ...] = ()
    labels = fixture_labels(base, matchers, by)
    if labels is not None:
        fixtures = (SeriesFixture(hist.count(), labels, "total"),
                    SeriesFixture(hist.bucket(), {**labels, c.LABEL_LE: go_g(p.threshold)}, "good"))
    return EventsSLI(plugin=LATENCY, plugin_options=options, by=by, params=p, error_query=f"{count}\n-\n{good}",
                     total_query=count, sources=(count_sel, bucket_sel), fixtures=fixtures)


def gateway_availability(p: AvailabilityParams, options: dict[str, str]) -> EventsSLI:
    """Share of the gateway's requests that failed, by its own error counter (client faults left out)."""
    gateway = gw.GATEWAYS[p.source]
    a = gateway.availability
    by = p.selection.by
    matchers, base = _scope(gateway, p.selection, ())
    bad_sel = rule_selector(a.bad.metric, matchers + _fixed(a.bad.fixed))
    totals = [aggregate(promql.rate(rule_selector(t.metric, matchers + _fixed(t.fixed))), by) for t in a.total]
    total = totals[0]
    for extra in totals[1:]:
        # `extra or 0 * total`: the error counter is born at its first error; the trailing `or extra` keeps a
        # group where every request was refused before the counter of all requests saw one.
        total = f"{total}\n+\n({extra}\nor\n0 * {total})\nor\n{extra}"
    fixtures: tuple[SeriesFixture, ...] = ()
    labels = fixture_labels(base, list(p.selection.matchers), by)
    if labels is not None:
        # One counter of all requests (llm-d's request_total: role total, the failures counted in it too) or
        # one series per outcome of the same counter (role good beside role bad).
        first = "total" if a.bad.metric != a.total[0].metric else "good"
        fixtures = (SeriesFixture(a.total[0].metric, _example(labels, a.good_example), first),
                    SeriesFixture(a.bad.metric, _example(labels, a.bad_example), "bad"))
    return EventsSLI(plugin=AVAILABILITY, plugin_options=options, by=by, params=p,
                     error_query=aggregate(promql.rate(bad_sel), by), total_query=total,
                     sources=(rule_selector(a.total[0].metric, matchers),), fixtures=fixtures)


def _fixed(fixed: gw.Fixed) -> list[Matcher]:
    return [promql.matcher(label, op, value) for label, op, value in fixed]
