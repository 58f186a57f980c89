"""What one poll of the engine's /metrics says to the admission gate: the page read through the exporter's own
adapters (exporter.adapters: the same reading of each engine's families as the node exporter's), so every engine
kind whose adapter gives free KV blocks and the block size can be gated (`--admission-engine`, detected from the
page by default).

The reading's free KV tokens = llm_kv_cache_free_blocks x llm_kv_cache_block_size_tokens (for vLLM: (1 -
kv_cache_usage_perc) x usable blocks, num_gpu_blocks - 1 on V1 for its null block, in whole blocks, per
data-parallel engine); the queue = llm_requests_waiting (summed over the engine's models and data-parallel
engines); the request-size histograms and the counters the rates are learned from (exporter.tap.predict).

The page is input, not truth: every count and ratio must be finite and possible, or the page is not believed
(EngineReadError with its reason) and the gate fails open. Pure: run in the page reader's child process
(exporter.tap.page_child), never on the tap's loop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter import adapters
from exporter.model import MetricFamily
from exporter.promtext import parse_page
from exporter.tap.predict import Counters
from llmslo import conventions as C
from llmslo.histograms import Buckets

FAMILY_LIMIT = 10_000  # samples of one family read from a page (the exporter's max_samples_per_family default)

# The engine kinds admission can read: every adapter's but the tap's own (a tap in front of a tap has no KV cache).
ENGINE_KINDS = tuple(sorted(kind for kind in adapters.ADAPTERS if kind != adapters.tap.KIND))
AUTO = "auto"
WANTED = adapters.WANT_ALL  # what a page is parsed for when the kind is detected from it


def wanted(kind: str) -> frozenset[str]:
    """The families a page of this engine kind (or AUTO) is parsed for."""
    return WANTED if kind == AUTO else adapters.get(kind).wanted


class EngineReadError(ValueError):
    """The engine's /metrics lacks what admission needs, or says something impossible (`reason`: one of
    conventions.ADMISSION_READ_REASONS)."""

    def __init__(self, message: str, reason: str = C.ADMISSION_READ_NOT_ENGINE) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Reading:
    """What one poll of the engine's /metrics said."""

    free_tokens: float
    waiting: float
    prompt: Buckets  # summed over the page's series
    generation: Buckets
    block_size: float = 1.0  # tokens per KV block (the largest of the page's engines): a request takes whole blocks
    bad_histogram: str = ""  # why the request-size histograms were not taken (their buckets are then empty)
    counters: Counters = Counters()  # what the rates are learned from (exporter.tap.predict)
    prefix_hits: float = 0.0  # cumulative prompt tokens found in the prefix cache (llm_prefix_cache_hits_total)
    prefix_queries: float = 0.0  # cumulative prompt tokens looked up in it
    total_tokens: float = 0.0  # the KV cache's size in tokens (0: the page does not say)


# The adapters' gauges a reading is built from, each a count or a ratio that must be finite and in range.
_CHECKED = {C.KV_BLOCKS_FREE.name: math.inf, C.KV_BLOCKS_TOTAL.name: math.inf, C.KV_BLOCK_SIZE.name: math.inf,
            C.REQUESTS_WAITING.name: math.inf, C.KV_CACHE_USAGE.name: 1.0, C.REQUESTS_RUNNING.name: math.inf}
# The histograms whose _sum and _count the rates are learned from (the page's non-finite values are refused whole).
_TIMED = (C.TTFT.name, C.QUEUE_TIME.name, C.ITL.name, C.E2E.name)


def _check(name: str, model: str, value: float) -> None:
    where = f"{name}{{model={model!r}}}"
    if not math.isfinite(value):
        raise EngineReadError(f"{where} is {value}", C.ADMISSION_READ_NON_FINITE)
    if value < 0 or value > _CHECKED[name] or (name == C.KV_BLOCK_SIZE.name and value < 1):
        raise EngineReadError(f"{where} is {value}, outside what it can be", C.ADMISSION_READ_OUT_OF_RANGE)


def _histogram(per_model: dict[str, dict[float, float]]) -> tuple[Buckets, str]:
    """The buckets summed over models, or () and why when any model's are not a cumulative histogram."""
    summed: dict[float, float] = {}
    for model, buckets in per_model.items():
        ladder = sorted(buckets.items())
        counts = [n for _, n in ladder]
        if not all(math.isfinite(n) and n >= 0 for n in counts) or any(b < a for a, b in zip(counts, counts[1:], strict=False)) \
                or not ladder or ladder[-1][0] != math.inf or any(math.isnan(le) for le, _ in ladder):
            return (), f"model {model!r}: buckets not cumulative, finite and ending at +Inf"
        for le, n in ladder:
            summed[le] = summed.get(le, 0.0) + n
    return tuple(sorted(summed.items())), ""


def read_engine(families: Mapping[str, MetricFamily], kind: str = AUTO) -> Reading:
    """The free KV tokens, the queue and the request-size histograms of a parsed page, read through the
    engine kind's adapter (AUTO: the kind detected from the page). Each model's series is taken once (a
    duplicate does not add up), and every count and ratio must be finite and possible: a page that says
    otherwise raises EngineReadError with its reason, and the gate fails open rather than believe it."""
    if kind == AUTO:
        detected = adapters.detect(families)
        if detected is None or detected == adapters.tap.KIND:
            raise EngineReadError("no engine's families on the page")
        kind = detected
    gauges: dict[str, dict[str, float]] = {name: {} for name in _CHECKED}
    histograms: dict[str, dict[str, dict[float, float]]] = {
        C.REQUEST_PROMPT_TOKENS.name: {}, C.REQUEST_GENERATION_TOKENS.name: {}}
    timed: dict[str, float] = {}
    prefix = {C.PREFIX_CACHE_HITS.name: 0.0, C.PREFIX_CACHE_QUERIES.name: 0.0}
    for s in adapters.get(kind).adapt(families, {}):
        name, model = s.metric.name, s.labels.get(C.LABEL_MODEL, "")
        if name in gauges:
            _check(name, model, s.value)
            gauges[name][model] = s.value
        elif name in histograms and s.suffix == "_bucket":
            histograms[name].setdefault(model, {})[float(s.labels[C.LABEL_LE])] = s.value
        elif name in _TIMED and s.suffix in ("_sum", "_count") and math.isfinite(s.value) and s.value >= 0:
            timed[name + s.suffix] = timed.get(name + s.suffix, 0.0) + s.value
        elif name in prefix and math.isfinite(s.value) and s.value >= 0:
            prefix[name] += s.value
    free_blocks, totals, sizes = (gauges[m.name] for m in (C.KV_BLOCKS_FREE, C.KV_BLOCKS_TOTAL, C.KV_BLOCK_SIZE))
    sized = [(blocks, sizes[m]) for m, blocks in free_blocks.items() if m in sizes]
    if not sized:
        raise EngineReadError(f"no free KV blocks and block size on the {kind} page")
    for model, blocks in free_blocks.items():
        if model in totals and blocks > totals[model] + 0.5:
            raise EngineReadError(f"model {model!r}: {blocks:g} free KV blocks of {totals[model]:g}",
                                  C.ADMISSION_READ_INCONSISTENT)
    free = sum(blocks * size for blocks, size in sized)
    total = sum(blocks * sizes[m] for m, blocks in totals.items() if m in sizes)
    (prompt, bad_prompt), (generation, bad_gen) = (
        _histogram(histograms[m.name]) for m in (C.REQUEST_PROMPT_TOKENS, C.REQUEST_GENERATION_TOKENS))
    bad = bad_prompt or bad_gen
    if bad:
        prompt, generation = (), ()
    waiting = sum(gauges[C.REQUESTS_WAITING.name].values())
    sums = {f"{key}_{part}": timed.get(f"{m.name}_{part}", 0.0)
            for key, m in (("ttft", C.TTFT), ("queue", C.QUEUE_TIME), ("itl", C.ITL), ("e2e", C.E2E))
            for part in ("sum", "count")}
    counters = Counters(finished=prompt[-1][1] if prompt else 0.0, running=sum(gauges[C.REQUESTS_RUNNING.name].values()),
                        **sums)
    return Reading(free, waiting, prompt, generation, max(size for _, size in sized), bad, counters,
                   prefix[C.PREFIX_CACHE_HITS.name], prefix[C.PREFIX_CACHE_QUERIES.name], total)


def read_text(text: str, engine: str = AUTO) -> Reading:
    """Parse (checked, as the exporter does: a duplicate series keeps its first value; at most FAMILY_LIMIT samples
    of a family, so a page of made-up series costs a bounded time) and read (in the page reader's child process)."""
    page = parse_page(text, wanted(engine), checked=True, family_limit=FAMILY_LIMIT)
    if page.nonfinite:
        raise EngineReadError(f"{page.nonfinite} NaN or infinite values in the families admission reads",
                              C.ADMISSION_READ_NON_FINITE)
    return read_engine(page.families, engine)


def reading_of(fields: Mapping[str, Any]) -> Reading:
    """A Reading from its fields as the page reader sends them (dataclasses.asdict, through JSON)."""
    buckets = {k: tuple((float(le), float(n)) for le, n in fields[k]) for k in ("prompt", "generation")}
    return Reading(**{**fields, **buckets, "counters": Counters(**fields["counters"])})



def implausible(reading: Reading) -> str:
    """Why a reading cannot be believed (a conventions.ADMISSION_READ_* reason), or "": read_engine checks the page's
    own values, this the reading's, for a reading that reaches the gate another way (a test, a bench, a child that
    lies)."""
    values = (reading.free_tokens, reading.waiting, reading.block_size, reading.total_tokens)
    if not all(math.isfinite(v) for v in values):
        return C.ADMISSION_READ_NON_FINITE
    if min(values) < 0 or reading.block_size < 1:
        return C.ADMISSION_READ_OUT_OF_RANGE
    return ""
