"""SGLang: the 0.5 scheduler/tokenizer metrics and the pre-0.4.6 set from its docs.

SGLang always runs prometheus_client in multiprocess mode, so gauges declared without a
multiprocess mode carry a `pid` label, and scheduler gauges carry tp/pp/ep ranks. Only the model
is kept: everything else is summed away (counts add up across scheduler processes; the usage ratio
is recomputed from token counts). KV capacity is reported in tokens and turned into blocks with
`page_size`. The windowed `cache_hit_rate` gauge is not used: the cached-token counters are.

With priority scheduling (0.5) every metric carries a `priority` label. The scheduler's queue gauges
(`num_running_reqs`, `num_queue_reqs`) then write their total under `priority=""` AND the same requests
again per priority (`priority="0"`, ...): only the total is read, else every request counts twice.
Per-request (tokenizer) metrics are written once per request under its own priority, so they are summed.
Preemptions are retractions: `num_retracted_requests_total` (0.5) is the counter; the older
`num_retracted_reqs` gauge is a point-in-time count and is not used.

Hybrid models have more than one KV pool: full attention (`kv_*_tokens`), sliding-window attention
(`swa_*_tokens`) and Mamba state slots (`mamba_*_tokens`). The full pool's usage is
`kv_used_tokens / max_total_num_tokens`, a secondary pool's SGLang's own `used / (used + available +
evictable)`; the usage ratio is the fullest pool (as SGLang's own
`token_usage` is), so a full SWA or Mamba pool is not hidden behind a half-empty full-attention pool.
Free blocks stay those of the full-attention pool.

The newest collector (0.5.23, `sglang/srt/observability/metrics_collector.py`; it was `srt/metrics/collector.py`)
also gives: why requests wait (the waiting queue is `capacity`, the grammar queue `deferred`: the two add up to
llm_requests_waiting, as vLLM's reasons do), cached prompt tokens by the tier that supplied them
(`cached_tokens_total{cache_source}`: device, host, storage; `total` where the request had no breakdown, which is
cached but no tier), and the prompt tokens each request computed (`uncached_prompt_tokens_histogram`). Its
speculative-decoding signals are gauges averaged per batch (`spec_accept_rate`, `spec_accept_length`), not counters,
so they are not summed into llm_spec_decode_*.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from exporter.adapters.base import Adapter, Output, bounded, first_family, total, values
from exporter.model import MetricFamily, NormSample
from llmslo import conventions as c

KIND = c.ENGINE_SGLANG
P = "sglang:"
MODEL = "model_name"

NUM_RUNNING = P + "num_running_reqs"
NUM_QUEUE = P + "num_queue_reqs"
NUM_GRAMMAR_QUEUE = P + "num_grammar_queue_reqs"  # waiting for a grammar to compile, before the queue
TOKEN_USAGE = P + "token_usage"
KV_USED_TOKENS = P + "kv_used_tokens"
NUM_USED_TOKENS = P + "num_used_tokens"  # older name of the same count
KV_AVAILABLE_TOKENS = P + "kv_available_tokens"
KV_EVICTABLE_TOKENS = P + "kv_evictable_tokens"  # radix-cached, reclaimable: free seats, as in vLLM
MAX_TOTAL_TOKENS = P + "max_total_num_tokens"
PAGE_SIZE = P + "page_size"
NUM_PAGES = P + "num_pages"
CACHED_TOKENS = P + "cached_tokens"
PROMPT_TOKENS = P + "prompt_tokens"
GENERATION_TOKENS = P + "generation_tokens"
NUM_REQUESTS = P + "num_requests"
NUM_ABORTED = P + "num_aborted_requests"
NUM_RETRACTED = P + "num_retracted_requests"  # counter family (samples end in _total): preemptions
NUM_PAUSED = P + "num_paused_reqs"  # paused by an async weight sync (gauge with a `pid` label)
FULL_TOKEN_USAGE = P + "full_token_usage"
SWA_AVAILABLE_TOKENS, SWA_EVICTABLE_TOKENS, SWA_USED_TOKENS = (P + "swa_available_tokens", P + "swa_evictable_tokens",
                                                               P + "swa_used_tokens")
MAMBA_AVAILABLE_TOKENS, MAMBA_EVICTABLE_TOKENS, MAMBA_USED_TOKENS = (
    P + "mamba_available_tokens", P + "mamba_evictable_tokens", P + "mamba_used_tokens")
PROMPT_TOKENS_HISTOGRAM = P + "prompt_tokens_histogram"  # per request (tokenizer), cached tokens included
GENERATION_TOKENS_HISTOGRAM = P + "generation_tokens_histogram"
UNCACHED_PROMPT_TOKENS_HISTOGRAM = P + "uncached_prompt_tokens_histogram"  # per request: prompt tokens computed
CACHE_SOURCE = "cache_source"  # on cached_tokens_total: device | host | storage, or `total` (no breakdown)
CACHE_TIERS = {"device": "device", "host": "host", "storage": "storage"}
PRIORITY = "priority"  # with --enable-priority-scheduling: "" on totals, "<int>" on per-priority breakdowns
TTFT = P + "time_to_first_token_seconds"
E2E = P + "e2e_request_latency_seconds"
REQUEST_TPOT = P + "request_time_per_output_token_seconds"
ITL = P + "inter_token_latency_seconds"
ITL_LEGACY = P + "time_per_output_token_seconds"  # pre-0.4.6: per token (count = generated tokens)
QUEUE_TIME = P + "queue_time_seconds"
LORA_SLOTS_USED = P + "lora_pool_slots_used"
LORA_SLOTS_TOTAL = P + "lora_pool_slots_total"

WANTED = frozenset({
    NUM_RUNNING, NUM_QUEUE, NUM_GRAMMAR_QUEUE, TOKEN_USAGE, KV_USED_TOKENS, NUM_USED_TOKENS,
    KV_AVAILABLE_TOKENS, KV_EVICTABLE_TOKENS, MAX_TOTAL_TOKENS, PAGE_SIZE, NUM_PAGES, CACHED_TOKENS,
    PROMPT_TOKENS, GENERATION_TOKENS, NUM_REQUESTS, NUM_ABORTED, NUM_RETRACTED, TTFT, E2E, REQUEST_TPOT, ITL,
    ITL_LEGACY, QUEUE_TIME, LORA_SLOTS_USED, LORA_SLOTS_TOTAL, NUM_PAUSED, FULL_TOKEN_USAGE, SWA_AVAILABLE_TOKENS,
    SWA_EVICTABLE_TOKENS, SWA_USED_TOKENS, MAMBA_AVAILABLE_TOKENS, MAMBA_EVICTABLE_TOKENS, MAMBA_USED_TOKENS,
    PROMPT_TOKENS_HISTOGRAM, GENERATION_TOKENS_HISTOGRAM, UNCACHED_PROMPT_TOKENS_HISTOGRAM,
})

# The secondary pools of hybrid models: (used, available, evictable) token gauges. SGLang writes them (as 0)
# for every model; a pool whose tokens add up to 0 does not exist.
_SECONDARY_POOLS = (
    (c.KV_POOL_SWA, (SWA_USED_TOKENS, SWA_AVAILABLE_TOKENS, SWA_EVICTABLE_TOKENS)),
    (c.KV_POOL_MAMBA, (MAMBA_USED_TOKENS, MAMBA_AVAILABLE_TOKENS, MAMBA_EVICTABLE_TOKENS)),
)

# Gauges SGLang writes as a QueueCount: a total under priority="" plus a per-priority breakdown.
_QUEUE_COUNTS = frozenset({NUM_RUNNING, NUM_QUEUE})


def _is_total(labels: dict[str, str]) -> bool:
    """A QueueCount sample that is the total (no priority label, or priority=""), not a per-priority part."""
    return not labels.get(PRIORITY)


def _models(families: Mapping[str, MetricFamily]) -> list[str | None]:
    seen: dict[str | None, None] = {}
    for name in WANTED:
        for s in values(families.get(name)):
            seen[s.labels.get(MODEL)] = None
    return list(seen) or [None]


def _kv_cache(out: Output, families: Mapping[str, MetricFamily], model: str | None) -> None:
    def of_model(labels: dict[str, str]) -> bool:
        return labels.get(MODEL) == model

    used = total(first_family(families, KV_USED_TOKENS, NUM_USED_TOKENS), of_model)
    capacity = total(families.get(MAX_TOTAL_TOKENS), of_model)
    pools: dict[str, float] = {}
    if used is not None and capacity:
        pools[c.KV_POOL_FULL] = used / capacity
    else:
        ratios = [s.value for s in values(families.get(FULL_TOKEN_USAGE)) if of_model(s.labels)]
        if ratios:
            pools[c.KV_POOL_FULL] = sum(ratios) / len(ratios)
    for pool, (used_name, available_name, evictable_name) in _SECONDARY_POOLS:
        pool_used = total(families.get(used_name), of_model)
        pool_size = math.fsum(v for v in (pool_used, total(families.get(available_name), of_model),
                                          total(families.get(evictable_name), of_model)) if v is not None)
        if pool_used is not None and pool_size > 0:
            pools[pool] = pool_used / pool_size
    if pools:
        out.put(c.KV_CACHE_USAGE, max(pools.values()), model)  # the fullest pool is what runs out first
        if len(pools) > 1:
            for pool, ratio in pools.items():
                out.put(c.KV_POOL_USAGE, ratio, model, {c.LABEL_KV_POOL: pool})
    else:
        ratios = [s.value for s in values(families.get(TOKEN_USAGE)) if of_model(s.labels)]
        if ratios:
            out.put(c.KV_CACHE_USAGE, sum(ratios) / len(ratios), model)

    page_sizes = [s.value for s in values(families.get(PAGE_SIZE)) if of_model(s.labels) and s.value > 0]
    if not page_sizes:
        return  # without the page size, tokens cannot honestly be turned into blocks
    page = page_sizes[0]
    out.put(c.KV_BLOCK_SIZE, page, model)
    pages = total(families.get(NUM_PAGES), of_model)
    if pages is None and capacity is not None:
        pages = float(int(capacity // page))
    out.put(c.KV_BLOCKS_TOTAL, pages, model)
    available = total(families.get(KV_AVAILABLE_TOKENS), of_model)
    evictable = total(families.get(KV_EVICTABLE_TOKENS), of_model)
    if available is not None:
        out.put(c.KV_BLOCKS_FREE, float(int((available + (evictable or 0.0)) // page)), model)


def adapt(families: Mapping[str, MetricFamily], identity: Mapping[str, str]) -> list[NormSample]:
    out = Output(identity, KIND)

    for fam_name, metric in (
        (NUM_RUNNING, c.REQUESTS_RUNNING), (NUM_QUEUE, c.REQUESTS_WAITING), (NUM_GRAMMAR_QUEUE, c.REQUESTS_WAITING),
        (PROMPT_TOKENS, c.PROMPT_TOKENS), (GENERATION_TOKENS, c.GENERATION_TOKENS),
        (LORA_SLOTS_USED, c.LORA_ADAPTERS_RUNNING), (LORA_SLOTS_TOTAL, c.LORA_ADAPTERS_MAX),
        (NUM_RETRACTED, c.PREEMPTIONS), (NUM_PAUSED, c.REQUESTS_PAUSED),
    ):
        queue_count = fam_name in _QUEUE_COUNTS
        for s in values(families.get(fam_name)):
            if queue_count and not _is_total(s.labels):
                continue  # the per-priority breakdown repeats requests the total already counts
            out.add(metric, s.value, s.labels.get(MODEL))
            if metric is c.REQUESTS_WAITING:
                why = c.WAITING_REASONS[0] if fam_name == NUM_QUEUE else c.WAITING_REASONS[1]
                out.add(c.REQUESTS_WAITING_BY_REASON, s.value, s.labels.get(MODEL), {c.LABEL_REASON: why})
    for s in values(families.get(CACHED_TOKENS)):
        out.add(c.PROMPT_TOKENS_CACHED, s.value, s.labels.get(MODEL))
        source = s.labels.get(CACHE_SOURCE)  # older releases write no source: cached, no tier
        if source is not None and source != "total":
            out.add(c.PROMPT_TOKENS_CACHED_BY_TIER, s.value, s.labels.get(MODEL),
                    {c.LABEL_CACHE_TIER: bounded(source, CACHE_TIERS)})

    for model in _models(families):
        def of_model(labels: dict[str, str], model: str | None = model) -> bool:
            return labels.get(MODEL) == model

        _kv_cache(out, families, model)

        hits = total(families.get(CACHED_TOKENS), of_model)
        if hits is not None:  # the queries are the prompt tokens; without hits there is no prefix-cache view
            out.put(c.PREFIX_CACHE_HITS, hits, model)
            out.put(c.PREFIX_CACHE_QUERIES, total(families.get(PROMPT_TOKENS), of_model), model)

        finished = total(families.get(NUM_REQUESTS), of_model)
        aborted = total(families.get(NUM_ABORTED), of_model)
        if aborted is not None:
            out.put(c.REQUESTS_FINISHED, aborted, model, {c.LABEL_REASON: c.FINISHED_ABORT})
        if finished is not None:
            completed = max(0.0, finished - (aborted or 0.0))
            out.put(c.REQUESTS_FINISHED, completed, model, {c.LABEL_REASON: c.FINISHED_COMPLETED})

    for metric, names in (
        (c.TTFT, (TTFT,)), (c.E2E, (E2E,)), (c.TPOT, (REQUEST_TPOT,)), (c.ITL, (ITL, ITL_LEGACY)),
        (c.QUEUE_TIME, (QUEUE_TIME,)), (c.REQUEST_PROMPT_TOKENS, (PROMPT_TOKENS_HISTOGRAM,)),
        (c.REQUEST_GENERATION_TOKENS, (GENERATION_TOKENS_HISTOGRAM,)),
        (c.REQUEST_PREFILL_COMPUTED_TOKENS, (UNCACHED_PROMPT_TOKENS_HISTOGRAM,)),
    ):
        out.histogram(metric, first_family(families, *names), model_label=MODEL)
    return out.samples()


ADAPTER = Adapter(KIND, WANTED, adapt, detect_prefixes=(P,))
