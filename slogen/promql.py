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


def without(labels: Sequence[str]) -> str:
    return f"without ({', '.join(labels)})"


def agg_without(op: str, expr: str, labels: Sequence[str], *, trailing: bool = False) -> str:
    """`max without (a) (expr)`; `trailing`: `max(expr) without (a)`, as Sloth writes its alerts."""
    return f"{op}({expr}) {without(labels)}" if trailing else f"{op} {without(labels)} ({expr})"


def on(labels: Sequence[str]) -> str:
    """The matching clause of a binary operator: `on (a, b)`."""
    return f"on ({', '.join(labels)})"


def ignoring(labels: Sequence[str]) -> str:
    """The matching clause of a binary operator: `ignoring (a, b)`."""
    return f"ignoring ({', '.join(labels)})"


def over_time(fn: str, sel: str, window: str, offset: str = "") -> str:
    """`fn(sel[window])` for the `*_over_time` functions: `over_time("sum", sel, "5m")` is `sum_over_time(sel[5m])`;
    with `offset`, the window ends that much earlier."""
    return f"{fn}_over_time({sel}[{window}]{f' offset {offset}' if offset else ''})"


def scaled(factor: str, value: str) -> str:
    """`(factor * value)`: a burn-rate threshold, a tier's factor times the error budget."""
    return f"({factor} * {value})"


def increase(sel: str, window: str) -> str:
    return f"increase({sel}[{window}])"


def max_over_time(sel: str, window: str, offset: str = "") -> str:
    """`max_over_time(sel[window])`, or `max_over_time(sel[window] offset o)` looking back `offset` earlier."""
    return f"max_over_time({sel}[{window}]{f' offset {offset}' if offset else ''})"


def deriv(sel: str, window: str) -> str:
    return f"deriv({sel}[{window}])"


def rate(sel: str, window: str = WINDOW) -> str:
    """`rate(sel[window])`; the default window is Sloth's template variable, as rules write it."""
    return f"rate({sel}[{window}])"


def sum_rate(metric: str, matchers: Iterable[Matcher], window: str, labels: Sequence[str] = ()) -> str:
    return agg("sum", rate(selector(metric, matchers), window), labels)


def ratio(numerator: str, denominator: str) -> str:
    return f"({numerator}) / ({denominator})"


# A sum of bucket series is a histogram only if every series shares one bucket ladder: summed by `le`
# across engines of different kinds (vLLM 0.25/0.5/0.75..., SGLang 0.2/0.4/0.6..., Triton 0.1/0.5/2/5),
# each `le` counts a different subset of engines, the cumulative counts stop rising, every quantile
# jumps to the next shared edge and a heatmap's differences go negative. A grouping that
# keeps one of these labels sums one engine kind (or one engine) at a time:
LADDER_LABELS = (c.LABEL_ENGINE, c.LABEL_POD)
# The tap's histograms have one ladder fleet-wide: every tap builds its edges from the same default list
# united with the thresholds of the same SLO files (deploy/generated's ConfigMap), whatever engine is behind it.
UNIFORM_LADDER_HISTOGRAMS = tuple(m for m in c.TAP_METRICS if m.kind == "histogram")


class MixedLaddersError(ValueError):
    """A histogram query that would sum bucket series of unlike ladders (a generator's bug, not a spec's)."""


def check_one_ladder(histogram: c.MetricDef, labels: Sequence[str]) -> None:
    """Refuse a sum by `le` that can mix bucket ladders: it must keep a LADDER_LABELS label or read a
    histogram of UNIFORM_LADDER_HISTOGRAMS."""
    if histogram in UNIFORM_LADDER_HISTOGRAMS or set(labels) & set(LADDER_LABELS):
        return
    uniform = ", ".join(m.name for m in UNIFORM_LADDER_HISTOGRAMS)
    raise MixedLaddersError(
        f"refusing to sum {histogram.bucket()} by ({', '.join((*labels, c.LABEL_LE))}): engines of different "
        f"kinds have different bucket edges (llmslo/bucket_edges.py), so the sum mixes ladders, quantiles jump to "
        f"the next shared edge and heatmap cells go negative (fix: keep {' or '.join(LADDER_LABELS)} in the "
        f"grouping, e.g. labels=({c.LABEL_ENGINE!r},), or read a uniform-ladder histogram: {uniform})")


def histogram_quantile(q: float, histogram: c.MetricDef, matchers: Iterable[Matcher], window: str,
                       labels: Sequence[str] = ()) -> str:
    """A quantile from a histogram's buckets, keeping `le` plus the grouping labels (one ladder per group)."""
    check_one_ladder(histogram, labels)
    grouped = agg("sum", rate(selector(histogram.bucket(), matchers), window), (*labels, c.LABEL_LE))
    return f"histogram_quantile({q:g}, {grouped})"


def bucket_rates(histogram: c.MetricDef, matchers: Iterable[Matcher], window: str, labels: Sequence[str] = ()) -> str:
    """Per-bucket rates summed by `le` (plus `labels`): the input of a heatmap panel, one ladder per group,
    so that the cells Grafana derives by differencing neighbouring buckets are never negative."""
    check_one_ladder(histogram, labels)
    return agg("sum", rate(selector(histogram.bucket(), matchers), window), (*labels, c.LABEL_LE))


def or_zero(expr: str) -> str:
    """Answer 0 when `expr` has no series, so a missing signal means "nothing to do", not an error."""
    return f"({expr}) or vector(0)"


def finite(expr: str) -> str:
    """Drop NaN (0/0 with no traffic) and keep real values: `x >= 0` is false for NaN."""
    return f"({expr}) >= 0"
