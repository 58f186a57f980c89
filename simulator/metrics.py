"""vLLM V1's /metrics, fed by the engine core: the same family names, labels, HELP strings and bucket edges
as vLLM 0.33 (see ../shared/peers/engine-metrics/vllm-v1.prom), observed at the moments vLLM observes them.

Per step: generated tokens, TTFT (a request's first token) or inter-token latency (its later tokens),
prompt tokens (when the first token comes), prefix-cache queries and hits, preemptions, tokens per
iteration. Per finished request (any reason, so every histogram's _count equals the sum of
request_success): end-to-end, queue, prefill, decode and inference times, per-request TPOT, token counts.
Queue and cache gauges are read from the engine at scrape time. Each engine has its own registry.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from llmslo.conventions import VLLM as V
from simulator.engine import EngineCore, StepStats
from simulator.request import Request

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)
TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
PREEMPTION_BUCKETS = (1, 2, 3, 4, 5, 10, 20)
PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")  # pre-created, as vLLM does


def token_buckets(max_model_len: int) -> list[int]:
    """vLLM's 1-2-5 series up to max_model_len (build_1_2_5_buckets)."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_model_len:
                return out
            out.append(value)
        exponent += 1


def cache_config_labels(core: EngineCore) -> dict[str, str]:
    """vLLM 0.33's CacheConfig keys; what the simulator models carries its value, the rest vLLM's defaults."""
    c = core.config
    tokens = c.num_gpu_blocks * c.block_size
    return {
        V.LABEL_BLOCK_SIZE: str(c.block_size),
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": str(c.block_size),
        "effective_attention_block_size": str(c.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(c.enable_prefix_caching),
        "engine": c.engine_index,
        "gpu_memory_utilization": str(c.deployment.gpu_memory_utilization),
        "hash_block_size": str(c.block_size),
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": f"{tokens / c.model_len:.2f}",
        "kv_cache_memory_bytes": "None",
        "kv_cache_size_tokens": str(tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None",
        V.LABEL_NUM_GPU_BLOCKS: str(c.num_gpu_blocks),
        "num_gpu_blocks_override": str(c.num_gpu_blocks_override or None),
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "simple_cpu_offload_num_blocks": "None",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }


class VllmMetrics:
    """Registers itself as an observer of `core` and keeps a private registry with vLLM's families."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.registry = CollectorRegistry()
        cfg = core.config
        self._base = {V.LABEL_MODEL_NAME: cfg.model_name, V.LABEL_ENGINE: cfg.engine_index}
        # Registered in vLLM's page order: gauges, counters, histograms, then the info families.
        self._register_gauges(core)
        self._register_counters()
        self._register_histograms(token_buckets(cfg.model_len))
        reg = self.registry
        self.lora_info = None
        if cfg.lora_adapters:
            self.lora_info = Gauge(
                V.LORA_REQUESTS_INFO, "Running stats on lora requests.",
                [V.LABEL_MAX_LORA, V.LABEL_RUNNING_LORA_ADAPTERS, V.LABEL_WAITING_LORA_ADAPTERS], registry=reg)
            self._set_lora_info()
        cache_labels = cache_config_labels(core)
        Gauge(V.CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig", list(cache_labels),
              registry=reg).labels(**cache_labels).set(1)
        core.observers.append(self)

    def _gauge(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Gauge:
        return Gauge(name, doc, [*self._base, *extra], registry=self.registry)

    def _counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        return Counter(name, doc, [*self._base, *extra], registry=self.registry)

    def _histogram(self, name: str, doc: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(name, doc, list(self._base), buckets=buckets, registry=self.registry).labels(**self._base)

    def _register_gauges(self, core: EngineCore) -> None:
        gauge = self._gauge
        sched, kv = core.scheduler, core.kv
        gauge(V.NUM_REQUESTS_RUNNING, "Number of requests in model execution batches.").labels(
            **self._base).set_function(lambda: len(sched.running))
        gauge(V.NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.").labels(
            **self._base).set_function(lambda: len(sched.waiting))
        by_reason = gauge(
            V.NUM_REQUESTS_WAITING_BY_REASON,
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
            "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all "
            "reasons equals vllm:num_requests_waiting.",
            (V.LABEL_WAITING_REASON,),
        )
        by_reason.labels(**self._base, reason="capacity").set_function(lambda: len(sched.waiting) - sched.num_deferred)
        by_reason.labels(**self._base, reason="deferred").set_function(lambda: sched.num_deferred)
        gauge(V.KV_CACHE_USAGE_PERC, "KV-cache usage. 1 means 100 percent usage.").labels(
            **self._base).set_function(lambda: kv.usage)
        sleep = gauge(
            V.ENGINE_SLEEP_STATE,
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            (V.LABEL_SLEEP_STATE,),
        )
        for state in V.SLEEP_STATES:  # the simulator never sleeps
            sleep.labels(**self._base, sleep_state=state).set(1 if state == V.SLEEP_STATES[0] else 0)
        rejections = Counter(  # as vLLM: labelled by model and reason only; the simulator has no queue limits
            V.ADMISSION_REJECTIONS, "Number of admission attempts rejected by a queue limit, by reason.",
            [V.LABEL_MODEL_NAME, V.LABEL_REJECTION_REASON], registry=self.registry,
        )
        for reason in V.ADMISSION_REJECTION_REASONS:
            rejections.labels(core.config.model_name, reason)

    def _register_counters(self) -> None:
        counter = self._counter
        self.prefix_queries = counter(
            V.PREFIX_CACHE_QUERIES, "Prefix cache queries, in terms of number of queried tokens.").labels(**self._base)
        self.prefix_hits = counter(
            V.PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens.").labels(**self._base)
        self.preemptions = counter(
            V.NUM_PREEMPTIONS, "Cumulative number of preemption from the engine.").labels(**self._base)
        self.prompt_tokens = counter(V.PROMPT_TOKENS, "Number of prefill tokens processed.").labels(**self._base)
        by_source = counter(V.PROMPT_TOKENS_BY_SOURCE, "Number of prompt tokens by source.", (V.LABEL_SOURCE,))
        self.prompt_computed = by_source.labels(**self._base, source="local_compute")
        self.prompt_cache_hit = by_source.labels(**self._base, source="local_cache_hit")
        by_source.labels(**self._base, source="external_kv_transfer")
        self.prompt_cached = counter(
            V.PROMPT_TOKENS_CACHED, "Number of cached prompt tokens (local + external).").labels(**self._base)
        # the tier of each hit, all its sources written from the start as vLLM does: the simulator's cache is HBM
        cached_by = counter(V.PROMPT_TOKENS_CACHED_BY_SOURCE, (
            "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to "
            "DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at "
            "admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits."), (V.LABEL_SOURCE,))
        self.prompt_cached_device = cached_by.labels(**self._base, source=V.CACHE_HIT_SOURCES[0])
        for source in V.CACHE_HIT_SOURCES[1:]:
            cached_by.labels(**self._base, source=source)
        self.generation_tokens = counter(
            V.GENERATION_TOKENS, "Number of generation tokens processed.").labels(**self._base)
        success = counter(
            V.REQUEST_SUCCESS, "Count of successfully processed requests.", (V.LABEL_FINISHED_REASON,))
        self.success = {r: success.labels(**self._base, finished_reason=r) for r in FINISHED_REASONS}

    def _register_histograms(self, tok: Sequence[float]) -> None:
        histogram = self._histogram
        self.h_prompt = histogram(V.REQUEST_PROMPT_TOKENS, "Number of prefill tokens processed.", tok)
        self.h_generation = histogram(V.REQUEST_GENERATION_TOKENS, "Number of generation tokens processed.", tok)
        self.h_iteration = histogram(
            V.ITERATION_TOKENS, "Histogram of number of tokens per engine_step.", ITERATION_TOKENS_BUCKETS)
        self.h_max_generation = histogram(
            V.REQUEST_MAX_NUM_GENERATION_TOKENS, "Histogram of maximum number of requested generation tokens.", tok)
        self.h_params_n = histogram(V.REQUEST_PARAMS_N, "Histogram of the n request parameter.", PARAMS_N_BUCKETS)
        self.h_params_max_tokens = histogram(
            V.REQUEST_PARAMS_MAX_TOKENS, "Histogram of the max_tokens request parameter.", tok)
        self.h_ttft = histogram(V.TTFT, "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.h_itl = histogram(V.ITL, "Histogram of inter-token latency in seconds.", TOKEN_LATENCY_BUCKETS)
        self.h_tpot = histogram(
            V.REQUEST_TPOT, "Histogram of time_per_output_token_seconds per request.", TOKEN_LATENCY_BUCKETS)
        self.h_e2e = histogram(V.E2E, "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS)
        self.h_queue = histogram(
            V.QUEUE_TIME, "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.h_inference = histogram(
            V.INFERENCE_TIME, "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS)
        self.h_prefill = histogram(
            V.PREFILL_TIME, "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS)
        self.h_decode = histogram(
            V.DECODE_TIME, "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS)
        self.h_preemptions = histogram(
            V.REQUEST_NUM_PREEMPTIONS, "Histogram of the number of times a request was preempted.", PREEMPTION_BUCKETS)
        self.h_prefill_kv = histogram(
            V.REQUEST_PREFILL_KV_COMPUTED_TOKENS,
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).", tok)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ observer
    def on_step(self, core: EngineCore, stats: StepStats) -> None:
        self.h_iteration.observe(stats.num_tokens)
        if stats.num_preempted:
            self.preemptions.inc(stats.num_preempted)
        if stats.prefix_queries:
            self.prefix_queries.inc(stats.prefix_queries)
            self.prefix_hits.inc(stats.prefix_hits)
        if stats.token_reqs:
            self.generation_tokens.inc(len(stats.token_reqs))
        for req in stats.token_reqs:
            if req.num_output_tokens == 1:
                self.h_ttft.observe(req.first_token_time - req.arrival_time)
                self._count_prompt(req)
            else:
                self.h_itl.observe(req.last_token_time - req.prev_token_time)
        if self.lora_info is not None:
            self._set_lora_info()

    def _count_prompt(self, req: Request) -> None:
        cached = max(0, req.num_cached_tokens)
        self.prompt_tokens.inc(req.num_prompt_tokens)
        self.prompt_computed.inc(req.num_prompt_tokens - cached)
        if cached:
            self.prompt_cache_hit.inc(cached)
            self.prompt_cached.inc(cached)
            self.prompt_cached_device.inc(cached)

    def _set_lora_info(self) -> None:
        if self.lora_info is None:
            return
        sched = self.core.scheduler
        self.lora_info.labels(
            max_lora=str(self.core.config.max_loras),
            running_lora_adapters=",".join(sorted(sched.running_loras())),
            waiting_lora_adapters=",".join(sorted(sched.waiting_loras())),
        ).set(time.time())

    def on_finished(self, req: Request) -> None:
        self.success[req.finish_reason].inc()
        admitted = req.num_cached_tokens >= 0
        queued = max(req.queued_time, req.arrival_time)  # arrival when it never reached the scheduler
        scheduled = req.scheduled_time if admitted else req.finished_time
        n_out = req.num_output_tokens
        if n_out:
            prefill = req.first_token_time - req.scheduled_time
            decode = req.last_token_time - req.first_token_time
            inference = req.last_token_time - req.scheduled_time
        else:
            prefill = decode = inference = 0.0
        self.h_e2e.observe(req.finished_time - req.arrival_time)
        self.h_queue.observe(max(0.0, scheduled - queued))
        self.h_prefill.observe(prefill)
        self.h_decode.observe(decode)
        self.h_inference.observe(inference)
        self.h_tpot.observe(decode / (n_out - 1) if n_out > 1 else 0.0)
        self.h_prompt.observe(req.num_prompt_tokens)
        self.h_generation.observe(n_out)
        self.h_max_generation.observe(req.max_tokens)
        self.h_params_max_tokens.observe(req.max_tokens)
        self.h_params_n.observe(1)
        self.h_preemptions.observe(req.num_preemptions)
        self.h_prefill_kv.observe(max(0, req.num_prompt_tokens - max(0, req.num_cached_tokens)))
