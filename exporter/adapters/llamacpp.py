"""llama.cpp's server (`llama-server --metrics`, families prefixed `llamacpp:`).

Read from its source (tools/server/server-task.cpp `to_metrics`, server-context.cpp, server-common.h
`server_metrics`; llama.cpp 0c1e570): one unlabelled sample per family, no model label (the model comes from
the target's identity), no histogram, no KV-cache gauge, no request or finish-reason counter. What it has:

- `requests_processing`: slots processing a request, counted when the page is asked for: running.
- `requests_deferred`: requests that found no free slot and wait for one (the task queue's deferred list):
  waiting.
- `prompt_tokens_total`: prompt tokens *decoded*, "excluding cached tokens" (counted per decode batch, once
  the batch's compute is synchronized); `prompt_tokens_cached_total`: the prompt tokens a slot reused from
  its KV cache when it took the request (`n_past`; a fully cached prompt still decodes its last token). A
  request's prompt is their sum, so llm_prompt_tokens_total and llm_prefix_cache_queries_total are the sum
  (as vLLM's `prompt_tokens` counts cached tokens too) and llm_prefix_cache_hits_total is the cached count.
  A page without the cached counter (older servers) gives the decoded tokens alone and no prefix-cache
  series.
- `tokens_predicted_total`: generated tokens, added when a request's slot is released (finished or
  cancelled), not token by token: in-flight requests show only once they end.
- `spec_decode_num_drafts_total`, `_num_draft_tokens_total`, `_num_accepted_tokens_total` and
  `_num_accepted_tokens_per_pos_total{position}`: speculative decoding, as vLLM names it (llm_spec_decode_*).
  `requests_deferred` is also llm_requests_waiting_by_reason{reason="capacity"}: a slot is the capacity.

Not mapped, on purpose: `prompt_seconds_total` and `tokens_predicted_seconds_total` (busy time, no
per-request latency), `n_decode_total`, `n_busy_slots_per_decode`, `n_tokens_max` (a maximum typed as a
counter), and the two throughput gauges `prompt_tokens_seconds` and
`predicted_tokens_seconds`, which are averages since the previous scrape: every scrape of /metrics resets
them, so two scrapers each see a different window. TTFT, TPOT, E2E, request outcomes and goodput come from
the tap in front of the server (docs/metrics.md, llama.cpp).
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.adapters.base import Adapter, Output, position, total, values
from exporter.model import MetricFamily, NormSample
from llmslo import conventions as c

L = c.LLAMACPP
KIND = "llamacpp"

WANTED = frozenset({
    L.REQUESTS_PROCESSING, L.REQUESTS_DEFERRED, L.PROMPT_TOKENS, L.PROMPT_TOKENS_CACHED, L.TOKENS_PREDICTED,
    L.SPEC_DRAFTS, L.SPEC_DRAFT_TOKENS, L.SPEC_ACCEPTED_TOKENS, L.SPEC_ACCEPTED_PER_POS,
})
SPEC = ((c.SPEC_DRAFTS, L.SPEC_DRAFTS), (c.SPEC_DRAFT_TOKENS, L.SPEC_DRAFT_TOKENS),
        (c.SPEC_ACCEPTED_TOKENS, L.SPEC_ACCEPTED_TOKENS))


def adapt(families: Mapping[str, MetricFamily], identity: Mapping[str, str]) -> list[NormSample]:
    out = Output(identity, KIND)
    out.add(c.REQUESTS_RUNNING, total(families.get(L.REQUESTS_PROCESSING)))
    deferred = total(families.get(L.REQUESTS_DEFERRED))
    out.add(c.REQUESTS_WAITING, deferred)
    out.add(c.REQUESTS_WAITING_BY_REASON, deferred, extra={c.LABEL_REASON: c.WAITING_REASONS[0]})
    decoded = total(families.get(L.PROMPT_TOKENS))
    cached = total(families.get(L.PROMPT_TOKENS_CACHED))
    if cached is None:
        out.add(c.PROMPT_TOKENS, decoded)
    elif decoded is not None:
        out.add(c.PROMPT_TOKENS, decoded + cached)
        out.add(c.PREFIX_CACHE_QUERIES, decoded + cached)
        out.add(c.PREFIX_CACHE_HITS, cached)
    out.add(c.PROMPT_TOKENS_CACHED, cached)
    out.add(c.GENERATION_TOKENS, total(families.get(L.TOKENS_PREDICTED)))
    for metric, name in SPEC:
        out.add(metric, total(families.get(name)))
    for s in values(families.get(L.SPEC_ACCEPTED_PER_POS)):
        out.add(c.SPEC_ACCEPTED_BY_POSITION, s.value, extra={c.LABEL_POSITION: position(s.labels.get(c.LABEL_POSITION))})
    return out.samples()


ADAPTER = Adapter(KIND, WANTED, adapt, detect_prefixes=(L.PREFIX,))
