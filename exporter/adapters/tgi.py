"""Hugging Face TGI (text-generation-inference, router v3).

TGI's Rust exporter writes counters without `_total` and labels nothing with the model, so the
model comes from the target's identity. TGI has no time-to-first-token histogram and no
inter-token latency: none is invented. Nor does it report KV-cache blocks, preemptions, prefix-cache
or LoRA state. Prompt and generated token totals are the sums of its per-request length histograms.
Successes carry no finish reason (counted as `completed`). Failures carry `err`: `dropped` is a
client that went away (the router found its response channel closed) and is an `abort`. `validation`
and `template` are the client's own fault (the router answers 422: parameters out of range, a prompt over
`max_input_tokens`, a chat template that cannot render the messages): they are counted as refused, under
their own name, and never as an `error` or anywhere else in llm_requests_finished_total. `overloaded` (the
router's concurrent-request limit, answered 429) is refused too and stays an `error`: the engine was out of
capacity. Every other kind (`incomplete`, `generation`, or one added later) is an `error` (fail-safe).

TGI's only capacity signal is its batch token budget: `tgi_batch_max_total_tokens` (set at warmup) and
`tgi_batch_current_max_tokens`, the tokens the running batch has reserved (prompt plus max_new_tokens,
in advance). Per-request prompt and output lengths are histograms (`tgi_request_input_length`,
`tgi_request_generated_tokens`), re-emitted with their edges.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.adapters.base import Adapter, Output, total, values
from exporter.model import MetricFamily, NormSample
from llmslo import conventions as c

KIND = c.ENGINE_TGI

BATCH_SIZE = "tgi_batch_current_size"
QUEUE_SIZE = "tgi_queue_size"
REQUEST_SUCCESS = "tgi_request_success"
REQUEST_FAILURE = "tgi_request_failure"  # label `err`: validation, overloaded, template, incomplete, generation, dropped
FAILURE_KIND = "err"
ERR_DROPPED = "dropped"  # backends/v3 queue.rs and backend.rs: the client dropped the request
REFUSED_KINDS = frozenset({"overloaded", "validation", "template"})  # raised before the request is queued
CLIENT_FAULT_KINDS = frozenset({"validation", "template"})  # 422 from the router: the request was at fault
BATCH_MAX_TOTAL_TOKENS = "tgi_batch_max_total_tokens"  # backends/v3 lib.rs, set once at warmup
BATCH_CURRENT_MAX_TOKENS = "tgi_batch_current_max_tokens"  # backends/v3 backend.rs, per batch
REQUEST_DURATION = "tgi_request_duration"  # arrival to last token: E2E
MEAN_TIME_PER_TOKEN = "tgi_request_mean_time_per_token_duration"  # per request: TPOT
QUEUE_DURATION = "tgi_request_queue_duration"
INPUT_LENGTH = "tgi_request_input_length"
GENERATED_TOKENS = "tgi_request_generated_tokens"

WANTED = frozenset({
    BATCH_SIZE, QUEUE_SIZE, REQUEST_SUCCESS, REQUEST_FAILURE, REQUEST_DURATION, MEAN_TIME_PER_TOKEN,
    QUEUE_DURATION, INPUT_LENGTH, GENERATED_TOKENS, BATCH_MAX_TOTAL_TOKENS, BATCH_CURRENT_MAX_TOKENS,
})


def _histogram_sum(fam: MetricFamily | None) -> float | None:
    if fam is None:
        return None
    sums = [s.value for s in fam.samples if s.name == fam.name + "_sum"]
    return sum(sums) if sums else None


def adapt(families: Mapping[str, MetricFamily], identity: Mapping[str, str]) -> list[NormSample]:
    out = Output(identity, KIND)
    out.add(c.REQUESTS_RUNNING, total(families.get(BATCH_SIZE)))
    out.add(c.REQUESTS_WAITING, total(families.get(QUEUE_SIZE)))
    out.add(c.PROMPT_TOKENS, _histogram_sum(families.get(INPUT_LENGTH)))
    out.add(c.GENERATION_TOKENS, _histogram_sum(families.get(GENERATED_TOKENS)))
    out.add(c.REQUESTS_FINISHED, total(families.get(REQUEST_SUCCESS)), extra={c.LABEL_REASON: c.FINISHED_COMPLETED})
    failures = families.get(REQUEST_FAILURE)
    out.add(c.REQUESTS_FINISHED, total(failures, lambda labels: labels.get(FAILURE_KIND) == ERR_DROPPED),
            extra={c.LABEL_REASON: c.FINISHED_ABORT})
    if values(failures):  # 0 when every failure was the client's own: the series stays, with nothing bad in it
        out.add(c.REQUESTS_FINISHED,
                total(failures, lambda labels: labels.get(FAILURE_KIND) not in CLIENT_FAULT_KINDS | {ERR_DROPPED}) or 0.0,
                extra={c.LABEL_REASON: c.FINISHED_ERROR})
    for s in values(failures):
        kind = s.labels.get(FAILURE_KIND, "")
        if kind in REFUSED_KINDS:
            out.add(c.REQUESTS_REJECTED, s.value, extra={c.LABEL_REASON: kind})
    out.add(c.BATCH_MAX_TOKENS, total(families.get(BATCH_MAX_TOTAL_TOKENS)))
    out.add(c.BATCH_RESERVED_TOKENS, total(families.get(BATCH_CURRENT_MAX_TOKENS)))
    out.histogram(c.REQUEST_PROMPT_TOKENS, families.get(INPUT_LENGTH), model_label=None)
    out.histogram(c.REQUEST_GENERATION_TOKENS, families.get(GENERATED_TOKENS), model_label=None)
    out.histogram(c.E2E, families.get(REQUEST_DURATION), model_label=None)
    out.histogram(c.TPOT, families.get(MEAN_TIME_PER_TOKEN), model_label=None)
    out.histogram(c.QUEUE_TIME, families.get(QUEUE_DURATION), model_label=None)
    return out.samples()


ADAPTER = Adapter(KIND, WANTED, adapt, detect_prefixes=("tgi_",))
