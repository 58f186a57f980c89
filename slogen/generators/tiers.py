"""Resolve an SLO's period, alert windows and burn-rate tiers; refuse or rescale dead tiers.

A tier fires when the error ratio exceeds factor x (1 - objective). The error ratio can never
exceed 1, so a tier with factor x (1 - objective) >= 1 can never fire: with a 90% objective a
14.4x tier needs 144% errors. Sloth emits such alerts silently. slogen fails by default,
naming the tier and the fix, or (`--unreachable-tiers rescale`) lowers the factor so the tier
fires when RESCALE_CEILING (90%) of events fail over both of its windows.
"""

from __future__ import annotations

from dataclasses import replace

from slogen.durations import format_duration
from slogen.errors import SpecError
from slogen.generators.options import RESCALE_CEILING, UNREACHABLE_RESCALE, GenOptions, SLOContext, dec
from slogen.model import SLO, Tier


def resolve(slo: SLO, opts: GenOptions) -> SLOContext:
    period = opts.period_override or slo.period or opts.default_period
    windows = opts.windows.get(period)
    field = f"{slo.origin.path}.period" if slo.period and slo.origin.path else "period"
    if windows is None:
        known = ", ".join(sorted(format_duration(p) for p in opts.windows)) or "none"
        raise SpecError(slo.origin.file, f"no alert-window catalog for the {format_duration(period)} period",
                        field, slo.id, f"use a period with a catalog ({known}) or add an AlertWindows catalog "
                        f"with sloPeriod: {format_duration(period)} (--windows)", slo.origin.line)
    labels = {**slo.labels, **opts.extra_labels}
    tiers = tuple(_reachable(slo, t, opts) for t in windows.tiers())
    return SLOContext(slo=slo, period=period, windows=windows, tiers=tiers, labels=labels, opts=opts)


def _reachable(slo: SLO, tier: Tier, opts: GenOptions) -> Tier:
    budget = 1 - slo.objective / 100
    if tier.factor * budget < 1:
        return tier
    severity_off = (slo.alerting.page if tier.severity == "page" else slo.alerting.ticket).disable
    if severity_off or opts.disable_alerts:
        return tier  # not emitted, so not dead
    if opts.unreachable_tiers == UNREACHABLE_RESCALE:
        return replace(tier, factor=RESCALE_CEILING / budget, rescaled_from=tier.factor)
    max_factor = 1 / budget if budget else float("inf")
    raise SpecError(
        slo.origin.file,
        f"the {tier.name} alert tier can never fire: it needs an error ratio above {dec(tier.factor)} x "
        f"{dec(budget)} = {tier.factor * budget:.3g}, but an error ratio cannot exceed 1 "
        f"(at a {dec(slo.objective)}% objective the burn rate tops out at {max_factor:.3g}x)",
        f"{slo.origin.path}.objective" if slo.origin.path else "objective", slo.id,
        "raise the objective, disable that severity, use an AlertWindows catalog whose tiers fit, "
        "or pass --unreachable-tiers rescale to cap the tier at a 90% error ratio",
        slo.origin.line,
    )
