"""TensorRT-LLM behind Triton Inference Server (the tensorrtllm_backend's inflight batcher).

Triton puts the state in a label: one gauge family holds max/free/used/tokens_per/fraction KV
blocks, another active/scheduled/waiting requests. Its units are not base units: request and queue
durations are cumulative microsecond counters, the first-response histogram is in milliseconds.
Both are converted to seconds, bucket edges included. The microsecond counters become the `_sum`
of a histogram whose `_count` is the success count and whose only bucket is +Inf: the mean is
exact, quantiles are not available (Triton has no buckets for them).

Request-level `nv_inference_*` metrics exist for every Triton model (ensemble, pre/postprocessing,
the TRT-LLM model); only the model(s) the `nv_trt_llm_*` gauges report on are read, so an ensemble
request is not counted three times. The `model` label is that Triton model's name.

Two things clients see come from other Triton models. The first response of the model they call (the
`ensemble`, or `tensorrt_llm_bls`: any model whose name contains `ensemble` or `bls`) is their TTFT,
pre- and postprocessing included: llm_frontend_time_to_first_token_seconds, labelled with that model.
And Triton queues a request before the backend sees it: the TRT-LLM model's
`nv_inference_pending_request_count` is added to the batcher's waiting requests (the two are disjoint:
a request leaves Triton's pending count when the backend starts executing it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from exporter.adapters.base import Adapter, Output, values
from exporter.model import MetricFamily, NormSample
from llmslo import conventions as c

KIND = c.ENGINE_TRTLLM_TRITON
MODEL = "model"
MS = 1_000.0
US = 1_000_000.0

REQUEST_METRICS = "nv_trt_llm_request_metrics"
REQUEST_TYPE = "request_type"  # active | max | scheduled | context | waiting (= active - scheduled)
KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
KV_BLOCK_TYPE = "kv_cache_block_type"  # max | free | used | tokens_per | reused | fraction (= used / max)
SUCCESS = "nv_inference_request_success"
FAILURE = "nv_inference_request_failure"
FAILURE_REASON = "reason"  # REJECTED | CANCELED | BACKEND | OTHER (absent in older Tritons)
REQUEST_DURATION_US = "nv_inference_request_duration_us"
QUEUE_DURATION_US = "nv_inference_queue_duration_us"
FIRST_RESPONSE_MS = "nv_inference_first_response_histogram_ms"
INPUT_TOKEN_LEN = "nv_llm_input_token_len"  # per request, label response_metric_type="total_input_tokens"
OUTPUT_TOKEN_LEN = "nv_llm_output_token_len"  # per request, response_metric_type="total_output_tokens"
PENDING = "nv_inference_pending_request_count"  # Triton core: requests awaiting execution, per model
BATCHER = "nv_trt_llm_inflight_batcher_metrics"
BATCHER_METRIC = "inflight_batcher_specific_metric"  # total_context_tokens | generation_requests | ... | paused_requests
FAILURE_REJECTED = "REJECTED"  # Triton refused the request (queue policy, rate limits)
FRONTEND_MARKERS = ("ensemble", "bls")  # names of the models clients call in tensorrtllm_backend's layouts

WANTED = frozenset({
    REQUEST_METRICS, KV_BLOCKS, SUCCESS, FAILURE, REQUEST_DURATION_US, QUEUE_DURATION_US, FIRST_RESPONSE_MS,
    INPUT_TOKEN_LEN, OUTPUT_TOKEN_LEN, PENDING, BATCHER,
})


def _is_frontend(model: str) -> bool:
    name = model.lower()
    return any(marker in name for marker in FRONTEND_MARKERS)


def _states(fam: MetricFamily | None, state_label: str, model: str) -> dict[str, float]:
    """A state-in-label gauge as {state: value} for one model (summed over model versions)."""
    states: dict[str, float] = {}
    for s in values(fam):
        if s.labels.get(MODEL) == model:
            state = s.labels.get(state_label, "")
            states[state] = states.get(state, 0.0) + s.value
    return states


def _sum_of(fam: MetricFamily | None, model: str, divisor: float = 1.0) -> float | None:
    """A model's total from a counter, or from a histogram's `_sum`, in base units."""
    if fam is None:
        return None
    picked = [s.value for s in fam.samples
              if s.labels.get(MODEL) == model and s.name[len(fam.name):] in ("", "_total", "_sum")]
    return sum(picked) / divisor if picked else None


def _duration_histogram(out: Output, metric: c.MetricDef, model: str, seconds: float | None,
                        successes: float | None) -> None:
    if seconds is None or successes is None:
        return
    out.histogram_part(metric, model, bucket=(float("inf"), successes), sum=seconds, count=successes)


def adapt(families: Mapping[str, MetricFamily], identity: Mapping[str, str]) -> list[NormSample]:
    out = Output(identity, KIND)
    engine_models = list(dict.fromkeys(
        s.labels[MODEL] for name in (REQUEST_METRICS, KV_BLOCKS) for s in values(families.get(name)) if MODEL in s.labels
    ))

    for model in engine_models:
        requests = _states(families.get(REQUEST_METRICS), REQUEST_TYPE, model)
        out.put(c.REQUESTS_RUNNING, requests.get("scheduled"), model)
        waiting = requests.get("waiting")
        if waiting is None and "active" in requests and "scheduled" in requests:
            waiting = requests["active"] - requests["scheduled"]
        pending = _sum_of(families.get(PENDING), model)
        if waiting is not None or pending is not None:
            out.put(c.REQUESTS_WAITING, (waiting or 0.0) + (pending or 0.0), model)
        out.put(c.REQUESTS_PAUSED, _states(families.get(BATCHER), BATCHER_METRIC, model).get("paused_requests"), model)

        blocks = _states(families.get(KV_BLOCKS), KV_BLOCK_TYPE, model)
        out.put(c.KV_BLOCKS_TOTAL, blocks.get("max"), model)
        out.put(c.KV_BLOCKS_FREE, blocks.get("free"), model)
        out.put(c.KV_BLOCK_SIZE, blocks.get("tokens_per"), model)
        if blocks.get("max") and "used" in blocks:
            out.put(c.KV_CACHE_USAGE, blocks["used"] / blocks["max"], model)  # what `fraction` is defined as
        else:
            out.put(c.KV_CACHE_USAGE, blocks.get("fraction"), model)

        successes = _sum_of(families.get(SUCCESS), model)
        out.put(c.REQUESTS_FINISHED, successes, model, {c.LABEL_REASON: c.FINISHED_COMPLETED})
        for s in values(families.get(FAILURE)):
            if s.labels.get(MODEL) == model:
                reason = c.FINISHED_ABORT if s.labels.get(FAILURE_REASON) == "CANCELED" else c.FINISHED_ERROR
                out.add(c.REQUESTS_FINISHED, s.value, model, {c.LABEL_REASON: reason})
                if s.labels.get(FAILURE_REASON) == FAILURE_REJECTED:
                    out.add(c.REQUESTS_REJECTED, s.value, model, {c.LABEL_REASON: FAILURE_REJECTED})

        out.put(c.PROMPT_TOKENS, _sum_of(families.get(INPUT_TOKEN_LEN), model), model)
        out.put(c.GENERATION_TOKENS, _sum_of(families.get(OUTPUT_TOKEN_LEN), model), model)

        out.histogram(c.TTFT, families.get(FIRST_RESPONSE_MS), divisor=MS, model_label=MODEL,
                      where=_of_model(model))
        for metric, fam_name in ((c.REQUEST_PROMPT_TOKENS, INPUT_TOKEN_LEN),
                                 (c.REQUEST_GENERATION_TOKENS, OUTPUT_TOKEN_LEN)):
            out.histogram(metric, families.get(fam_name), model_label=MODEL,
                          where=_of_model(model))
        _duration_histogram(out, c.E2E, model, _sum_of(families.get(REQUEST_DURATION_US), model, US), successes)
        _duration_histogram(out, c.QUEUE_TIME, model, _sum_of(families.get(QUEUE_DURATION_US), model, US), successes)
    if engine_models:  # a page of this engine: the models clients call in front of it
        first = families.get(FIRST_RESPONSE_MS)
        frontends = {s.labels[MODEL] for s in (first.samples if first else ()) if MODEL in s.labels}
        for model in sorted(m for m in frontends if _is_frontend(m) and m not in engine_models):
            out.histogram(c.FRONTEND_TTFT, first, divisor=MS, model_label=MODEL,
                          where=_of_model(model))
    return out.samples()


# Recognized by its TRT-LLM backend gauges, not by `nv_inference_*`, which every Triton model has.
ADAPTER = Adapter(KIND, WANTED, adapt, detect_prefixes=("nv_trt_llm_",))


def _of_model(model: str | None) -> Callable[[dict[str, str]], bool]:
    """Selects the series of one model (a function of its own, so that each model's closure keeps its own)."""
    return lambda labels: labels.get(MODEL) == model
