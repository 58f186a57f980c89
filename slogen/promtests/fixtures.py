"""The source series a scenario writes for an SLO: its own fixtures, or ones read off a simple Sloth events SLI
(`sum(rate(metric{...}[{{.window}}]))`), with label values that satisfy its total and error matchers."""

from __future__ import annotations

import re
from collections.abc import Sequence

from llmslo.selectors import Matcher, parse_selector
from slogen.model import EventsSLI, SeriesFixture
from slogen.plugins.contract import PluginError
from slogen.rules import SLOResult
from slogen.rules.alerts import kept_labels


def slo_fixtures(r: SLOResult) -> tuple[SeriesFixture, ...]:
    sli = r.slo.sli
    if not isinstance(sli, EventsSLI):
        return ()
    return sli.fixtures or infer_fixtures(sli)


_RATE_SEL = re.compile(r"(?:rate|increase)\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^{}]*\})?\s*\[\{\{\s*\.window\s*\}\}\]\s*\)")

_CANDIDATES = ("500", "503", "429", "200", "201", "404", "error", "ok", "true", "false", "1", "0", "fail", "success")


def infer_fixtures(sli: EventsSLI) -> tuple[SeriesFixture, ...]:
    """Series for `sum(rate(m{total matchers}[w]))` over `sum(rate(m{total + error matchers}[w]))`."""
    errs, tots = _RATE_SEL.findall(sli.error_query), _RATE_SEL.findall(sli.total_query)
    if len(errs) != 1 or len(tots) != 1 or errs[0][0] != tots[0][0]:
        return ()
    by = kept_labels(sli.total_query)
    if re.search(r"\b(by|without)\s*\(", sli.total_query + sli.error_query) and not (
            by and kept_labels(sli.error_query) == by):
        return ()  # it keeps labels we cannot name, or the two queries keep different ones
    try:
        em, tm = parse_selector(errs[0][1] or ""), parse_selector(tots[0][1] or "")
    except PluginError:
        return ()
    extra = [m for m in em if m not in tm]
    if not extra:
        return ()
    bad = _satisfy(tm + em)
    good = None
    for i in range(len(extra)):
        good = _satisfy(tm, violate=extra[i])
        if good is not None:
            break
    if bad is None or good is None:
        return ()
    metric = tots[0][0]
    scope = {label: f"{label}-a" for label in by}
    return (SeriesFixture(metric, {**good, **scope}, "good"), SeriesFixture(metric, {**bad, **scope}, "bad"))


def _matches(op: str, pattern: str, value: str) -> bool:
    if op == "=":
        return value == pattern
    if op == "!=":
        return value != pattern
    try:
        hit = re.fullmatch(pattern.replace("\\\\", "\\"), value) is not None
    except re.error:
        return False
    return hit if op == "=~" else not hit


def _satisfy(matchers: Sequence[Matcher], violate: Matcher | None = None) -> dict[str, str] | None:
    labels: dict[str, str] = {}
    names = sorted({m[0] for m in matchers} | ({violate[0]} if violate else set()))
    for name in names:
        mine = [m for m in matchers if m[0] == name]
        eq = [m[2] for m in mine if m[1] == "="]
        candidates = eq + list(_CANDIDATES) if eq else list(_CANDIDATES) + ["fixture"]
        for value in candidates:
            if all(_matches(op, pat, value) for _, op, pat in mine) and (
                    violate is None or violate[0] != name or not _matches(violate[1], violate[2], value)):
                if value or not mine:
                    labels[name] = value
                break
        else:
            return None
    return labels
