"""Registries of SLI plugins (spec `sli.plugin.id`) and SLO plugins (spec `plugins.chain[].id`).

Sloth loads Go plugins from disk; slogen has built-in Python ones (the `llmslo/*` LLM SLIs)
and lets callers register more (the golden tests register Python equivalents of Sloth's
integration-test plugins). Plugin options are strings, as in Sloth.
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


SLIPlugin = Callable[[SLIPluginRequest], SLI]


class SLOPlugin(Protocol):
    """Mutates one SLO's generated rule groups (Sloth's SLO plugin contract)."""

    def __call__(self, slo: SLO, rules: SLORules) -> None: ...


SLOPluginFactory = Callable[[Any], SLOPlugin]

_SLI_PLUGINS: dict[str, SLIPlugin] = {}
_SLO_PLUGINS: dict[str, SLOPluginFactory] = {}


def register_sli_plugin(plugin_id: str, plugin: SLIPlugin) -> None:
    _SLI_PLUGINS[plugin_id] = plugin


def register_slo_plugin(plugin_id: str, factory: SLOPluginFactory) -> None:
    _SLO_PLUGINS[plugin_id] = factory


def sli_plugin(plugin_id: str) -> SLIPlugin | None:
    _load_builtins()
    return _SLI_PLUGINS.get(plugin_id)


def slo_plugin_factory(plugin_id: str) -> SLOPluginFactory | None:
    _load_builtins()
    return _SLO_PLUGINS.get(plugin_id)


def sli_plugin_ids() -> list[str]:
    _load_builtins()
    return sorted(_SLI_PLUGINS)


def slo_plugin_ids() -> list[str]:
    _load_builtins()
    return sorted(_SLO_PLUGINS)


def _load_builtins() -> None:
    from slogen.plugins import llm  # noqa: F401  (registers llmslo/* on import)
