"""Alert-window catalogs (Sloth `AlertWindows`, `sloth.slok.dev/v1`), keyed by SLO period.

The 30d and 28d catalogs are built in, with the SRE Workbook's parameters (table 5-8):
page on 2% of the budget in 1h (5m short window) or 5% in 6h (30m), ticket on 10% in 1d (2h)
or 10% in 3d (6h). Custom catalogs add periods (a 7d one, or the demo's compressed one).
"""

from __future__ import annotations

from pathlib import Path

from llmslo.durations import DAY, HOUR, MINUTE, format_prometheus_duration, parse_prometheus_duration
from slogen.loaders import common as f
from slogen.loaders.common import Reporter
from slogen.model import AlertWindow, AlertWindows

API_VERSION = "sloth.slok.dev/v1"
KIND = "AlertWindows"


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


def is_spec(doc: object) -> bool:
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
                tiers[f"{sev}_{speed}"] = AlertWindow(ebp, short, long)
    if period is None or len(tiers) != 4:
        return None
    return AlertWindows(period=period, source=r.file, **tiers)


def _duration(r: Reporter, node: dict, key: str, prefix: str) -> int | None:
    text = f.string(r, node, key, prefix)
    if not text:
        r.error(f"{key} is required", f.join(prefix, key), line=f.line_of(node), fix=f"set {key}: e.g. 1h")
        return None
    try:
        ms = parse_prometheus_duration(text)
    except ValueError as e:
        r.error(str(e), f.join(prefix, key), line=f.line_of(node, key), fix="write a Prometheus duration, e.g. 30d")
        return None
    if ms <= 0:
        r.error(f"{key} must be positive", f.join(prefix, key), line=f.line_of(node, key), fix="write e.g. 1h")
        return None
    return ms


def load_catalog_path(path: str | Path) -> list[AlertWindows]:
    """Every AlertWindows document in a file or (recursively) a directory; SpecErrors on problems."""
    from slogen.loaders import load_paths  # one reader for all YAML inputs

    return load_paths([path], windows_only=True).windows


def merge(catalogs: list[AlertWindows], base: dict[int, AlertWindows] | None = None) -> dict[int, AlertWindows]:
    """Catalogs by period; a second, different catalog for the same period is an error (as in Sloth)."""
    from slogen.errors import SpecError, SpecErrors

    out = dict(BUILTIN if base is None else base)
    builtin_periods = set(BUILTIN) if base is None else set()
    errors = []
    for w in catalogs:
        old = out.get(w.period)
        if old is not None and w.period not in builtin_periods and _same(old, w) is False:
            errors.append(SpecError(w.source, f"a catalog for period {format_prometheus_duration(w.period)} is already loaded "
                                    f"from {old.source}", "spec.sloPeriod",
                                    fix="keep one AlertWindows document per sloPeriod"))
            continue
        out[w.period] = w
        builtin_periods.discard(w.period)
    if errors:
        raise SpecErrors(errors)
    return out


def _same(a: AlertWindows, b: AlertWindows) -> bool:
    return (a.period, a.page_quick, a.page_slow, a.ticket_quick, a.ticket_slow) == (
        b.period, b.page_quick, b.page_slow, b.ticket_quick, b.ticket_slow)
