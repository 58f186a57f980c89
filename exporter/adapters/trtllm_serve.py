"""TensorRT-LLM's own OpenAI server, `trtllm-serve` (metrics at /prometheus/metrics).

Names are vLLM-like with a `trtllm_` prefix and `{model_name, engine_type}` labels. Its
`time_per_output_token_seconds` is observed once per request (count = requests), so it is TPOT;
there is no per-token ITL. Prefix reuse is counted in blocks (reused, missed), turned into tokens
with the block size so it matches the normalized token counters: hits = reused x tokens per block,
queries = (reused + missed) x tokens per block. `_created` companions are ignored.

Finished reasons (tensorrt_llm/executor/result.py): `stop`, `length`, `cancelled` (abort), `timeout`
(the executor's TIMED_OUT: an `error`, never a success), and `not_finished`, which a disaggregated
context-only (prefill) server writes when it hands a request to its decode server: that prefill
completed as asked, so it is `completed`. Any other reason is an `error` (base.normalize_finished_reason).

trtllm-serve runs prometheus_client in multiprocess mode: gauges carry a `pid` label, which is summed
away. Releases before the served model name reached the labels wrote `model_name="undefined"`: such a
page's model is the identity's.

Prefix-cache hits are exact when the page has `trtllm_prompt_cached_tokens_total` (prompt tokens served
from the KV cache, counted per finished request next to `trtllm_prompt_tokens_total`): hits are that,
queries the prompt tokens. Without it (older releases, or a counter that stays 0 while blocks are
reused, i.e. an engine that does not report cached tokens), the block estimate above is used.
`trtllm_request_error_total{http_code}` counts requests refused with an HTTP error: each is
`llm_requests_rejected_total{reason="http_<code>"}`. A client's own 4xx (a malformed request is 400) is
the client's fault, never the engine's failure: it stays there only. 429 and 5xx (the server out of
capacity, or failing) are also an `error` in llm_requests_finished_total, since the request never got an
answer; so is a code that is not a number (fail-safe). `trtllm_num_paused_requests` is the paused count.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.adapters.base import Adapter, Output, normalize_finished_reason, total, values
from exporter.model import MetricFamily, NormSample
from llmslo import conventions as c

KIND = c.ENGINE_TRTLLM_SERVE
P = "trtllm_"
MODEL = "model_name"

RUNNING = P + "num_requests_running"
WAITING = P + "num_requests_waiting"
KV_UTILIZATION = P + "kv_cache_utilization"
KV_MAX_BLOCKS = P + "kv_cache_max_blocks"
KV_FREE_BLOCKS = P + "kv_cache_free_blocks"
KV_USED_BLOCKS = P + "kv_cache_used_blocks"
KV_TOKENS_PER_BLOCK = P + "kv_cache_tokens_per_block"
KV_REUSED_BLOCKS = P + "kv_cache_reused_blocks"
KV_MISSED_BLOCKS = P + "kv_cache_missed_blocks"
PROMPT_TOKENS = P + "prompt_tokens"
GENERATION_TOKENS = P + "generation_tokens"
REQUEST_SUCCESS = P + "request_success"
FINISHED_REASON = "finished_reason"
# trtllm-serve's own reasons beyond the shared spellings (base._FINISHED_ALIASES knows stop, length, cancelled, timeout).
FINISHED_ALIASES = {"not_finished": c.FINISHED_COMPLETED}
UNDEFINED_MODEL = "undefined"  # MetricsCollector({"model_name": "undefined", ...}) in older openai_server.py
TTFT = P + "time_to_first_token_seconds"
TPOT = P + "time_per_output_token_seconds"
E2E = P + "e2e_request_latency_seconds"
QUEUE_TIME = P + "request_queue_time_seconds"
PROMPT_CACHED_TOKENS = P + "prompt_cached_tokens"  # counter family (samples end in _total)
REQUEST_ERRORS = P + "request_error"  # counter family; label http_code
HTTP_CODE = "http_code"
PAUSED = P + "num_paused_requests"

WANTED = frozenset({
    RUNNING, WAITING, KV_UTILIZATION, KV_MAX_BLOCKS, KV_FREE_BLOCKS, KV_USED_BLOCKS, KV_TOKENS_PER_BLOCK,
    KV_REUSED_BLOCKS, KV_MISSED_BLOCKS, PROMPT_TOKENS, GENERATION_TOKENS, REQUEST_SUCCESS, TTFT, TPOT, E2E,
    QUEUE_TIME, PROMPT_CACHED_TOKENS, REQUEST_ERRORS, PAUSED,
})


def _model(labels: Mapping[str, str]) -> str | None:
    """The page's model name; None (so the identity's is used) when absent or the placeholder `undefined`."""
    name = labels.get(MODEL)
    return None if name == UNDEFINED_MODEL else name


def _client_fault(code: str) -> bool:
    """A client's own 4xx; anything else (429, 5xx, an empty or unreadable code) counts as the engine's."""
    try:
        return c.http_status_is_client_fault(int(code.strip()))
    except ValueError:
        return False


def _reason(code: str) -> str:
    """`http_<code>` for an HTTP status (100-599); `http` without a code, conventions.OTHER for any other text: the
    page writes the label, and a reason is a label value of ours (bounded: at most 500 statuses, not any text)."""
    if not code:
        return "http"
    return f"http_{code}" if len(code) == 3 and code.isdigit() and 100 <= int(code) <= 599 else c.OTHER


def _models(families: Mapping[str, MetricFamily]) -> list[str | None]:
    seen = {_model(s.labels): None for name in WANTED for s in values(families.get(name))}
    return list(seen) or [None]


def adapt(families: Mapping[str, MetricFamily], identity: Mapping[str, str]) -> list[NormSample]:
    out = Output(identity, KIND)
    for fam_name, metric in (
        (RUNNING, c.REQUESTS_RUNNING), (WAITING, c.REQUESTS_WAITING), (KV_MAX_BLOCKS, c.KV_BLOCKS_TOTAL),
        (KV_FREE_BLOCKS, c.KV_BLOCKS_FREE), (PROMPT_TOKENS, c.PROMPT_TOKENS), (GENERATION_TOKENS, c.GENERATION_TOKENS),
        (PAUSED, c.REQUESTS_PAUSED),
    ):
        for s in values(families.get(fam_name)):
            out.add(metric, s.value, _model(s.labels))

    for s in values(families.get(REQUEST_SUCCESS)):
        reason = normalize_finished_reason(s.labels.get(FINISHED_REASON, ""), FINISHED_ALIASES)
        out.add(c.REQUESTS_FINISHED, s.value, _model(s.labels), {c.LABEL_REASON: reason})
    for s in values(families.get(REQUEST_ERRORS)):
        code = s.labels.get(HTTP_CODE, "")
        out.add(c.REQUESTS_REJECTED, s.value, _model(s.labels), {c.LABEL_REASON: _reason(code)})
        if not _client_fault(code):
            out.add(c.REQUESTS_FINISHED, s.value, _model(s.labels), {c.LABEL_REASON: c.FINISHED_ERROR})

    for model in _models(families):
        def of_model(labels: dict[str, str], model: str | None = model) -> bool:
            return _model(labels) == model

        block_size = total(families.get(KV_TOKENS_PER_BLOCK), of_model)
        out.put(c.KV_BLOCK_SIZE, block_size, model)
        used, max_blocks = total(families.get(KV_USED_BLOCKS), of_model), total(families.get(KV_MAX_BLOCKS), of_model)
        if used is not None and max_blocks:
            out.put(c.KV_CACHE_USAGE, used / max_blocks, model)
        else:
            out.put(c.KV_CACHE_USAGE, total(families.get(KV_UTILIZATION), of_model), model)

        reused = total(families.get(KV_REUSED_BLOCKS), of_model)
        missed = total(families.get(KV_MISSED_BLOCKS), of_model)
        cached = total(families.get(PROMPT_CACHED_TOKENS), of_model)
        prompt = total(families.get(PROMPT_TOKENS), of_model)
        if cached is not None and prompt is not None and (cached > 0 or not reused):
            out.put(c.PREFIX_CACHE_HITS, cached, model)  # exact: tokens, per finished request
            out.put(c.PREFIX_CACHE_QUERIES, prompt, model)
        elif block_size and reused is not None and missed is not None:
            out.put(c.PREFIX_CACHE_HITS, reused * block_size, model)
            out.put(c.PREFIX_CACHE_QUERIES, (reused + missed) * block_size, model)

    for metric, fam_name in ((c.TTFT, TTFT), (c.TPOT, TPOT), (c.E2E, E2E), (c.QUEUE_TIME, QUEUE_TIME)):
        out.histogram(metric, families.get(fam_name), model_of=_model)
    return out.samples()


ADAPTER = Adapter(KIND, WANTED, adapt, detect_prefixes=(P,))
