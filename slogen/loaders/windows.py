"""Alert-window catalogs (Sloth `AlertWindows`, `sloth.slok.dev/v1`), keyed by SLO period.

The 30d and 28d catalogs are built in, with the SRE Workbook's parameters (table 5-8):
page on 2% of the budget in 1h (5m short window) or 5% in 6h (30m), ticket on 10% in 1d (2h)
or 10% in 3d (6h). Custom catalogs add periods (a 7d one, or the demo's compressed one).

`pyrra(period)` is Pyrra's table (pyrra-dev/pyrra slo/rules.go `Windows`, written here from its
description): four tiers scaled from the 28d ones by period/28d, each rounded to the minute, with
fixed burn factors 14, 7, 2, 1 and a `for:` per tier. A catalog document may pin the same with
`burnFactor` and `for` on a tier (slogen extensions; `slogen convert` writes them).
"""

from __future__ import annotations

from typing import TypeGuard

from llmslo.durations import DAY, HOUR, MINUTE, format_prometheus_duration, parse_prometheus_duration
from slogen.loaders import common as f
from slogen.loaders.common import Reporter
from slogen.model import AlertWindow, AlertWindows

API_VERSION = "sloth.slok.dev/v1"
KIND = "AlertWindows"


# Pyrra's tiers for a 28d window: (period divisors of short, long and for; burn factor). Pyrra divides the
# window (in nanoseconds, truncating) and rounds the result to the minute, half away from zero.
_PYRRA_28D = (
    ("page_quick", 8064, 672, 20160, 14.0),  # 5m / 1h, for 2m: 50% of the budget within a day
    ("page_slow", 1344, 112, 2688, 7.0),  # 30m / 6h, for 15m: 100% within 4 days
    ("ticket_quick", 336, 28, 672, 2.0),  # 2h / 1d, for 1h: 100% within 14 days
    ("ticket_slow", 112, 7, 224, 1.0),  # 6h / 4d, for 3h: 100% by the end of the window
)
_NS_PER_MS = 1_000_000
_MINUTE_NS = MINUTE * _NS_PER_MS


def _pyrra_scaled(period: int, divisor: int) -> int:
    """period / divisor as Go computes `(window / divisor).Round(time.Minute)`, in ms."""
    d = period * _NS_PER_MS // divisor
    rest = d % _MINUTE_NS
    d = d - rest if rest + rest < _MINUTE_NS else d + (_MINUTE_NS - rest)
    return d // _NS_PER_MS


def pyrra(period: int) -> AlertWindows | None:
    """Pyrra's four burn-rate tiers for an SLO window (ms); None when one of its windows rounds to zero
    (a window under about 6 days: the 28d table's 5m short window scales below 30s)."""
    tiers = {}
    for name, short_d, long_d, for_d, factor in _PYRRA_28D:
        short, long, for_ = (_pyrra_scaled(period, d) for d in (short_d, long_d, for_d))
        if short <= 0 or long <= 0:
            return None
        ebp = round(factor * long / period * 100, 4)  # the share of the budget it burns (for the alert's text)
        tiers[name] = AlertWindow(ebp, short, long, factor=factor, for_=for_ or None)
    return AlertWindows(period=period, source=f"<pyrra {format_prometheus_duration(period)}>", **tiers)


def _google(period: int) -> AlertWindows:
    return AlertWindows(
        period=period,
        page_quick=AlertWindow(2, 5 * MINUTE, 1 * HOUR),
        page_slow=AlertWindow(5, 30 * MINUTE, 6 * HOUR),
        ticket_quick=AlertWindow(10, 2 * HOUR, 1 * DAY),
        ticket_slow=AlertWindow(10, 6 * HOUR, 3 * DAY),
        source=f"<built-in {format_prometheus_duration(period)}>",
    )


BUILTIN: dict[int, AlertWindows] = {30 * DAY: _google(30 * DAY), 28 * DAY: _google(28 * DAY)}


def is_spec(doc: object) -> TypeGuard[dict]:
    return isinstance(doc, dict) and doc.get("apiVersion") == API_VERSION and doc.get("kind") == KIND


def load(doc: dict, r: Reporter) -> AlertWindows | None:
    spec = f.mapping(r, doc, "spec", "", required=True)
    period = _duration(r, spec, "sloPeriod", "spec")
    tiers = {}
    for sev in ("page", "ticket"):
        block = f.mapping(r, spec, sev, "spec", required=True)
        for speed in ("quick", "slow"):
            w = f.mapping(r, block, speed, f"spec.{sev}", required=True)
            wp = f"spec.{sev}.{speed}"
            ebp = f.number(r, w, "errorBudgetPercent", wp, example="2")
            short = _duration(r, w, "shortWindow", wp)
            long = _duration(r, w, "longWindow", wp)
            factor, for_ = _pinned(r, w, wp)
            if factor is not None and ebp is None and w.get("errorBudgetPercent") is None and period and long:
                ebp = round(factor * long / period * 100, 4)  # what the factor burns, for the alert's text
            if not ebp and w.get("errorBudgetPercent") is None:
                r.error("error budget percent is required", f"{wp}.errorBudgetPercent", line=f.line_of(w),
                        fix="set errorBudgetPercent: 2 (percent of the period's budget this tier consumes)")
            elif ebp is not None and not 0 < ebp <= 100:
                r.error(f"errorBudgetPercent {ebp:g} is out of range: it must be > 0 and <= 100",
                        f"{wp}.errorBudgetPercent", line=f.line_of(w, "errorBudgetPercent"),
                        fix="write the share of the period's budget this tier consumes, as a percent, e.g. 2")
                ebp = None
            if short and long and short >= long:
                r.error("the short window must be shorter than the long window", f"{wp}.shortWindow",
                        line=f.line_of(w, "shortWindow"), fix="use a short window of about long/12")
            if ebp and short and long:
                tiers[f"{sev}_{speed}"] = AlertWindow(ebp, short, long, factor=factor, for_=for_)
    if period is None or len(tiers) != 4:
        return None
    return AlertWindows(period=period, source=r.file, **tiers)


def _pinned(r: Reporter, w: dict, wp: str) -> tuple[float | None, int | None]:
    """A tier's optional `burnFactor` (instead of the one errorBudgetPercent derives) and `for`."""
    factor = f.number(r, w, "burnFactor", wp, example="14")
    if factor is not None and factor <= 0:
        r.error(f"burnFactor {factor:g} must be positive", f"{wp}.burnFactor", line=f.line_of(w, "burnFactor"),
                fix="write the burn rate the tier alerts at, e.g. burnFactor: 14")
        factor = None
    for_ = _duration(r, w, "for", wp, zero_ok=True) if w.get("for") is not None else None
    return factor, for_


def _duration(r: Reporter, node: dict, key: str, prefix: str, zero_ok: bool = False) -> int | None:
    text = f.string(r, node, key, prefix)
    if not text:
        r.error(f"{key} is required", f.join(prefix, key), line=f.line_of(node), fix=f"set {key}: e.g. 1h")
        return None
    try:
        ms = parse_prometheus_duration(text)
    except ValueError as e:
        r.error(str(e), f.join(prefix, key), line=f.line_of(node, key), fix="write a Prometheus duration, e.g. 30d")
        return None
    if ms <= 0 and not (zero_ok and ms == 0):
        r.error(f"{key} must be positive", f.join(prefix, key), line=f.line_of(node, key), fix="write e.g. 1h")
        return None
    return ms


def merge(catalogs: list[AlertWindows], base: dict[int, AlertWindows] | None = None) -> dict[int, AlertWindows]:
    """Catalogs by period. A loaded catalog replaces the built-in one for its period, whatever `base` holds; an
    identical one is no conflict; two different loaded catalogs for one period are an error (as in Sloth)."""
    from slogen.errors import SpecError, SpecErrors

    out = dict(BUILTIN if base is None else base)
    errors = []
    for w in catalogs:
        old = out.get(w.period)
        if old is not None and not is_builtin(old) and not _same(old, w):
            errors.append(SpecError(w.source, f"a catalog for period {format_prometheus_duration(w.period)} is already loaded "
                                    f"from {old.source}, with other windows", "spec.sloPeriod",
                                    fix="keep one AlertWindows document per sloPeriod"))
            continue
        if old is None or is_builtin(old):
            out[w.period] = w
    if errors:
        raise SpecErrors(errors)
    return out


def is_builtin(w: AlertWindows) -> bool:
    return BUILTIN.get(w.period) is w


def _same(a: AlertWindows, b: AlertWindows) -> bool:
    return (a.period, a.page_quick, a.page_slow, a.ticket_quick, a.ticket_slow) == (
        b.period, b.page_quick, b.page_slow, b.ticket_quick, b.ticket_slow)
