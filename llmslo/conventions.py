"""Every metric, label and rule name the project emits or refers to, defined once.

The exporter writes these names, the tap writes these names, slogen's built-in LLM SLIs,
the dashboards and the KEDA queries read them from here. A rename is one edit here, and
tests compare generated artifacts against this module, so drift is caught.

Units are base units (seconds, bytes, ratios 0..1, watts, joules, hertz), as Prometheus
naming conventions ask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmslo.engine_names import LLAMACPP as LLAMACPP  # the engines' own names, re-exported
from llmslo.engine_names import VLLM as VLLM

PREFIX = "llm_"

# --------------------------------------------------------------------------------------
# Labels
# --------------------------------------------------------------------------------------
LABEL_ENGINE = "engine"  # the engine kind: one of ENGINE_KINDS
# Engine kinds, the values of LABEL_ENGINE: one per adapter (the exporter derives its kinds from its adapters,
# exporter/adapters/, each of which names its kind here; a test holds the two equal).
ENGINE_VLLM = "vllm"
ENGINE_SGLANG = "sglang"
ENGINE_TGI = "tgi"
ENGINE_TRTLLM_TRITON = "trtllm-triton"
ENGINE_TRTLLM_SERVE = "trtllm-serve"
ENGINE_LLAMACPP = "llamacpp"
ENGINE_TAP = "tap"  # the goodput tap's own page, read by the node exporter like an engine's
SERVING_ENGINE_KINDS = (ENGINE_VLLM, ENGINE_SGLANG, ENGINE_TGI, ENGINE_TRTLLM_TRITON, ENGINE_TRTLLM_SERVE,
                        ENGINE_LLAMACPP)
ENGINE_KINDS = SERVING_ENGINE_KINDS + (ENGINE_TAP,)
# Each engine kind's latency histogram bucket edges, per version: llmslo/bucket_edges.py (ROWS, one table).
LABEL_MODEL = "model"
LABEL_POD = "pod"
LABEL_NAMESPACE = "namespace"
LABEL_NODE = "node"
LABEL_TARGET = "target"  # the exporter's name for one scraped source (URL or pod/port)
LABEL_REASON = "reason"  # finished reason, drop reason, error reason
LABEL_ADAPTER = "adapter"  # LoRA adapter name
LABEL_SLO_CLASS = "slo_class"
LABEL_OUTCOME = "outcome"
LABEL_USAGE_SOURCE = "usage_source"  # "usage" (engine-reported) | "chunks" (counted by the tap)
LABEL_LE = "le"
LABEL_CONFIG_HASH = "hash"  # TAP_CONFIG_INFO: llmslo.confighash of the SLO files a tap has loaded
# The tap's latency histograms: a short hash of the series' bucket edges. A reload that changes the edges
# (a threshold changed) starts a new set of series, count and buckets together, so no SLI reads a `_count`
# that holds requests measured before its threshold's bucket existed (exporter/tap/metrics.py).
LABEL_BUCKETS = "buckets"
LABEL_CLUSTER = "cluster"  # added by federation / remote-write external labels, not by the exporter

# Labels every normalized engine series carries (target identity).
ENGINE_IDENTITY_LABELS = (LABEL_ENGINE, LABEL_MODEL, LABEL_POD, LABEL_NAMESPACE, LABEL_NODE)

# GPU labels, compatible with dcgm-exporter so existing dashboards can join on them.
LABEL_GPU = "gpu"
LABEL_UUID = "UUID"
LABEL_MODEL_NAME = "model_name"  # dcgm-exporter: modelName on GPU series, model_name on NVLink ones; promtool check metrics rejects camelCase label names
LABEL_PCI_BUS_ID = "pci_bus_id"
LABEL_HOSTNAME = "hostname"  # dcgm-exporter since d5e5f51 (#655); its releases before that wrote "Hostname"
LABEL_GPU_INSTANCE_ID = "GPU_I_ID"  # MIG instance, as dcgm-exporter
LABEL_GPU_INSTANCE_PROFILE = "GPU_I_PROFILE"
LABEL_PID = "pid"
LABEL_ECC_TYPE = "type"  # corrected | uncorrected
LABEL_XID = "xid"
LABEL_CLOCK_EVENT = "clock_event"  # dcgm-exporter's label on DCGM_EXP_CLOCK_EVENTS_COUNT, same value names
GPU_IDENTITY_LABELS = (LABEL_GPU, LABEL_UUID, LABEL_MODEL_NAME, LABEL_PCI_BUS_ID, LABEL_HOSTNAME)
# The container that holds a GPU or MIG instance (the kubelet's pod-resources API), as dcgm-exporter labels it;
# empty when no container holds it or the kubelet cannot be read. LABEL_POD and LABEL_NAMESPACE name its pod.
LABEL_CONTAINER = "container"
# The node pool an exporter's node belongs to (its --node-pool, set per pool by the install: EXPORTER_NODE_POOL_INFO),
# joined to the GPU series on LABEL_HOSTNAME; not LABEL_KV_POOL ("pool", a hybrid model's KV pool).
LABEL_NODE_POOL = "node_pool"

# The exporter's build (llmslo_build_info, as Prometheus exporters' <name>_build_info).
LABEL_VERSION = "version"
LABEL_PYTHON_VERSION = "python_version"
LABEL_PYTHON_IMPLEMENTATION = "python_implementation"

# Request outcomes counted by the tap (docs/metrics.md, "Outcomes", defines each precisely).
OUTCOME_OK = "ok"  # complete: a stream ended with the engine's final event, a body with its framing
OUTCOME_UPSTREAM_ERROR = "upstream_error"  # 5xx or 429 from the engine, or no response at all (502)
OUTCOME_ABORTED = "aborted"  # upstream broke off mid-body, or sent an error event mid-stream
OUTCOME_TRUNCATED = "truncated"  # the body ended cleanly but a stream lacked its final event ([DONE] / finish_reason)
OUTCOME_UPSTREAM_TIMEOUT = "upstream_timeout"  # the tap's first-token, stall or response deadline passed
OUTCOME_CLIENT_GAVE_UP = "client_gave_up"  # the client left after its objective could no longer be met
OUTCOME_CLIENT_DISCONNECTED = "client_disconnected"  # the client left while its request was still on time
OUTCOME_CLIENT_ERROR = "client_error"  # upstream answered 4xx (not 429): the request was at fault, not the service
OUTCOME_REFUSED = "refused"  # the tap's KV admission (--admission) answered 429: the engine was full
OUTCOMES = (
    OUTCOME_OK, OUTCOME_UPSTREAM_ERROR, OUTCOME_ABORTED, OUTCOME_TRUNCATED, OUTCOME_UPSTREAM_TIMEOUT,
    OUTCOME_CLIENT_GAVE_UP, OUTCOME_CLIENT_DISCONNECTED, OUTCOME_CLIENT_ERROR, OUTCOME_REFUSED,
)
# How the SLIs read outcomes. Bad: the service's failure (availability and goodput count them
# as errors). Neutral: nobody's failure, left out of every total. Late: requests that never
# completed because they were too late; latency SLIs count them as slower than any threshold.
TAP_BAD_OUTCOMES = (
    OUTCOME_UPSTREAM_ERROR, OUTCOME_ABORTED, OUTCOME_TRUNCATED, OUTCOME_UPSTREAM_TIMEOUT, OUTCOME_CLIENT_GAVE_UP,
    OUTCOME_REFUSED,
)
TAP_NEUTRAL_OUTCOMES = (OUTCOME_CLIENT_DISCONNECTED, OUTCOME_CLIENT_ERROR)
TAP_LATE_OUTCOMES = (OUTCOME_UPSTREAM_TIMEOUT, OUTCOME_CLIENT_GAVE_UP)

# Why the tap itself refused a connection or a request (LABEL_REASON of TAP_REFUSALS).
REFUSED_CONNECTION_LIMIT = "connection_limit"  # --max-connections reached: 503 and close
REFUSED_HEAD_TIMEOUT = "head_timeout"  # the request head did not arrive within --head-timeout: 408 and close
REFUSED_HEAD_TOO_LARGE = "head_too_large"  # 431
REFUSED_BODY_TOO_LARGE = "body_too_large"  # over --max-body-bytes: 413
REFUSED_BODY_MEMORY = "body_memory"  # every buffered request body together over --max-buffered-body-bytes: 503
REFUSED_MALFORMED = "malformed"  # 400
# KV admission (--admission): 429 with Retry-After and an OpenAI error object, the request never reaches the engine
# (the objective-based reasons first, then the operator's optional floors; docs/capacity.md)
REFUSED_ADMISSION_TTFT = "admission_ttft"  # the predicted wait to start misses the class's TTFT objective
REFUSED_ADMISSION_TPOT = "admission_tpot"  # running requests miss the TPOT objective (decode overload)
REFUSED_ADMISSION_SHED = "admission_shed"  # a sheddable class shed early; its own objective would still be met
REFUSED_ADMISSION_KV = "admission_kv_full"  # fewer free KV seats than --admission-min-seats (a floor, opt-in)
REFUSED_ADMISSION_QUEUE = "admission_queue"  # the queue would pass --admission-max-queue (a floor, opt-in)
# a refused client came back before the Retry-After it was given (exporter.tap.turns): refused again, time left
REFUSED_ADMISSION_EARLY = "admission_retry_early"
REFUSED_ADMISSION_REASONS = (
    REFUSED_ADMISSION_TTFT, REFUSED_ADMISSION_TPOT, REFUSED_ADMISSION_SHED, REFUSED_ADMISSION_KV,
    REFUSED_ADMISSION_QUEUE, REFUSED_ADMISSION_EARLY,
)
REFUSED_REASONS = (
    REFUSED_CONNECTION_LIMIT, REFUSED_HEAD_TIMEOUT, REFUSED_HEAD_TOO_LARGE, REFUSED_BODY_TOO_LARGE,
    REFUSED_BODY_MEMORY, REFUSED_MALFORMED, *REFUSED_ADMISSION_REASONS,
)
# The refusals that are the tap's own capacity running out (legitimate clients get 503s, which no SLO
# counts); the rest are a client's fault. HEALTH.TAP_REFUSING_REQUESTS fires on these.
REFUSED_CAPACITY_REASONS = (REFUSED_CONNECTION_LIMIT, REFUSED_BODY_MEMORY)

# Values of LABEL_REASON on EXPORTER_DISCOVERY_ABANDONED: the bound a pod listing hit, or an API server error.
ABANDONED_PAGES = "max_pages"
ABANDONED_ITEMS = "max_items"
ABANDONED_BYTES = "page_bytes"
ABANDONED_TIME = "listing_timeout"
ABANDONED_ERROR = "error"
ABANDONED_REASONS = (ABANDONED_PAGES, ABANDONED_ITEMS, ABANDONED_BYTES, ABANDONED_TIME, ABANDONED_ERROR)

# Values of LABEL_USAGE_SOURCE on the tap's token counters.
USAGE_SOURCE_ENGINE = "usage"  # usage.completion_tokens reported by the engine
USAGE_SOURCE_CHUNKS = "chunks"  # no usage reported: the tap counted output chunks

# Normalized finished reasons (engines' own spellings are mapped onto these by adapters).
FINISHED_STOP = "stop"
FINISHED_LENGTH = "length"
FINISHED_ABORT = "abort"
FINISHED_ERROR = "error"
# Finished without error, but the engine does not say whether by a stop condition or the length limit
# (SGLang, TGI and Triton count successes without a reason).
FINISHED_COMPLETED = "completed"
FINISHED_REASONS = (FINISHED_STOP, FINISHED_LENGTH, FINISHED_ABORT, FINISHED_ERROR, FINISHED_COMPLETED)
FINISHED_BAD_REASONS = (FINISHED_ABORT, FINISHED_ERROR)  # the rest finished as the client asked

# A client's own 4xx (a malformed or invalid request, a prompt over the context length, an unknown model) is
# never the engine's failure, on any engine: adapters count an engine's refusals of that kind in
# llm_requests_rejected_total under the engine's own reason, and never as FINISHED_ERROR (nor anywhere else in
# llm_requests_finished_total, so availability neither gains nor loses by them). 429 and 5xx are the engine's
# overload or failure: refused that way, a request stays an `error`. The tap reads statuses the same way
# (OUTCOME_CLIENT_ERROR is neutral, 429 is OUTCOME_UPSTREAM_ERROR).
HTTP_TOO_MANY_REQUESTS = 429


def http_status_is_client_fault(code: int) -> bool:
    """Whether an HTTP status is the client's own fault: 4xx except 429 (the engine out of capacity)."""
    return 400 <= code < 500 and code != HTTP_TOO_MANY_REQUESTS

# LoRA adapter states on llm_lora_adapter_active.
LABEL_LORA_STATE = "state"
LORA_STATE_RUNNING = "running"
LORA_STATE_WAITING = "waiting"


@dataclass(frozen=True)
class MetricDef:
    """One normalized series family: its name (without histogram/counter suffixes), type and meaning."""

    name: str
    kind: str  # "gauge" | "counter" | "histogram"
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""

    def bucket(self) -> str:
        return self.name + "_bucket"

    def count(self) -> str:
        return self.name + "_count"

    def sum(self) -> str:
        return self.name + "_sum"


def _m(name: str, kind: str, help: str, labels: tuple[str, ...] = (), unit: str = "") -> MetricDef:
    return MetricDef(PREFIX + name, kind, help, labels, unit)


# --------------------------------------------------------------------------------------
# Engine metrics (exporter adapters write these; labels: ENGINE_IDENTITY_LABELS + listed)
# --------------------------------------------------------------------------------------
REQUESTS_RUNNING = _m("requests_running", "gauge", "Requests in the running batch (decoding or prefilling).")
REQUESTS_WAITING = _m("requests_waiting", "gauge", "Requests queued, waiting for admission to the batch.")
KV_CACHE_USAGE = _m("kv_cache_usage_ratio", "gauge", "Fraction of KV-cache blocks in use (0..1).", unit="ratio")
KV_BLOCKS_TOTAL = _m("kv_cache_blocks", "gauge", "KV-cache blocks the engine can give to requests, in total.")
KV_BLOCKS_FREE = _m("kv_cache_free_blocks", "gauge", "Free KV-cache blocks: the serving capacity left (the seats).")
KV_BLOCK_SIZE = _m("kv_cache_block_size_tokens", "gauge", "Tokens per KV-cache block (page size).")
PREEMPTIONS = _m("preemptions_total", "counter", "Requests preempted (recomputed or swapped) for lack of KV blocks.")
PREFIX_CACHE_QUERIES = _m("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.")
PREFIX_CACHE_HITS = _m("prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.")
PROMPT_TOKENS = _m("prompt_tokens_total", "counter", "Prompt (prefill) tokens processed.")
GENERATION_TOKENS = _m("generation_tokens_total", "counter", "Output tokens generated.")
REQUESTS_FINISHED = _m(
    "requests_finished_total", "counter", "Finished requests by normalized reason.", (LABEL_REASON,)
)
TTFT = _m("time_to_first_token_seconds", "histogram", "Engine-side time to first token.", unit="seconds")
TPOT = _m(
    "time_per_output_token_seconds",
    "histogram",
    "Per-request mean time per output token after the first (engine-side).",
    unit="seconds",
)
ITL = _m("inter_token_latency_seconds", "histogram", "Per-token inter-token latency (engine-side).", unit="seconds")
E2E = _m("e2e_request_latency_seconds", "histogram", "End-to-end request latency (engine-side).", unit="seconds")
QUEUE_TIME = _m("request_queue_time_seconds", "histogram", "Time a request spent waiting before admission.", unit="seconds")
LORA_ADAPTERS_RUNNING = _m("lora_adapters_running", "gauge", "LoRA adapters with requests in the running batch.")
LORA_ADAPTERS_WAITING = _m("lora_adapters_waiting", "gauge", "LoRA adapters with requests waiting for a slot.")
LORA_ADAPTERS_MAX = _m("lora_adapter_slots", "gauge", "LoRA adapter slots the engine can hold at once.")
LORA_ADAPTER_ACTIVE = _m(
    "lora_adapter_active", "gauge", "1 for each LoRA adapter running (state=running) or waiting (state=waiting).",
    (LABEL_ADAPTER, LABEL_LORA_STATE),
)

# Signals on-call needs that the engines publish: capacity that is not there (an engine asleep,
# a full secondary KV pool, a spent batch token budget), requests refused or paused, per-request sizes.
LABEL_KV_POOL = "pool"  # on KV_POOL_USAGE: which KV pool of a hybrid model
KV_POOL_FULL = "full"  # full-attention KV (every model has it)
KV_POOL_SWA = "swa"  # sliding-window-attention KV (hybrid SWA models)
KV_POOL_MAMBA = "mamba"  # Mamba/SSM state slots (hybrid SSM models)
KV_POOL_USAGE = _m(
    "kv_cache_pool_usage_ratio", "gauge",
    "Fraction of one KV pool in use (0..1), per pool of a hybrid model; llm_kv_cache_usage_ratio is the fullest.",
    (LABEL_KV_POOL,), "ratio",
)
ENGINE_SLEEPING = _m(
    "engine_sleeping", "gauge", "1 while the engine sleeps (weights offloaded or discarded): it serves nothing, no KV capacity."
)
REQUESTS_PAUSED = _m(
    "requests_paused", "gauge", "Requests the engine paused mid-flight (KV pressure, a weight update): admitted, not progressing."
)
REQUESTS_REJECTED = _m(
    "requests_rejected_total", "counter", "Requests the engine refused before admission, by the engine's own reason.",
    (LABEL_REASON,),
)
BATCH_MAX_TOKENS = _m("batch_max_tokens", "gauge", "Tokens the running batch may hold at once: the batch token budget.")
BATCH_RESERVED_TOKENS = _m(
    "batch_reserved_tokens", "gauge", "Tokens the running batch has reserved against llm_batch_max_tokens."
)
REQUEST_PROMPT_TOKENS = _m("request_prompt_tokens", "histogram", "Prompt tokens per finished request.", unit="tokens")
REQUEST_GENERATION_TOKENS = _m(
    "request_generation_tokens", "histogram", "Output tokens per finished request.", unit="tokens"
)
FRONTEND_TTFT = _m(
    "frontend_time_to_first_token_seconds", "histogram",
    "Time to first response of the model clients call (Triton ensemble or BLS): engine TTFT plus pre/postprocessing.",
    unit="seconds",
)
# The engines' newest signals (vLLM 0.34 v1/metrics/loggers.py and v1/spec_decode/metrics.py, SGLang 0.5.23
# observability/metrics_collector.py). A label value a page writes is one of the listed values, else OTHER.
OTHER = "other"
WAITING_REASONS = ("capacity", "deferred")  # room in the batch | held back (a LoRA slot, a KV transfer, a grammar)
LABEL_SOURCE, PROMPT_SOURCES = "source", ("computed", "local_cache", "external_transfer")  # where a prompt's KV came from
LABEL_CACHE_TIER, CACHE_TIERS = "tier", ("device", "host", "disk", "p2p", "storage", "external")
LABEL_POSITION, SPEC_POSITIONS = "position", 16  # draft positions kept apart; later ones are summed under OTHER
# The engine refused a request for its own capacity (LLMEngineRefusingRequests): vLLM's queue caps (OTHER: a vLLM cap
# this exporter does not know yet), TGI's overloaded (429), Triton's REJECTED, trtllm-serve's 429 and 503.
ENGINE_REFUSAL_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens", OTHER, "overloaded", "REJECTED", "http_429",
                          "http_503")
REQUESTS_WAITING_BY_REASON = _m("requests_waiting_by_reason", "gauge",
                                "Waiting requests by why they wait; the reasons add up to llm_requests_waiting.", (LABEL_REASON,))
PROMPT_TOKENS_CACHED = _m("prompt_tokens_cached_total", "counter", "Prompt tokens whose KV came from a cache, not computed.")
PROMPT_TOKENS_BY_SOURCE = _m("prompt_tokens_by_source_total", "counter", "Prompt tokens by where their KV came from.",
                             (LABEL_SOURCE,))
PROMPT_TOKENS_CACHED_BY_TIER = _m("prompt_tokens_cached_by_tier_total", "counter",
                                  "Cached prompt tokens by the cache tier that supplied them.", (LABEL_CACHE_TIER,))
REQUEST_PREFILL_COMPUTED_TOKENS = _m("request_prefill_computed_tokens", "histogram",
                                     "Prompt tokens computed in prefill per finished request (cached ones excluded).", unit="tokens")
SPEC_DRAFTS = _m("spec_decode_drafts_total", "counter", "Speculative-decoding drafts proposed.")
SPEC_DRAFT_TOKENS = _m("spec_decode_draft_tokens_total", "counter", "Draft tokens proposed.")
SPEC_ACCEPTED_TOKENS = _m("spec_decode_accepted_tokens_total", "counter", "Draft tokens accepted.")
SPEC_ACCEPTED_BY_POSITION = _m("spec_decode_accepted_tokens_by_position_total", "counter",
                               "Draft tokens accepted, by position in the draft.", (LABEL_POSITION,))
ENGINE_METRICS: tuple[MetricDef, ...] = (
    REQUESTS_RUNNING, REQUESTS_WAITING, KV_CACHE_USAGE, KV_BLOCKS_TOTAL, KV_BLOCKS_FREE, KV_BLOCK_SIZE,
    PREEMPTIONS, PREFIX_CACHE_QUERIES, PREFIX_CACHE_HITS, PROMPT_TOKENS, GENERATION_TOKENS, REQUESTS_FINISHED,
    TTFT, TPOT, ITL, E2E, QUEUE_TIME, LORA_ADAPTERS_RUNNING, LORA_ADAPTERS_WAITING, LORA_ADAPTERS_MAX,
    LORA_ADAPTER_ACTIVE,
    KV_POOL_USAGE, ENGINE_SLEEPING, REQUESTS_PAUSED, REQUESTS_REJECTED, BATCH_MAX_TOKENS, BATCH_RESERVED_TOKENS,
    REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS, FRONTEND_TTFT, REQUESTS_WAITING_BY_REASON, PROMPT_TOKENS_CACHED,
    PROMPT_TOKENS_BY_SOURCE, PROMPT_TOKENS_CACHED_BY_TIER, REQUEST_PREFILL_COMPUTED_TOKENS, SPEC_DRAFTS, SPEC_DRAFT_TOKENS,
    SPEC_ACCEPTED_TOKENS, SPEC_ACCEPTED_BY_POSITION,
)

# --------------------------------------------------------------------------------------
# Goodput tap metrics (labels: model, slo_class [, outcome | usage_source | buckets on the histograms])
# --------------------------------------------------------------------------------------
TAP_LABELS = (LABEL_MODEL, LABEL_SLO_CLASS)
TAP_HISTOGRAM_LABELS = TAP_LABELS + (LABEL_BUCKETS,)
TAP_TTFT = _m("tap_time_to_first_token_seconds", "histogram", "Client-observed time to first content token.", TAP_HISTOGRAM_LABELS, "seconds")
TAP_TPOT = _m("tap_time_per_output_token_seconds", "histogram", "Client-observed time per output token after the first.", TAP_HISTOGRAM_LABELS, "seconds")
TAP_E2E = _m("tap_e2e_request_latency_seconds", "histogram", "Client-observed end-to-end latency.", TAP_HISTOGRAM_LABELS, "seconds")
TAP_TTFB = _m("tap_time_to_first_byte_seconds", "histogram", "Time to the first response byte from upstream.", TAP_HISTOGRAM_LABELS, "seconds")
TAP_REQUESTS = _m("tap_requests_total", "counter", "Requests seen by the tap, by outcome.", TAP_LABELS + (LABEL_OUTCOME,))
GOODPUT_REQUESTS = _m(
    "goodput_requests_total", "counter", "Requests delivered within both the TTFT and the TPOT objective.", TAP_LABELS
)
OUTPUT_TOKENS = _m("output_tokens_total", "counter", "Output tokens delivered.", TAP_LABELS + (LABEL_USAGE_SOURCE,))
GOODPUT_TOKENS = _m(
    "goodput_tokens_total", "counter", "Output tokens of requests within both the TTFT and TPOT objective.",
    TAP_LABELS + (LABEL_USAGE_SOURCE,),
)
# The tap's self-metrics: what it refused or ignored to protect itself and the signal.
TAP_USAGE_REJECTED = _m(
    "tap_usage_rejected_total", "counter",
    "Engine-reported usage.completion_tokens ignored as implausible (over max_tokens or the stream's size); "
    "the output events were counted instead.", TAP_LABELS,
)
TAP_REFUSALS = _m("tap_refusals_total", "counter", "Connections and requests the tap refused itself, by reason.", (LABEL_REASON,))
# Shown while it happens, not only when the request ends: requests in flight now whose objective is
# already lost (no first token past the TTFT objective, or the TPOT pace lost), computed at scrape time.
TAP_IN_FLIGHT_LATE = _m(
    "tap_requests_in_flight_late", "gauge",
    "Requests in flight now whose objective is already lost: no first token past the TTFT objective, a late "
    "first token, or a stream slower than the TPOT objective so far.", TAP_LABELS,
)
# Which SLO files the tap runs on now (it reloads them when they change, exporter/tap/reload.py): the
# hash of their contents, as slogen computes it for the rules (HEALTH.TAP_CONFIG_DRIFT compares the two).
TAP_CONFIG_INFO = _m(
    "tap_config_info", "gauge",
    "The SLO configuration the tap runs on: always 1, with the content hash of its SLO files.", (LABEL_CONFIG_HASH,),
)
TAP_CONFIG_RELOAD_FAILURES = _m(
    "tap_config_reload_failures_total", "counter",
    "Changed SLO files the tap could not use (unreadable or invalid); it kept the configuration it had.",
)
# A trusted gateway's x-slo-* headers not taken as they came (exporter/tap/objectives.py; class_cap: kept, class folded)
SLO_HEADER_REASONS = ("too_long", "malformed", "out_of_range", "repeated", "unknown_class", "class_cap")
TAP_SLO_HEADERS_IGNORED = _m("tap_slo_headers_ignored_total", "counter", "x-slo-* request headers ignored, by reason.", (LABEL_REASON,))
TAP_METRICS = (
    TAP_TTFT, TAP_TPOT, TAP_E2E, TAP_TTFB, TAP_REQUESTS, GOODPUT_REQUESTS, OUTPUT_TOKENS, GOODPUT_TOKENS,
    TAP_USAGE_REJECTED, TAP_REFUSALS, TAP_IN_FLIGHT_LATE, TAP_CONFIG_INFO, TAP_CONFIG_RELOAD_FAILURES,
    TAP_SLO_HEADERS_IGNORED,
)
# OpenTelemetry GenAI (gen_ai_*) names, labels, bucket edges (tap --genai-names, gateway SLI source): llmslo/genai.py;
# the gateways' own names as SLI sources (llm-d's llm_d_epp_*, Dynamo's dynamo_frontend_*): llmslo/gateways.py

# --------------------------------------------------------------------------------------
# GPU metrics (NVML collector; labels: GPU_IDENTITY_LABELS [+ MIG labels])
# --------------------------------------------------------------------------------------
GPU_MEMORY_TOTAL = _m("gpu_memory_total_bytes", "gauge", "HBM (framebuffer) total.", unit="bytes")
GPU_MEMORY_USED = _m("gpu_memory_used_bytes", "gauge", "HBM used.", unit="bytes")
GPU_MEMORY_FREE = _m("gpu_memory_free_bytes", "gauge", "HBM free.", unit="bytes")
GPU_MEMORY_RESERVED = _m("gpu_memory_reserved_bytes", "gauge", "HBM reserved by the driver and firmware.", unit="bytes")
GPU_UTILIZATION = _m("gpu_utilization_ratio", "gauge", "Fraction of time a kernel ran on the GPU (0..1).", unit="ratio")
GPU_MEMORY_UTILIZATION = _m(
    "gpu_memory_bandwidth_utilization_ratio", "gauge", "Fraction of time device memory was read or written (0..1).", unit="ratio"
)
GPU_POWER = _m("gpu_power_watts", "gauge", "Power draw.", unit="watts")
GPU_ENERGY = _m("gpu_energy_joules_total", "counter", "Energy consumed since the driver loaded.", unit="joules")
GPU_TEMPERATURE = _m("gpu_temperature_celsius", "gauge", "GPU core temperature.", unit="celsius")
GPU_SM_CLOCK = _m("gpu_sm_clock_hertz", "gauge", "SM clock.", unit="hertz")
GPU_MEMORY_CLOCK = _m("gpu_memory_clock_hertz", "gauge", "Memory clock.", unit="hertz")
GPU_CLOCK_EVENT = _m(
    "gpu_clock_event_active", "gauge", "1 while a clock-event (throttle) reason is active.", (LABEL_CLOCK_EVENT,)
)
GPU_ECC_ERRORS = _m("gpu_ecc_errors_total", "counter", "ECC errors since the driver loaded.", (LABEL_ECC_TYPE,))
GPU_XID_ERRORS = _m("gpu_xid_errors_total", "counter", "XID errors seen by the exporter.", (LABEL_XID,))
GPU_PCIE_REPLAYS = _m("gpu_pcie_replays_total", "counter", "PCIe replay events.")
GPU_PROCESS_MEMORY = _m("gpu_process_memory_used_bytes", "gauge", "HBM used per process, where NVML reports it.", (LABEL_PID,), "bytes")
GPU_UP = _m("gpu_up", "gauge", "1 when the GPU answered NVML in the last cycle, 0 when it is lost.")
GPU_METRICS = (
    GPU_MEMORY_TOTAL, GPU_MEMORY_USED, GPU_MEMORY_FREE, GPU_MEMORY_RESERVED, GPU_UTILIZATION, GPU_MEMORY_UTILIZATION,
    GPU_POWER, GPU_ENERGY, GPU_TEMPERATURE, GPU_SM_CLOCK, GPU_MEMORY_CLOCK, GPU_CLOCK_EVENT, GPU_ECC_ERRORS,
    GPU_XID_ERRORS, GPU_PCIE_REPLAYS, GPU_PROCESS_MEMORY, GPU_UP,
)

# --------------------------------------------------------------------------------------
# Exporter self-metrics
# --------------------------------------------------------------------------------------
EXPORTER_TARGET_UP = _m("exporter_target_up", "gauge", "1 when the target's last scrape succeeded.", (LABEL_TARGET, LABEL_ENGINE))
EXPORTER_SCRAPE_DURATION = _m(
    "exporter_target_scrape_duration_seconds", "gauge", "Duration of the target's last scrape.", (LABEL_TARGET, LABEL_ENGINE), "seconds"
)
EXPORTER_LAST_ERROR = _m(
    "exporter_target_last_error", "gauge", "1 with the reason of the target's last failed scrape.", (LABEL_TARGET, LABEL_ENGINE, LABEL_REASON)
)
EXPORTER_PARSE_ERRORS = _m("exporter_parse_errors_total", "counter", "Exposition lines that could not be parsed.", (LABEL_TARGET,))
EXPORTER_SERIES_DROPPED = _m(
    "exporter_series_dropped_total", "counter", "Series dropped by the cardinality guard.", (LABEL_TARGET, LABEL_REASON)
)
EXPORTER_SAMPLES_DROPPED = _m(
    "exporter_samples_dropped_total", "counter",
    "Samples of a page no adapter saw: NaN or Inf values, repeated series, a family's samples over its limit.",
    (LABEL_TARGET, LABEL_REASON),
)
EXPORTER_CYCLE_DURATION = _m("exporter_collection_duration_seconds", "gauge", "Duration of the last collection cycle.", unit="seconds")
EXPORTER_CYCLES = _m("exporter_collection_cycles_total", "counter", "Collection cycles completed.")
EXPORTER_LAST_CYCLE = _m("exporter_last_collection_timestamp_seconds", "gauge", "When the last cycle completed.", unit="seconds")
# Kubernetes discovery (exporter/discovery.py); present only when discovery is on.
EXPORTER_DISCOVERY_REJECTED = _m(
    "exporter_discovery_rejected_total", "counter",
    "Discovered targets refused (a pod's annotations or status failed a check), counted at every listing that finds them.",
    (LABEL_REASON,),
)
EXPORTER_DISCOVERY_ABANDONED = _m(
    "exporter_discovery_listings_abandoned_total", "counter",
    "Pod listings given up (a bound was hit or the API server failed); the last good target list stays in use.",
    (LABEL_REASON,),
)
EXPORTER_DISCOVERY_LAST_SUCCESS = _m(
    "exporter_discovery_last_success_timestamp_seconds", "gauge",
    "When the last complete pod listing finished (0: none yet); the target list in use is from then.", unit="seconds",
)
# GPU-to-pod mapping (exporter/gpu/podresources.py); present only while GPUs are read and the mapping is on.
EXPORTER_GPU_POD_MAPPING_UP = _m(
    "exporter_gpu_pod_mapping_up", "gauge",
    "1 when the last kubelet pod-resources listing succeeded; 0: GPU series carry empty pod, namespace and container.",
)
EXPORTER_GPU_POD_MAPPED_DEVICES = _m(
    "exporter_gpu_pod_mapped_devices", "gauge", "NVIDIA devices (GPUs and MIG instances) the last listing found allocated to a container.",
)
# The node's pool (exporter --node-pool); present only on a GPU-reading exporter told its pool. HEALTH.POOL_* join it to
# the GPU series' holders on LABEL_HOSTNAME (and LABEL_CLUSTER where the rules run over several clusters).
EXPORTER_NODE_POOL_INFO = _m(
    "exporter_node_pool_info", "gauge",
    "Always 1: the node pool of the node this exporter reads the GPUs of (--node-pool); absent when not told.",
    (LABEL_HOSTNAME, LABEL_NODE_POOL),
)
# The exporter's identity and process, named as every Prometheus exporter names them (no llm_ prefix).
BUILD_INFO = MetricDef(
    "llmslo_build_info", "gauge", "Always 1; the labels name the llmslo version and the Python that runs it.",
    (LABEL_VERSION, LABEL_PYTHON_VERSION, LABEL_PYTHON_IMPLEMENTATION),
)
PROCESS_CPU = MetricDef("process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", unit="seconds")
PROCESS_RESIDENT_MEMORY = MetricDef("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", unit="bytes")
PROCESS_VIRTUAL_MEMORY = MetricDef("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", unit="bytes")
PROCESS_START_TIME = MetricDef(
    "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.", unit="seconds"
)
PROCESS_OPEN_FDS = MetricDef("process_open_fds", "gauge", "Number of open file descriptors.")
PROCESS_MAX_FDS = MetricDef("process_max_fds", "gauge", "Maximum number of open file descriptors.")
PROCESS_METRICS = (
    PROCESS_CPU, PROCESS_RESIDENT_MEMORY, PROCESS_VIRTUAL_MEMORY, PROCESS_START_TIME, PROCESS_OPEN_FDS, PROCESS_MAX_FDS,
)
EXPORTER_METRICS = (
    EXPORTER_TARGET_UP, EXPORTER_SCRAPE_DURATION, EXPORTER_LAST_ERROR, EXPORTER_PARSE_ERRORS, EXPORTER_SERIES_DROPPED,
    EXPORTER_SAMPLES_DROPPED, EXPORTER_CYCLE_DURATION, EXPORTER_CYCLES, EXPORTER_LAST_CYCLE,
    EXPORTER_DISCOVERY_REJECTED, EXPORTER_DISCOVERY_ABANDONED, EXPORTER_DISCOVERY_LAST_SUCCESS,
    EXPORTER_GPU_POD_MAPPING_UP, EXPORTER_GPU_POD_MAPPED_DEVICES, EXPORTER_NODE_POOL_INFO, BUILD_INFO, *PROCESS_METRICS,
)

# --------------------------------------------------------------------------------------
# The goodput tap's KV admission gate (exporter.tap.admission; on with --admission only)
# --------------------------------------------------------------------------------------
TAP_ADMISSION_OPEN = _m("tap_admission_open", "gauge", "1 while the tap's KV admission admits new requests, 0 while it refuses them with 429.")
TAP_ADMISSION_ENGINE_READABLE = _m(
    "tap_admission_engine_readable", "gauge",
    "1 while the tap reads the engine's /metrics for admission; 0: it cannot, and the gate admits (fails open).",
)
TAP_ADMISSION_SEATS = _m("tap_admission_seats", "gauge", "More p99-sized requests the free KV cache takes, net of what the requests in flight will still take, at the last reading.")
TAP_ADMISSION_FOOTPRINT = _m(
    "tap_admission_footprint_tokens", "gauge", "The p99 request size seats are counted in (exact from the tap's own requests, else the engine's histograms, else the fallback), less the prompt share the prefix cache serves, in whole KV blocks.", unit="tokens",
)
TAP_ADMISSION_QUEUE = _m("tap_admission_queue", "gauge", "Requests the engine had waiting at the last reading.")
TAP_ADMISSION_PREDICTED_WAIT = _m(
    "tap_admission_predicted_wait_seconds", "gauge",
    "Predicted seconds until the engine starts a request arriving now (0: at once; +Inf: blocked, nothing finishing).",
    unit="seconds",
)
TAP_ADMISSION_ENGINE_ITL = _m(
    "tap_admission_engine_itl_seconds", "gauge",
    "The engine's mean inter-token latency over the admission gate's rate window (NaN: no token generated).",
    unit="seconds",
)
# Why a poll of the engine's page was not taken as a reading (LABEL_REASON of TAP_ADMISSION_READ_ERRORS): on any,
# the gate fails open at once (a page that lies must not close it, nor open it on a full engine).
ADMISSION_READ_UNREACHABLE = "unreachable"  # refused, timed out, an HTTP error, over the size cap
ADMISSION_READ_NOT_ENGINE = "not_engine_page"  # no engine's families, or none with KV blocks and their size
ADMISSION_READ_NON_FINITE = "non_finite"  # NaN or an infinity where a count or a ratio belongs
ADMISSION_READ_OUT_OF_RANGE = "out_of_range"  # negative counts, usage outside [0, 1], a block size under 1
ADMISSION_READ_INCONSISTENT = "inconsistent"  # more free blocks than blocks, engines without their own cache config
ADMISSION_READ_BAD_HISTOGRAM = "bad_histogram"  # request-size buckets not cumulative: the last footprint is kept
ADMISSION_READ_REASONS = (
    ADMISSION_READ_UNREACHABLE, ADMISSION_READ_NOT_ENGINE, ADMISSION_READ_NON_FINITE, ADMISSION_READ_OUT_OF_RANGE,
    ADMISSION_READ_INCONSISTENT, ADMISSION_READ_BAD_HISTOGRAM,
)
TAP_ADMISSION_READ_ERRORS = _m(
    "tap_admission_engine_read_errors_total", "counter",
    "Polls of the engine's /metrics not taken as a reading, by reason (the gate fails open; bad_histogram: the "
    "reading is taken, its request sizes are not).", (LABEL_REASON,),
)
TAP_ADMISSION_METRICS = (
    TAP_ADMISSION_OPEN, TAP_ADMISSION_ENGINE_READABLE, TAP_ADMISSION_SEATS, TAP_ADMISSION_FOOTPRINT, TAP_ADMISSION_QUEUE,
    TAP_ADMISSION_PREDICTED_WAIT, TAP_ADMISSION_ENGINE_ITL,
    TAP_ADMISSION_READ_ERRORS,
)

# --------------------------------------------------------------------------------------
# The tap injector (`llmslo-exporter tap-injector`, a mutating admission webhook; exporter/tap_inject)
# --------------------------------------------------------------------------------------
TAP_INJECTOR_INJECTED = _m("tap_injector_injected_total", "counter", "Pods the webhook added the goodput tap to.")
TAP_INJECTOR_SKIPPED = _m(
    "tap_injector_skipped_total", "counter",
    "AdmissionReviews answered with the pod unchanged, by reason (exporter/tap_inject/pod.py: SKIP_REASONS).",
    (LABEL_REASON,),
)
TAP_INJECTOR_ERRORS = _m(
    "tap_injector_errors_total", "counter",
    "Requests the webhook could not answer as a review (bad HTTP or JSON, too large, a timeout) or failed on "
    "(internal: answered allowed, unchanged), by reason.",
    (LABEL_REASON,),
)
TAP_INJECTOR_METRICS = (TAP_INJECTOR_INJECTED, TAP_INJECTOR_SKIPPED, TAP_INJECTOR_ERRORS)
# The errors that mean the API server's reviews go unanswered (a pod then starts without the tap: failurePolicy
# Ignore): a TLS handshake the API server refuses (a caBundle that is not the serving certificate's CA), the
# webhook's own failure, a read that timed out, connections past its cap. The others are a caller's malformed
# request (HTTP, JSON, size), which the API server never sends.
TAP_INJECTOR_FAILURE_REASONS = ("internal", "timeout", "tls", "overloaded")

ALL_METRICS = (
    ENGINE_METRICS + TAP_METRICS + TAP_ADMISSION_METRICS + GPU_METRICS + EXPORTER_METRICS + TAP_INJECTOR_METRICS
)

# --------------------------------------------------------------------------------------
# SLO rule names (Sloth-compatible, so existing Sloth dashboards keep working)
# --------------------------------------------------------------------------------------
def _per_window(template: str) -> Callable[[str], str]:
    """The name of a per-window rule for a window ("5m"), from its `{window}` template."""
    return lambda window: template.format(window=window)


class SLO:
    SLI_ERROR_RATIO = "slo:sli_error:ratio_rate{window}"  # format with window="5m"
    OBJECTIVE = "slo:objective:ratio"
    ERROR_BUDGET = "slo:error_budget:ratio"
    TIME_PERIOD_DAYS = "slo:time_period:days"
    CURRENT_BURN_RATE = "slo:current_burn_rate:ratio"
    PERIOD_BURN_RATE = "slo:period_burn_rate:ratio"
    PERIOD_ERROR_BUDGET_REMAINING = "slo:period_error_budget_remaining:ratio"
    INFO = "sloth_slo_info"
    # slogen's traffic-weighted extension: event rates on short windows, long windows derived from them.
    SLI_ERRORS_RATE = "slo:sli_errors:rate{window}"
    # the short window's ratio where it had traffic (0/0 dropped): the held short condition of a page tier
    SLI_ERROR_MEASURED = "slo:sli_error_measured:ratio_rate{window}"
    # ... and when it was last measured (the evaluation's time): how long the hold has lasted
    SLI_ERROR_MEASURED_AT = "slo:sli_error_measured:timestamp{window}"
    # ... and the verdict a page tier's short condition reads: the last measured ratio, while the silence lasts
    SLI_ERROR_HELD = "slo:sli_error_held:ratio_rate{window}"
    SLI_TOTAL_RATE = "slo:sli_total:rate{window}"
    # llmslo/kv-headroom's per-engine sample: 1 while KV-cache usage is above the SLO's threshold, else 0.
    KV_SATURATED = "slo:kv_cache_saturated:bool"

    LABEL_ID = "sloth_id"
    LABEL_SERVICE = "sloth_service"
    LABEL_SLO = "sloth_slo"
    LABEL_WINDOW = "sloth_window"
    LABEL_MODE = "sloth_mode"
    LABEL_SPEC = "sloth_spec"
    LABEL_VERSION = "sloth_version"
    LABEL_OBJECTIVE = "sloth_objective"
    LABEL_SEVERITY = "sloth_severity"
    # Alert labels (kube-prometheus style).
    LABEL_ALERT_SEVERITY = "severity"
    LABEL_TIER = "slo_tier"
    LABEL_LONG_WINDOW = "long_window"
    LABEL_SHORT_WINDOW = "short_window"

    # Labels the generator owns; user labels may not overwrite them.
    RESERVED_LABELS = (
        LABEL_ID, LABEL_SERVICE, LABEL_SLO, LABEL_WINDOW, LABEL_MODE, LABEL_SPEC, LABEL_VERSION, LABEL_OBJECTIVE,
        LABEL_SEVERITY, LABEL_TIER, LABEL_LONG_WINDOW, LABEL_SHORT_WINDOW,
    )

    # The per-window rule names, e.g. sli_error_ratio("5m") == "slo:sli_error:ratio_rate5m".
    sli_error_ratio = staticmethod(_per_window(SLI_ERROR_RATIO))
    sli_errors_rate = staticmethod(_per_window(SLI_ERRORS_RATE))
    sli_error_measured = staticmethod(_per_window(SLI_ERROR_MEASURED))
    sli_error_measured_at = staticmethod(_per_window(SLI_ERROR_MEASURED_AT))
    sli_error_held = staticmethod(_per_window(SLI_ERROR_HELD))
    sli_total_rate = staticmethod(_per_window(SLI_TOTAL_RATE))


# --------------------------------------------------------------------------------------
# Capacity and health alerts slogen generates next to the SLO rules (slogen/rules/health.py)
# --------------------------------------------------------------------------------------
class HEALTH:
    GROUP = "llmslo-health"  # rule group name, and the stem of its rule, test and PrometheusRule files
    GPU_LOST = "LLMGpuLost"
    GPU_XID_ERRORS = "LLMGpuXidErrors"
    GPU_ECC_UNCORRECTED = "LLMGpuEccUncorrectedErrors"
    ENGINE_TARGET_DOWN = "LLMEngineTargetDown"
    KV_CACHE_SATURATED = "LLMKVCacheSaturated"
    PREEMPTION_STORM = "LLMPreemptionStorm"
    ENGINE_REFUSING_REQUESTS = "LLMEngineRefusingRequests"  # llm_requests_rejected_total for ENGINE_REFUSAL_REASONS
    TAP_REFUSING_REQUESTS = "LLMTapRefusingRequests"
    TAP_CONFIG_DRIFT = "LLMTapConfigDrift"  # a tap's TAP_CONFIG_INFO hash is not the one the rules were built from
    # Inference-pool isolation (slogen/rules/isolation.py; on when llmslo.yaml declares `isolation:`): a GPU on a node
    # of the inference pool held by a pod outside the serving namespaces/workloads (page), and a serving pod's GPU on
    # a node of another pool (ticket). Not in ALERTS: they exist only in a build that declares the pool.
    POOL_FOREIGN_POD = "LLMInferencePoolForeignPod"
    POOL_SERVING_OFF_POOL = "LLMServingPodOffPool"
    # the two above cannot fire: no exporter says it is on the pool, or a pool node's GPU-to-pod mapping is down
    POOL_UNWATCHED = "LLMInferencePoolUnwatched"
    ISOLATION_ALERTS = (POOL_FOREIGN_POD, POOL_SERVING_OFF_POOL, POOL_UNWATCHED)
    # The tap injector (only in a build whose llmslo.yaml has tapInjector: true): no injector scraped, or its reviews
    # failing (TAP_INJECTOR_FAILURE_REASONS): new pods start without the tap, their goodput unmeasured.
    TAP_INJECTOR_FAILING = "LLMTapInjectorFailing"
    ALERTS = (GPU_LOST, GPU_XID_ERRORS, GPU_ECC_UNCORRECTED, ENGINE_TARGET_DOWN, KV_CACHE_SATURATED, PREEMPTION_STORM,
              ENGINE_REFUSING_REQUESTS, TAP_REFUSING_REQUESTS, TAP_CONFIG_DRIFT)
    ECC_UNCORRECTED = "uncorrected"  # the LABEL_ECC_TYPE value the ECC alert selects


# --------------------------------------------------------------------------------------
# Prometheus built-ins that dashboards and runbooks query
# --------------------------------------------------------------------------------------
PROM_ALERTS = "ALERTS"  # one series per pending/firing alert, carrying the alert's labels
LABEL_ALERTNAME = "alertname"
LABEL_ALERTSTATE = "alertstate"  # pending | firing
ALERTSTATE_FIRING = "firing"


def by_name() -> dict[str, MetricDef]:
    """Every normalized family by its name, for checks that an emitted or queried name is defined here."""
    return {m.name: m for m in ALL_METRICS}


# --------------------------------------------------------------------------------------
# Capacity: KV seats and time to exhaustion (slogen/rules/capacity.py, docs/metrics.md "KV seats")
# --------------------------------------------------------------------------------------
class CAPACITY:
    GROUP = "llmslo-capacity"  # rule group name, and the stem of its rule, test and PrometheusRule files
    # One engine replica (the series' identity: node too, so two static targets of one model on two nodes stay
    # two) and one pool (the replicas of one model in one namespace/cluster).
    ENGINE_LABELS = (LABEL_CLUSTER, LABEL_NAMESPACE, LABEL_POD, LABEL_NODE, LABEL_MODEL, LABEL_ENGINE)
    POOL_LABELS = (LABEL_CLUSTER, LABEL_NAMESPACE, LABEL_MODEL)
    # Recorded series (level:metric:operations). Per engine:
    FREE_TOKENS = "llm:kv_cache_free_tokens"  # free blocks x block size
    # What the engine's requests will still take (an approximation from its page, docs/capacity.md): running x the
    # p50 output, plus waiting x the p50 request; absent for an engine without request-size histograms
    COMMITTED_TOKENS = "llm:kv_cache_committed_tokens"
    FREE_TOKENS_NET = "llm:kv_cache_free_tokens:net_of_committed"  # free - committed (free where none is recorded)
    FOOTPRINT_P99 = "llm:request_tokens:p99"  # p99 prompt tokens + p99 output tokens (over the footprint window)
    FOOTPRINT_P50 = "llm:request_tokens:p50"
    SEATS_P99 = "llm:kv_seats:p99"  # net free tokens / p99 footprint: more requests of p99 size that fit and can grow
    SEATS_P50 = "llm:kv_seats:p50"
    # Per pool (sum over its engines that have seats):
    POOL_SEATS_P99 = "llm:kv_seats_pool:p99"
    POOL_SEATS_P50 = "llm:kv_seats_pool:p50"
    POOL_WAITING = "llm:requests_waiting_pool"  # sum of llm_requests_waiting over the pool's engines
    POOL_FREE_TOKENS = "llm:kv_cache_free_tokens_pool"  # sum of the pool's engines' free KV tokens (histograms or not)
    POOL_FREE_TOKENS_NET = "llm:kv_cache_free_tokens_pool:net_of_committed"  # sum of the engines' FREE_TOKENS_NET
    # Minutes until the pool's net free KV tokens reach 0 at the trend of the trend window (the page's forecast, and
    # what dashboards plot); absent unless they are falling, 0 once out while still falling.
    POOL_FREE_TOKENS_MINUTES_TO_EXHAUSTION = "llm:kv_cache_free_tokens_pool:minutes_to_exhaustion"
    SEATS_LOW = "LLMKVSeatsLow"  # ticket: the pool stays under N seats at p99 context
    # page: net free tokens run out within M minutes at their trend, or have run out (under one p99 seat) while the queue grows
    SEATS_EXHAUSTION = "LLMKVSeatsExhaustion"
    ALERTS = (SEATS_LOW, SEATS_EXHAUSTION)
