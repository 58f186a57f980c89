"""Engine adapters: pure functions from parsed families to normalized samples, one module per engine.

`ADAPTERS` is keyed by engine kind; `WANT_ALL` is what a parse for `auto` detection keeps;
`detect` names the engine from the families on a page.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.adapters import sglang, tap, tgi, trtllm_serve, trtllm_triton, vllm
from exporter.adapters.base import Adapter
from exporter.model import MetricFamily
from llmslo.conventions import VLLM

__all__ = ["ADAPTERS", "WANT_ALL", "Adapter", "detect", "get"]

ADAPTERS: dict[str, Adapter] = {
    a.kind: a
    for a in (vllm.ADAPTER, sglang.ADAPTER, tgi.ADAPTER, trtllm_triton.ADAPTER, trtllm_serve.ADAPTER, tap.ADAPTER)
}

WANT_ALL: frozenset[str] = frozenset().union(*(a.wanted for a in ADAPTERS.values()))

# Family-name prefixes that identify an engine. Triton is recognized by its TRT-LLM backend gauges,
# not by `nv_inference_*`, which every Triton model has.
_PREFIXES = (
    (VLLM.PREFIX, vllm.KIND),
    ("sglang:", sglang.KIND),
    ("tgi_", tgi.KIND),
    ("nv_trt_llm_", trtllm_triton.KIND),
    ("trtllm_", trtllm_serve.KIND),
)


def get(kind: str) -> Adapter:
    """The adapter for an engine kind; a KeyError names the kinds that exist."""
    try:
        return ADAPTERS[kind]
    except KeyError:
        raise KeyError(f"unknown engine kind {kind!r}; use one of: {', '.join(sorted(ADAPTERS))}") from None


def detect(families: Mapping[str, MetricFamily]) -> str | None:
    """The engine kind whose families are on the page (the one with most of them), or None."""
    counts: dict[str, int] = {}
    for name in families:
        for prefix, kind in _PREFIXES:
            if name.startswith(prefix):
                counts[kind] = counts.get(kind, 0) + 1
                break
        else:
            if name in tap.WANTED:
                counts[tap.KIND] = counts.get(tap.KIND, 0) + 1
    if not counts:
        return None
    return max(counts, key=lambda kind: counts[kind])
