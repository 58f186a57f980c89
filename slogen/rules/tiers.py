"""Resolve an SLO's period, alert windows and burn-rate tiers; refuse or rescale dead tiers.

A tier fires when the error ratio exceeds factor x (1 - objective). The error ratio can never
exceed 1, so a tier with factor x (1 - objective) >= 1 can never fire: with a 90% objective a
14.4x tier needs 144% errors. Sloth emits such alerts silently. slogen fails by default,
naming the tier and the fix, or (`--unreachable-tiers rescale`) lowers the factor so the tier
fires when RESCALE_CEILING (90%) of events fail over both of its windows.

The low-traffic guard: at low traffic one failed request crosses every burn-rate threshold
(1 request in 10 minutes: one error is a 1/6 error ratio over 1h, 167x a 99.9% budget). A page
tier therefore also needs at least `page_min_bad_events` bad events in its long window; below
that the same burn tickets instead (alerts.py). Raw-ratio SLIs have no counts and time-based
SLIs sample every evaluation, so neither is guarded; nor is `--sloth-compat` output.
"""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from llmslo.durations import DAY, format_prometheus_duration
from slogen.errors import SpecError
from slogen.loaders.common import grouped_label
from slogen.model import SLO, EventsSLI, RawSLI, Tier
from slogen.rules.options import RESCALE_CEILING, UNREACHABLE_RESCALE, GenOptions, SLOContext, dec


def resolve(slo: SLO, opts: GenOptions) -> SLOContext:
    period = opts.period_override or slo.period or opts.default_period
    own = slo.windows if slo.windows is not None and slo.windows.period == period else None
    windows = own or opts.windows.get(period)
    if windows is None:
        if opts.period_override:
            raise no_catalog_error(period, opts, slo.origin.file, "--override-period", slo=slo.id, line=slo.origin.line)
        if slo.period:
            raise no_catalog_error(period, opts, slo.origin.file, "the SLO's period", slo=slo.id, line=slo.origin.line,
                                   field=f"{slo.origin.path}.period" if slo.origin.path else "period")
        raise no_catalog_error(period, opts, slo.origin.file, "--default-slo-period (the SLO sets none)", slo=slo.id,
                               line=slo.origin.line)
    labels = {**slo.labels, **opts.extra_labels}
    _check_grouped(slo, opts)
    tiers = tuple(_reachable(slo, t, opts) for t in windows.tiers())
    return SLOContext(slo=slo, period=period, windows=windows, tiers=tiers, labels=labels, opts=opts)


def _days(ms: int) -> str:
    """A period as written in specs: 28d, not 4w."""
    return f"{ms // DAY}d" if ms % DAY == 0 else format_prometheus_duration(ms)


def no_catalog_error(period: int, opts: GenOptions, file: str, source: str, *, slo: str = "", field: str = "",
                     line: int | None = None) -> SpecError:
    """A period without an alert-window catalog is refused, as Sloth refuses it ("window period ... missing"):
    burn-rate windows are tuned to their period, and no catalog fits every period."""
    p = _days(period)
    known = ", ".join(f"{_days(d)} ({'built in' if w.source.startswith('<built-in') else w.source})"
                      for d, w in sorted(opts.windows.items())) or "none"
    return SpecError(
        file,
        f"the {p} period{f' (from {source})' if source else ''} has no alert-window catalog; catalogs loaded: {known}. Burn-rate alert "
        f"windows are tuned to a period, so slogen (like Sloth) does not guess them for another one",
        field, slo,
        f"use a period with a catalog (30d and 28d are built in), or add an AlertWindows document with "
        f"sloPeriod: {p} to the inputs or pass one with --windows FILE (the demo passes its 1d catalog: "
        f"--windows demo/windows.yaml)",
        line)


def override_error(opts: GenOptions) -> SpecError | None:
    """--override-period without a catalog: one error for the whole build, not one per SLO."""
    if opts.period_override and opts.period_override not in opts.windows:
        return no_catalog_error(opts.period_override, opts, f"--override-period {_days(opts.period_override)}", "")
    return None


def _reachable(slo: SLO, tier: Tier, opts: GenOptions) -> Tier:
    budget = 1 - slo.objective / 100
    if tier.factor * budget < 1 or not _emitted(slo, tier, opts):
        return tier  # not emitted, so not dead
    if opts.unreachable_tiers == UNREACHABLE_RESCALE:
        return replace(tier, factor=RESCALE_CEILING / budget, rescaled_from=tier.factor)
    if slo.origin.tool:
        return tier  # another tool's file loads as that tool loads it: kept, and a warning (unreachable_warnings)
    raise unreachable(slo, tier)


def _emitted(slo: SLO, tier: Tier, opts: GenOptions) -> bool:
    return not (opts.disable_alerts or (slo.alerting.page if tier.severity == "page" else slo.alerting.ticket).disable)


def unreachable(slo: SLO, tier: Tier) -> SpecError:
    """A tier that can never fire, reported at the objective's own field and line."""
    budget = 1 - Decimal(repr(slo.objective)) / 100
    need = Decimal(repr(tier.factor)) * budget
    o = slo.origin
    kept = (f"; {o.tool} emits it anyway, and so does slogen for a {o.tool} file (--strict makes this an error)"
            if o.tool else "")
    return SpecError(
        o.file,
        f"the {tier.name} alert tier can never fire: it needs an error ratio above {dec(tier.factor)} x "
        f"{dec(budget)} = {float(need):.3g}, but an error ratio cannot exceed 1 "
        f"(at a {dec(slo.objective)}% objective the burn rate tops out at {float(1 / budget) if budget else float('inf'):.3g}x)"
        + kept,
        o.objective_field or (f"{o.path}.objective" if o.path else "objective"), slo.id,
        "raise the objective, disable that severity, use an AlertWindows catalog whose tiers fit, "
        "or pass --unreachable-tiers rescale to cap the tier at a 90% error ratio",
        o.objective_line or o.line,
    )


def unreachable_warnings(slos: list[SLO], opts: GenOptions) -> list[SpecError]:
    """The tiers that can never fire in other tools' files, kept as those tools keep them: one warning each."""
    out = []
    for slo in slos:
        if not slo.origin.tool or opts.unreachable_tiers == UNREACHABLE_RESCALE:
            continue
        try:
            ctx = resolve(slo, opts)
        except SpecError:
            continue  # generating it reports the problem
        budget = 1 - slo.objective / 100
        out += [unreachable(slo, t) for t in ctx.tiers if t.factor * budget >= 1 and _emitted(slo, t, opts)]
    return out


def page_min_bad_events(ctx: SLOContext) -> int:
    """The low-traffic guard's minimum for this SLO's page tiers; 0 where it does not apply."""
    sli = ctx.slo.sli
    if ctx.opts.sloth_compat or ctx.opts.disable_recordings or isinstance(sli, RawSLI):
        return 0  # Sloth's rules as they are; no recorded event rates; a raw ratio has no counts
    if isinstance(sli, EventsSLI) and sli.time_based:
        return 0  # events are evaluation samples: they never run low
    need = ctx.slo.page_min_bad_events
    return max(0, ctx.opts.page_min_bad_events if need is None else need)


def guard_windows(ctx: SLOContext) -> list[int]:
    """The long windows of the guarded page tiers (each gets a recorded bad-event rate), shortest first."""
    if ctx.opts.disable_alerts or ctx.slo.alerting.page.disable or not page_min_bad_events(ctx):
        return []
    return sorted({t.window.long_window for t in ctx.tiers if t.severity == "page"})


# The short-window hold lasts while the silence is one in which fewer than this many requests were expected at
# the long window's traffic: at 6 requests an hour, half an hour; at a drained cluster's, no time at all.
HOLD_EXPECTED_EVENTS = 3


def hold_horizon(ctx: SLOContext, short: int) -> int:
    """The long window a held short window reads back over (its page tier's; the longest, should two share it)."""
    return max(t.window.long_window for t in ctx.tiers if t.severity == "page" and t.window.short_window == short)


def held_windows(ctx: SLOContext) -> list[int]:
    """The short windows of the page tiers, whose verdict holds through a silence that traffic this low makes
    ordinary (alerts._burn): each gets a recorded `slo:sli_error_measured:ratio_rate<W>` and the time it was last
    measured. Only where the low-traffic guard records the long windows' traffic (guard_windows), which the hold
    reads: not in `--sloth-compat`, without recordings or alerts, for a raw-ratio or a time-based SLI."""
    if not guard_windows(ctx):
        return []
    return sorted({t.window.short_window for t in ctx.tiers if t.severity == "page"})


def _check_grouped(slo: SLO, opts: GenOptions) -> None:
    """Refuse a spec (or -l) label that the SLI's rules group by (its `by`, cluster by default): stamped onto
    `sum by (cluster)` rules, it overwrites the label they keep, so a ruler that sees two clusters fails every
    recording rule (duplicate series) and one cluster's burn pages nothing, not even no-data. The Sloth loader
    already refuses such a label at its own line, in labels and alert labels alike (loaders/common.check_grouped);
    this covers every loader's SLO labels and -l."""
    sli = slo.sli
    grouped = tuple(sli.by) if isinstance(sli, EventsSLI) else ()
    for key in grouped:
        if key in slo.labels:
            field = f"{slo.origin.path}.labels.{key}" if slo.origin.path else f"labels.{key}"
            problem, fix = grouped_label(key, grouped, alert=False)
            raise SpecError(slo.origin.file, problem, field, slo.id, fix, slo.origin.line)
        if key in opts.extra_labels:
            raise SpecError(f"-l {key}={opts.extra_labels[key]}", f"label {key!r} is one the SLI's rules of "
                            f"SLO {slo.id} group by (sum by ({', '.join(grouped)})): a fixed value would overwrite "
                            f"each series' own {key}", "-l", slo.id, f"drop -l {key}=... or rename it (e.g. slo_{key})")
