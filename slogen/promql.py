"""The one PromQL builder: matchers, selectors, rates and aggregations, for rules, dashboards, KEDA and runbooks.

Every metric and label name a query mentions comes in as a constant from `llmslo.conventions`
(or from a spec's own selector); this module only knows PromQL syntax. Keeping syntax and names
apart is what lets a test parse the names back out of every generated query and compare them
with the conventions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from llmslo import conventions as c
from llmslo.selectors import Matcher, quote  # the one Matcher (spec selectors are parsed into it too)

# Sloth's template variable for a rule's rate window; slogen expands it per window.
WINDOW = "{{.window}}"


def matcher(label: str, op: str, value: str) -> Matcher:
    """A matcher on the plain (unescaped) `value`."""
    return Matcher(label, op, quote(value))


def eq(label: str, value: str) -> Matcher:
    return matcher(label, "=", value)


def regex(label: str, value: str) -> Matcher:
    return matcher(label, "=~", value)


def selector(metric: str, matchers: Iterable[Matcher] = (), *, compact: bool = False) -> str:
    """`metric{a="x", b=~"y"}` (`compact`: no space after commas, as rule files are written);
    the braces are left out when there are no matchers."""
    rendered = ("," if compact else ", ").join(m.render() for m in matchers)
    return f"{metric}{{{rendered}}}" if rendered else metric


def rule_selector(metric: str, matchers: Iterable[Matcher] = ()) -> str:
    """A selector as rule files write it (Sloth's style, no space after commas)."""
    return selector(metric, matchers, compact=True)


def any_of(values: Iterable[str]) -> str:
    """A regex matching any of `values` (tap outcomes, finished reasons): `upstream_timeout|client_gave_up`."""
    return "|".join(values)


def by(labels: Sequence[str]) -> str:
    return f"by ({', '.join(labels)})" if labels else ""


def agg(op: str, expr: str, labels: Sequence[str] = ()) -> str:
    """`sum by (a, b) (expr)`; a plain `sum(expr)` without grouping labels."""
    grouping = by(labels)
    return f"{op} {grouping} ({expr})" if grouping else f"{op}({expr})"


def rate(sel: str, window: str = WINDOW) -> str:
    """`rate(sel[window])`; the default window is Sloth's template variable, as rules write it."""
    return f"rate({sel}[{window}])"


def sum_rate(metric: str, matchers: Iterable[Matcher], window: str, labels: Sequence[str] = ()) -> str:
    return agg("sum", rate(selector(metric, matchers), window), labels)


def ratio(numerator: str, denominator: str) -> str:
    return f"({numerator}) / ({denominator})"


def histogram_quantile(q: float, histogram: c.MetricDef, matchers: Iterable[Matcher], window: str,
                       labels: Sequence[str] = ()) -> str:
    """A quantile from a histogram's buckets, keeping `le` plus the grouping labels."""
    grouped = agg("sum", rate(selector(histogram.bucket(), matchers), window), (*labels, c.LABEL_LE))
    return f"histogram_quantile({q:g}, {grouped})"


def bucket_rates(histogram: c.MetricDef, matchers: Iterable[Matcher], window: str) -> str:
    """Per-bucket rates summed by `le`: the input of a heatmap panel."""
    return agg("sum", rate(selector(histogram.bucket(), matchers), window), (c.LABEL_LE,))


def or_zero(expr: str) -> str:
    """Answer 0 when `expr` has no series, so a missing signal means "nothing to do", not an error."""
    return f"({expr}) or vector(0)"


def finite(expr: str) -> str:
    """Drop NaN (0/0 with no traffic) and keep real values: `x >= 0` is false for NaN."""
    return f"({expr}) >= 0"
