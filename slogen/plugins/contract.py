"""What an SLI plugin is told and returns, what an SLO plugin is, and the error either raises.

Plugin options are strings, as in Sloth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from llmslo.plugin_errors import PluginOptionError
from slogen.model import SLI, SLO, SLORules

# A plugin rejected its options; `option` names the offending one, `fix` what to write. The llmslo/*
# contract's error, so slogen's loader reports the contract's refusals and any plugin's alike.
PluginError = PluginOptionError


@dataclass(frozen=True)
class SLIPluginRequest:
    """What an SLI plugin is told (Sloth passes the same: service, SLO name, objective, spec labels, options)."""

    service: str
    slo: str
    slo_id: str
    objective: float
    labels: dict[str, str]
    options: dict[str, str] = field(default_factory=dict)
    allow_out_of_range: bool = False  # the SLO's `allow_out_of_range`: thresholds may leave llmslo.ranges


SLIPlugin = Callable[[SLIPluginRequest], SLI]


class SLOPlugin(Protocol):
    """Mutates one SLO's generated rule groups (Sloth's SLO plugin contract)."""

    def __call__(self, slo: SLO, rules: SLORules) -> None: ...


SLOPluginFactory = Callable[[Any], SLOPlugin]
