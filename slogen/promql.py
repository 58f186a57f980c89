"""PromQL building blocks over the conventions' names, shared by dashboards, KEDA and runbooks.

Every metric and label name a query mentions comes in as a constant from `llmslo.conventions`;
this module only knows PromQL syntax. Keeping syntax and names apart is what lets a test parse
the names back out of every generated query and compare them with the conventions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from llmslo import conventions as c


@dataclass(frozen=True)
class Matcher:
    """One label matcher, e.g. `namespace=~"$namespace"`."""

    label: str
    op: str  # = != =~ !~
    value: str

    def render(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.label}{self.op}"{escaped}"'


def eq(label: str, value: str) -> Matcher:
    return Matcher(label, "=", value)


def regex(label: str, value: str) -> Matcher:
    return Matcher(label, "=~", value)


def selector(metric: str, matchers: Iterable[Matcher] = ()) -> str:
    """`metric{a="x", b=~"y"}`; the braces are left out when there are no matchers."""
    rendered = ", ".join(m.render() for m in matchers)
    return f"{metric}{{{rendered}}}" if rendered else metric


def by(labels: Sequence[str]) -> str:
    return f"by ({', '.join(labels)})" if labels else ""


def agg(op: str, expr: str, labels: Sequence[str] = ()) -> str:
    """`sum by (a, b) (expr)`; a plain `sum(expr)` without grouping labels."""
    grouping = by(labels)
    return f"{op} {grouping} ({expr})" if grouping else f"{op}({expr})"


def rate(metric: str, matchers: Iterable[Matcher], window: str) -> str:
    return f"rate({selector(metric, matchers)}[{window}])"


def sum_rate(metric: str, matchers: Iterable[Matcher], window: str, labels: Sequence[str] = ()) -> str:
    return agg("sum", rate(metric, matchers, window), labels)


def ratio(numerator: str, denominator: str) -> str:
    return f"({numerator}) / ({denominator})"


def histogram_quantile(q: float, histogram: c.MetricDef, matchers: Iterable[Matcher], window: str,
                       labels: Sequence[str] = ()) -> str:
    """A quantile from a histogram's buckets, keeping `le` plus the grouping labels."""
    grouped = agg("sum", rate(histogram.bucket(), matchers, window), (*labels, c.LABEL_LE))
    return f"histogram_quantile({q:g}, {grouped})"


def bucket_rates(histogram: c.MetricDef, matchers: Iterable[Matcher], window: str) -> str:
    """Per-bucket rates summed by `le`: the input of a heatmap panel."""
    return agg("sum", rate(histogram.bucket(), matchers, window), (c.LABEL_LE,))


def or_zero(expr: str) -> str:
    """Answer 0 when `expr` has no series, so a missing signal means "nothing to do", not an error."""
    return f"({expr}) or vector(0)"


def finite(expr: str) -> str:
    """Drop NaN (0/0 with no traffic) and keep real values: `x >= 0` is false for NaN."""
    return f"({expr}) >= 0"
