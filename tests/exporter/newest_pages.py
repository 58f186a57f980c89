"""The engines' newest signals as their newest source registers them, written by prometheus_client (issue #37).

vLLM 0.34.0 (the newest on PyPI on 2026-12-02; wheel sha256 79ca4b3cd74aec08..., names unchanged since 0.32):
`vllm/v1/metrics/loggers.py` (PrometheusStatLogger: labelnames `model_name`, `engine`; the waiting-by-reason,
prompt-token-by-source, cached, cached-by-source, admission-rejection and sleep families; the request_tokens
buckets, 1-2-5 up to max_model_len), `vllm/v1/metrics/stats.py` (PromptTokenStats.ALL_SOURCES),
`vllm/v1/metrics/cache_hit_source.py` (CacheHitSource) and `vllm/v1/spec_decode/metrics.py` (SpecDecodingProm).
SGLang 0.5.23 (the newest; wheel sha256 00b3cd5b265ac76c...): `sglang/srt/observability/metrics_collector.py`
(`cached_tokens_total{cache_source}`, `uncached_prompt_tokens_histogram`, the grammar queue gauge). Names, types and
label sets are upstream's; the values are whatever a test needs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tests.exporter.engine_pages import LLAMA, observe_all, sglang_scheduler_labels, text

VLLM_NAMES = ["model_name", "engine"]
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")  # PromptTokenStats.ALL_SOURCES
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")  # CacheHitSource, in its order
WAITING_REASONS = ("capacity", "deferred")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
SGLANG_PROMPT_TOKEN_BUCKETS = [  # metrics_collector.py default_bucket_prompt_tokens (generate_buckets' "default")
    100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500, 15000, 17500, 20000,
    22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000, 400000, 600000, 800000, 1000000,
    1100000]


def request_tokens_buckets(max_model_len: int) -> list[int]:
    """build_1_2_5_buckets(max_model_len): 1, 2, 5, 10, ... up to max_model_len, which it does not pass."""
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10 ** exponent
            if value > max_model_len:
                return out
            out.append(value)
        exponent += 1


@dataclass
class VllmEngine:
    """What one data-parallel engine index has counted; label values are vLLM's own (a test may add others)."""

    waiting: Mapping[str, int] = field(default_factory=lambda: {"capacity": 3, "deferred": 1})
    by_source: Mapping[str, int] = field(default_factory=lambda: {"local_compute": 900, "local_cache_hit": 300,
                                                                 "external_kv_transfer": 50})
    cached_by_source: Mapping[str, int] = field(default_factory=lambda: {"device": 300, "p2p": 50})
    prefill_computed: Iterable[int] = (4, 90, 806)
    drafts: tuple[int, int, int] | None = (40, 120, 70)  # drafts, draft tokens, accepted tokens; None: no spec decode
    accepted_per_pos: Mapping[str, int] = field(default_factory=lambda: {"0": 35, "1": 22, "2": 13})


def vllm_newest_page(engines: Mapping[int, VllmEngine], *, rejections: Mapping[str, int] | None = None,
                     max_model_len: int = 4096) -> str:
    """A vLLM 0.34 page for these data-parallel engines (one API server, so rejections carry no `engine`)."""
    reg = CollectorRegistry()
    waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", VLLM_NAMES,
                    registry=reg, multiprocess_mode="mostrecent")
    by_reason = Gauge("vllm:num_requests_waiting_by_reason", "Number of waiting requests by reason.",
                      VLLM_NAMES + ["reason"], registry=reg, multiprocess_mode="mostrecent")
    prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", VLLM_NAMES, registry=reg)
    by_source = Counter("vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", VLLM_NAMES + ["source"],
                        registry=reg)
    cached = Counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", VLLM_NAMES,
                     registry=reg)
    cached_by = Counter("vllm:prompt_tokens_cached_by_source", "Prefix-cache hit tokens by the cache tier.",
                        VLLM_NAMES + ["source"], registry=reg)
    computed = Histogram("vllm:request_prefill_kv_computed_tokens",
                         "Histogram of new KV tokens computed during prefill (excluding cached tokens).", VLLM_NAMES,
                         buckets=request_tokens_buckets(max_model_len), registry=reg)
    spec = [Counter(name, doc, VLLM_NAMES, registry=reg) for name, doc in (
        ("vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
        ("vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
        ("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."))]
    per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                      VLLM_NAMES + ["position"], registry=reg)
    for idx, e in engines.items():
        labels = [LLAMA, str(idx)]
        waiting.labels(*labels).set(sum(e.waiting.values()))
        for reason, n in e.waiting.items():
            by_reason.labels(*labels, reason).set(n)
        prompt.labels(*labels).inc(sum(e.by_source.values()))
        for source in dict.fromkeys([*PROMPT_SOURCES, *e.by_source]):  # every source, as vLLM pre-creates them
            by_source.labels(*labels, source).inc(e.by_source.get(source, 0))
        cached.labels(*labels).inc(sum(n for s, n in e.by_source.items() if s != "local_compute"))
        for source in dict.fromkeys([*CACHE_HIT_SOURCES, *e.cached_by_source]):
            cached_by.labels(*labels, source).inc(e.cached_by_source.get(source, 0))
        observe_all(computed.labels(*labels), e.prefill_computed)
        if e.drafts is not None:
            for counter, n in zip(spec, e.drafts, strict=True):
                counter.labels(*labels).inc(n)
            for pos, n in e.accepted_per_pos.items():
                per_pos.labels(*labels, pos).inc(n)
    if rejections is not None:
        rejected = Counter("vllm:admission_rejections",
                           "Number of admission attempts rejected by a queue limit, by reason.",
                           ["model_name", "reason"], registry=reg)
        for reason in dict.fromkeys([*ADMISSION_REASONS, *rejections]):
            rejected.labels(model_name=LLAMA, reason=reason).inc(rejections.get(reason, 0))
    return text(reg)


def sglang_newest_page(*, cached: Mapping[str, int] | None = None, uncached: Iterable[int] = (),
                       queued: int = 0, grammar_queue: int = 0) -> str:
    """A scheduler + tokenizer page of SGLang 0.5.23: `cached` maps a cache_source (device, host, storage, total)
    to tokens; `cached=None` writes the pre-0.5 counter without a cache_source label."""
    reg = CollectorRegistry()
    sched = sglang_scheduler_labels(priority=False)
    for name, value in (("sglang:num_queue_reqs", queued), ("sglang:num_grammar_queue_reqs", grammar_queue)):
        Gauge(name, "The number of requests in a queue.", list(sched), registry=reg,
              multiprocess_mode="mostrecent").labels(**sched).set(value)
    tokenizer = {"model_name": LLAMA, "engine_type": "unified"}
    if cached is None:
        Counter("sglang:cached_tokens", "Number of cached prompt tokens.", list(tokenizer),
                registry=reg).labels(**tokenizer).inc(77)
    else:
        counter = Counter("sglang:cached_tokens", "Number of cached prompt tokens by source (device/host/storage).",
                          [*tokenizer, "cache_source"], registry=reg)
        for source, n in cached.items():
            counter.labels(**tokenizer, cache_source=source).inc(n)
    hist = Histogram("sglang:uncached_prompt_tokens_histogram", "Histogram of uncached (compute) prompt token length.",
                     list(tokenizer), buckets=SGLANG_PROMPT_TOKEN_BUCKETS, registry=reg)
    observe_all(hist.labels(**tokenizer), uncached)
    return text(reg)
