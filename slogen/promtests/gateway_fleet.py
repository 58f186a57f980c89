"""Synthetic gateway series for the dashboards' generated tests, and what a gateway-sourced SLO's panels read.

One gateway pod per gateway source the build's SLOs read (llmslo/gateways.py), written as the gateway writes its
series (its names, model label and `le` spelling): every latency histogram of its current bucket ladder
(llmslo/bucket_edges.py GATEWAY_ROWS) and its availability counters, a good, a failed and (llm-d) a refused
request stream. Written once per gateway whatever the number of SLOs, so SLOs sharing a gateway share the series.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmslo import bucket_edges as be
from llmslo import conventions as c
from llmslo import gateways as gw
from llmslo.gofloat import go_g
from slogen import panels as d
from slogen.promtests import fleet_scenario as fs
from slogen.views import SLI_AVAILABILITY, SLI_LATENCY, SLOView

POD = "gateway-0"
MODEL = "gateway-model"
GOOD, BAD, REFUSED = 1.0, 0.5, 0.25  # requests per second: rates promtool computes exactly (fleet_scenario.counter)

Answers = dict[tuple[str, str], list[tuple[dict[str, str], float]]]


def _labels(gateway: gw.Gateway, fixed: gw.Fixed = ()) -> dict[str, str]:
    out = {c.LABEL_CLUSTER: "gateways", c.LABEL_POD: POD, gateway.model_label: MODEL,
           **{label: value for label, op, value in (*gateway.labels, *fixed) if op == "="}}
    return {k: v for k, v in out.items() if v != ""}


def _buckets(source: str, metric: str) -> list[tuple[float, float]]:
    """The cumulative buckets of one latency (+Inf last): a request a second at the ladder's third edge, half a
    request at its sixth."""
    edges = be.gateway_rows(source, metric, current=True)[0].edges[metric]
    dist = ((edges[2], GOOD), (edges[5], BAD))
    return [(e, sum(n for v, n in dist if v <= e)) for e in edges] + [(float("inf"), GOOD + BAD)]


def gateway_series(slos: Sequence[SLOView]) -> list[tuple[str, dict[str, str], str]]:
    out: list[tuple[str, dict[str, str], str]] = []
    for source in sorted({s.source for s in slos if s.source in gw.GATEWAYS}):
        gateway = gw.GATEWAYS[source]
        for metric, hist in gateway.latency.items():
            labels = _labels(gateway, hist.fixed)
            buckets = _buckets(source, metric)
            out += [(hist.bucket(), {**labels, c.LABEL_LE: "+Inf" if e == float("inf") else go_g(e)}, fs.counter(n))
                    for e, n in buckets]
            out.append((hist.count(), labels, fs.counter(buckets[-1][1])))
        a = gateway.availability
        out.append((a.total[0].metric, _labels(gateway, a.good_example), fs.counter(GOOD)))
        out.append((a.bad.metric, _labels(gateway, a.bad_example), fs.counter(BAD)))
        if a.refused_example:
            out.append((a.bad.metric, _labels(gateway, a.refused_example), fs.counter(REFUSED)))
    return out


def gateway_answers(slo: SLOView) -> Answers:
    """What a gateway-sourced SLO's source panels read off `gateway_series`."""
    gateway = gw.GATEWAYS[slo.source]
    if slo.sli_kind == SLI_LATENCY:
        name = slo.latency_metric.upper()
        base = f"{name} percentiles vs the {slo.threshold:g}s threshold" if slo.threshold else f"{name} percentiles"
        buckets = _buckets(slo.source, slo.latency_metric)
        title = d.gateway_latency_title(base, gateway.title)
        return {(title, ref): [({c.LABEL_POD: POD}, fs.bucket_quantile(q, buckets))] for q, ref in d.QUANTILES}
    if slo.sli_kind == SLI_AVAILABILITY:
        a = gateway.availability
        refused = REFUSED if a.refused_example else 0.0
        # a counter of all requests counts the failures too; one series per outcome adds them
        counted = GOOD + refused + (BAD if a.bad.metric == a.total[0].metric else 0.0)
        return {(d.GATEWAY_AVAILABILITY_TITLE, "A"): [({}, BAD + refused)],
                (d.GATEWAY_AVAILABILITY_TITLE, "B"): [({}, counted)]}
    return {}
