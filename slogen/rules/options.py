"""Generation options and the per-SLO context every rule generator reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Mapping

from llmslo.durations import DAY
from slogen import VERSION_LABEL
from slogen.links import DEFAULT_GRAFANA_URL
from slogen.loaders.windows import BUILTIN
from slogen.model import SLO, AlertWindows, Tier

DEFAULT_RUNBOOK_BASE_URL = "https://runbooks.example.com/llmslo"
UNREACHABLE_FAIL = "fail"
UNREACHABLE_RESCALE = "rescale"
# Rescaled tiers fire when this share of events fails (a threshold must stay below 1 to be reachable).
RESCALE_CEILING = 0.9
# Low-traffic guard: a page needs at least this many bad events in its tier's long window, else it
# tickets (docs/slogen.md, "Low traffic": one failed request, or one and its retry, must not page).
DEFAULT_PAGE_MIN_BAD_EVENTS = 3


@dataclass(frozen=True)
class GenOptions:
    sloth_compat: bool = False  # reproduce Sloth v0.16's rules exactly (no slogen extensions)
    default_period: int = 30 * DAY
    period_override: int | None = None  # force every SLO onto this period (demos, tests)
    windows: Mapping[int, AlertWindows] = field(default_factory=lambda: dict(BUILTIN))
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    disable_alerts: bool = False
    disable_recordings: bool = False
    runbook_base_url: str = DEFAULT_RUNBOOK_BASE_URL
    grafana_url: str = DEFAULT_GRAFANA_URL  # alerts' `dashboard` annotation: <grafana_url>/d/<dashboard uid>
    unreachable_tiers: str = UNREACHABLE_FAIL
    derive_above: int | None = None  # windows longer than this come from the base-window rates; None = longest page window
    page_min_bad_events: int = DEFAULT_PAGE_MIN_BAD_EVENTS  # for SLOs that set none; 0 turns the guard off
    version: str = VERSION_LABEL


@dataclass(frozen=True)
class SLOContext:
    """One SLO with everything resolved: its period, alert windows, tiers and final labels."""

    slo: SLO
    period: int
    windows: AlertWindows
    tiers: tuple[Tier, ...]
    labels: dict[str, str]  # spec + SLO labels, then --extra-labels
    opts: GenOptions

    @property
    def base_window(self) -> int:
        """The shortest window (the page-quick short window): recorded rates and the current burn rate."""
        return self.windows.page_quick.short_window

    @property
    def derive_above(self) -> int:
        if self.opts.derive_above is not None:
            return self.opts.derive_above
        return max(self.windows.page_quick.long_window, self.windows.page_slow.long_window)

    @property
    def objective_ratio(self) -> Decimal:
        return Decimal(repr(self.slo.objective)) / 100

    @property
    def error_budget(self) -> Decimal:
        return 1 - self.objective_ratio

    @property
    def alerts_enabled(self) -> bool:
        a = self.slo.alerting
        return not self.opts.disable_alerts and not (a.page.disable and a.ticket.disable)


def dec(value: Decimal | float) -> str:
    """A decimal as plain text without exponent or trailing zeros: 0.001, 99.9, 30."""
    d = value if isinstance(value, Decimal) else Decimal(repr(value))
    text = format(d.normalize(), "f")
    return text
