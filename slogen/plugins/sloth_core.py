"""Sloth's core SLO plugins (`sloth.dev/core/...`, internal/plugin/slo/core in Sloth v0.16), so a spec that writes
Sloth's default chain out loads.

Sloth runs validate, sli_rules, metadata_rules and alert_rules on every SLO unless a chain sets
`overridePrevious`; a chain may also name them, or noop and debug. Here: the three rule generators are
slogen's own default generators (`GENERATES`: slogen.rules runs the one each names where the chain puts it,
so `overridePrevious` with them written out gives the default rules); validate, noop and debug change
nothing (slogen's loader already validates every SLO; debug only logs at Sloth's debug level).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slogen.model import SLO, SLORules
from slogen.plugins.contract import PluginError, SLOPlugin

VALIDATE = "sloth.dev/core/validate/v1"
SLI_RULES = "sloth.dev/core/sli_rules/v1"
METADATA_RULES = "sloth.dev/core/metadata_rules/v1"
ALERT_RULES = "sloth.dev/core/alert_rules/v1"
NOOP = "sloth.dev/core/noop/v1"
DEBUG = "sloth.dev/core/debug/v1"

# generator plugin -> the rule group it (re)generates: "sli", "meta" or "alerts" (slogen.rules.generate_slo)
GENERATES = {SLI_RULES: "sli", METADATA_RULES: "meta", ALERT_RULES: "alerts"}


@dataclass(frozen=True)
class CorePlugin:
    """A core plugin: `generates` names the default generator it stands for ("" for one that changes nothing)."""

    generates: str = ""

    def __call__(self, slo: SLO, rules: SLORules) -> None:
        return None  # a generator runs in slogen.rules, which has the SLO's resolved context


def _config(config: Any, plugin: str, types: dict[str, type]) -> dict:
    """The config mapping, each key of the type Sloth's plugin reads it as."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise PluginError(f"{plugin}: config must be a mapping, got {type(config).__name__}", "config")
    for key, value in config.items():
        if key not in types:
            raise PluginError(f"{plugin}: unknown config key {key} (known: {', '.join(types) or 'none'})", str(key))
        if not isinstance(value, types[key]):
            raise PluginError(f"{plugin}: config.{key} must be a {types[key].__name__}", str(key))
    return config


def _plain(plugin: str, types: dict[str, type]):
    def factory(config: Any) -> SLOPlugin:
        _config(config, plugin, types)
        return CorePlugin(GENERATES.get(plugin, ""))

    return factory


def sli_rules(config: Any) -> SLOPlugin:
    """Sloth's SLI recording rules; `disableOptimized: true` (period window from the raw query) is not followed."""
    cfg = _config(config, SLI_RULES, {"disableOptimized": bool})
    if cfg.get("disableOptimized"):
        raise PluginError(f"{SLI_RULES}: disableOptimized: true is not supported: slogen records its long windows "
                          "its own way (traffic-weighted sums, or Sloth's optimized rules with --sloth-compat)",
                          "disableOptimized")
    return CorePlugin(GENERATES[SLI_RULES])


PLUGINS = {VALIDATE: _plain(VALIDATE, {}), METADATA_RULES: _plain(METADATA_RULES, {}),
           ALERT_RULES: _plain(ALERT_RULES, {}), NOOP: _plain(NOOP, {}), SLI_RULES: sli_rules,
           DEBUG: _plain(DEBUG, {"msg": str, "result": bool, "request": bool})}
