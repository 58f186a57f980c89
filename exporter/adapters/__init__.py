"""Engine adapters: pure functions from parsed families to normalized samples, one module per engine.

`ADAPTERS` is keyed by engine kind; `WANT_ALL` is what a parse for `auto` detection keeps;
`detect` names the engine from the families on a page.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.adapters import llamacpp, sglang, tap, tgi, trtllm_serve, trtllm_triton, vllm
from exporter.adapters.base import Adapter
from exporter.model import MetricFamily

__all__ = ["ADAPTERS", "WANT_ALL", "Adapter", "detect", "get"]

ADAPTERS: dict[str, Adapter] = {
    a.kind: a
    for a in (vllm.ADAPTER, sglang.ADAPTER, tgi.ADAPTER, trtllm_triton.ADAPTER, trtllm_serve.ADAPTER,
              llamacpp.ADAPTER, tap.ADAPTER)
}

WANT_ALL: frozenset[str] = frozenset().union(*(a.wanted for a in ADAPTERS.values()))
_DETECTABLE = tuple(a for a in ADAPTERS.values() if a.detect_prefixes or a.detect_names)

def get(kind: str) -> Adapter:
    """The adapter for an engine kind; a KeyError names the kinds that exist."""
    try:
        return ADAPTERS[kind]
    except KeyError:
        raise KeyError(f"unknown engine kind {kind!r}; use one of: {', '.join(sorted(ADAPTERS))}") from None


def detect(families: Mapping[str, MetricFamily]) -> str | None:
    """The engine kind whose families are on the page (the one with most of them), or None.

    Each adapter declares the family names that are its own (`Adapter.claims`); they do not overlap.
    """
    counts: dict[str, int] = {}
    for name in families:
        for adapter in _DETECTABLE:
            if adapter.claims(name):
                counts[adapter.kind] = counts.get(adapter.kind, 0) + 1
                break
    if not counts:
        return None
    return max(counts, key=lambda kind: counts[kind])
