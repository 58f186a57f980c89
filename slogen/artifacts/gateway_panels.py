"""The source panels of a gateway-sourced SLO (source llm-d, envoy-ai-gateway, dynamo): the gateway's own series.

Latency: percentiles of the SLI's histogram (its fixed matchers too, e.g. llm-d's streamed requests only), one line
per gateway pod: releases of one gateway bucket differently (llmslo/bucket_edges.py GATEWAY_ROWS), and a sum over
unlike ladders would misplace every quantile. Availability: the failed requests and every request the SLI counts,
as its error and total queries count them (a request the gateway refused before counting it included).
"""

from __future__ import annotations

from collections.abc import Sequence

from llmslo import conventions as c
from llmslo import gateways as gw
from slogen import promql as q
from slogen.views import SLOView

__all__ = ["availability_queries", "latency_histogram"]


def _fixed(fixed: gw.Fixed) -> list[q.Matcher]:
    return [q.matcher(label, op, value) for label, op, value in fixed]


def latency_histogram(slo: SLOView, matchers: Sequence[q.Matcher]) -> tuple[c.MetricDef, list[q.Matcher]]:
    """The gateway histogram an SLO's latency SLI reads, and the matchers that pick what it measures."""
    gateway = gw.GATEWAYS[slo.source]
    hist = gateway.latency[slo.latency_metric]
    return (c.MetricDef(hist.family, "histogram", f"{gateway.title}: {slo.latency_metric}", unit="seconds"),
            [*matchers, *_fixed(hist.fixed)])


def availability_queries(slo: SLOView, matchers: Sequence[q.Matcher], window: str) -> tuple[str, str]:
    """(failed, counted) request rates of a gateway availability SLI, as its error and total queries count them;
    failed reads 0, not "No data", where requests flow and none failed (an error counter is born at its first)."""
    a = gw.GATEWAYS[slo.source].availability
    totals = [q.sum_rate(t.metric, [*matchers, *_fixed(t.fixed)], window) for t in a.total]
    counted = totals[0]
    for extra in totals[1:]:
        counted = f"{counted} + ({extra} or 0 * {counted}) or {extra}"
    failed = q.sum_rate(a.bad.metric, [*matchers, *_fixed(a.bad.fixed)], window)
    return f"{failed} or 0 * ({counted})", counted
