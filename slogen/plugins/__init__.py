"""The plugin tables: SLI plugins (spec `sli.plugin.id`) and SLO plugins (spec `plugins.chain[].id`).

Sloth loads Go plugins from disk; slogen has built-in Python ones (the `llmslo/*` LLM SLIs, listed
in `SLI_PLUGINS` below) and lets callers register more (the golden tests register Python
equivalents of Sloth's integration-test plugins). The contract is in `slogen/plugins/contract.py`.
"""

from __future__ import annotations

from slogen.plugins import llm, sloth_contrib, sloth_core
from slogen.plugins.contract import SLIPlugin, SLOPluginFactory

SLI_PLUGINS: dict[str, SLIPlugin] = {
    llm.LATENCY: llm.latency,
    llm.GOODPUT: llm.goodput,
    llm.AVAILABILITY: llm.availability,
    llm.KV_HEADROOM: llm.kv_headroom,
}
# Sloth's sloth.dev/contrib/* ones and its sloth.dev/core/* ones
SLO_PLUGINS: dict[str, SLOPluginFactory] = {**sloth_contrib.PLUGINS, **sloth_core.PLUGINS}


def register_sli_plugin(plugin_id: str, plugin: SLIPlugin) -> None:
    SLI_PLUGINS[plugin_id] = plugin


def register_slo_plugin(plugin_id: str, factory: SLOPluginFactory) -> None:
    SLO_PLUGINS[plugin_id] = factory


def sli_plugin(plugin_id: str) -> SLIPlugin | None:
    return SLI_PLUGINS.get(plugin_id)


def slo_plugin_factory(plugin_id: str) -> SLOPluginFactory | None:
    return SLO_PLUGINS.get(plugin_id)


def sli_plugin_ids() -> list[str]:
    return sorted(SLI_PLUGINS)


def slo_plugin_ids() -> list[str]:
    return sorted(SLO_PLUGINS)
