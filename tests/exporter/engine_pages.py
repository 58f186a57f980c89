"""Engine pages built with prometheus_client the way each engine's newest source declares its metrics.

Names, types, label sets and multiprocess conventions are copied from the upstream files named on each
builder (read for issue #14); the values are whatever a test needs. A page is the text the engine would
serve, so tests run it through the real parser and adapter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def text(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def observe_all(hist, values: Iterable[float]) -> None:
    for v in values:
        hist.observe(v)


# ------------------------------------------------------------------------------------------
# SGLang 0.5.23: sglang/srt/observability/metrics_collector.py
# ------------------------------------------------------------------------------------------
def sglang_scheduler_labels(priority: bool, dp_rank: int | None = None) -> dict[str, str]:
    """SchedulerMetricsCollector.init_new: model_name, engine_type, ranks, priority="" with priority scheduling."""
    labels = {"model_name": LLAMA, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
    if priority:
        labels["priority"] = ""
    if dp_rank is not None:
        labels["dp_rank"] = str(dp_rank)
    return labels


def sglang_page(*, priority: bool = True, running: Mapping[str, int] | None = None,
                queued: Mapping[str, int] | None = None, grammar_queue: int = 0,
                retracted_total: float | None = None, retracted_gauge: float = 0,
                paused: float | None = None, pools: Mapping[str, tuple[int, int, int]] | None = None,
                max_total_num_tokens: int | None = None, max_total_num_tokens_swa: int | None = None,
                page_size: int | None = None, ttft_by_priority: Mapping[str, list[float]] | None = None,
                prompt_lengths: Mapping[str, list[int]] | None = None,
                generation_lengths: Mapping[str, list[int]] | None = None) -> str:
    """A scheduler + tokenizer page. `running`/`queued` map a priority ("" = the total) to a count, as
    _log_gauge_queue_count writes them; `pools` maps kv|swa|mamba to (used, available, evictable) tokens."""
    reg = CollectorRegistry()
    base = sglang_scheduler_labels(priority)
    names = list(base)
    if running is not None:
        g = Gauge("sglang:num_running_reqs", "The number of running requests.", names, registry=reg,
                  multiprocess_mode="mostrecent")
        for prio, value in running.items():
            g.labels(**{**base, **({"priority": prio} if priority else {})}).set(value)
    if queued is not None:
        g = Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", names, registry=reg,
                  multiprocess_mode="mostrecent")
        for prio, value in queued.items():
            g.labels(**{**base, **({"priority": prio} if priority else {})}).set(value)
        Gauge("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue.", names,
              registry=reg, multiprocess_mode="mostrecent").labels(**base).set(grammar_queue)
    # Retract: the old gauge has no multiprocess mode (so a `pid` label in SGLang's multiprocess output).
    Gauge("sglang:num_retracted_reqs", "The number of retracted requests.", names + ["pid"],
          registry=reg).labels(**base, pid="4242").set(retracted_gauge)
    if retracted_total is not None:
        Counter("sglang:num_retracted_requests_total", "Total number of retracted requests.", names,
                registry=reg).labels(**base).inc(retracted_total)
    if paused is not None:
        Gauge("sglang:num_paused_reqs", "The number of paused requests by async weight sync.", names + ["pid"],
              registry=reg).labels(**base, pid="4242").set(paused)
    if pools:
        prefixes = {"kv": "kv", "swa": "swa", "mamba": "mamba"}
        for pool, (used, available, evictable) in pools.items():
            p = prefixes[pool]
            for suffix, value in (("used", used), ("available", available), ("evictable", evictable)):
                Gauge(f"sglang:{p}_{suffix}_tokens", f"{pool} {suffix} tokens", names, registry=reg,
                      multiprocess_mode="mostrecent").labels(**base).set(value)
        usages = {pool: used / (used + available + evictable) for pool, (used, available, evictable) in pools.items()
                  if used + available + evictable}
        for name, pool in (("full_token_usage", "kv"), ("swa_token_usage", "swa"), ("mamba_usage", "mamba")):
            Gauge(f"sglang:{name}", name, names, registry=reg, multiprocess_mode="mostrecent").labels(
                **base).set(usages.get(pool, 0.0))
        Gauge("sglang:token_usage", "The token usage.", names, registry=reg, multiprocess_mode="mostrecent").labels(
            **base).set(round(max(usages.values() or [0.0]), 2))
    if max_total_num_tokens is not None:
        Gauge("sglang:max_total_num_tokens", "max", names, registry=reg, multiprocess_mode="mostrecent").labels(
            **base).set(max_total_num_tokens)
    if max_total_num_tokens_swa is not None:
        Gauge("sglang:max_total_num_tokens_swa", "max swa", names, registry=reg,
              multiprocess_mode="mostrecent").labels(**base).set(max_total_num_tokens_swa)
    if page_size is not None:
        Gauge("sglang:page_size", "page size", names, registry=reg, multiprocess_mode="mostrecent").labels(
            **base).set(page_size)

    # Tokenizer metrics: labels model_name, engine_type, priority (filled per request), is_streaming where declared.
    tok = {"model_name": LLAMA, "engine_type": "unified", **({"priority": ""} if priority else {})}
    if ttft_by_priority:
        h = Histogram("sglang:time_to_first_token_seconds", "ttft", list(tok) + ["is_streaming"], registry=reg,
                      buckets=[0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0])
        for prio, observed in ttft_by_priority.items():
            observe_all(h.labels(**{**tok, **({"priority": prio} if priority else {})}, is_streaming="true"), observed)
    for name, lengths in (("sglang:prompt_tokens_histogram", prompt_lengths),
                          ("sglang:generation_tokens_histogram", generation_lengths)):
        if lengths:
            h = Histogram(name, "length", list(tok), registry=reg,
                          buckets=[100, 300, 500, 1000, 1500, 2000, 3000, 4000, 5000, 6000])
            for prio, observed in lengths.items():
                observe_all(h.labels(**{**tok, **({"priority": prio} if priority else {})}), observed)
    return text(reg)


# ------------------------------------------------------------------------------------------
# TGI (router v3): router/src/{server,validation}.rs, router/src/infer/mod.rs, backends/v3/src/*.rs
# ------------------------------------------------------------------------------------------
def tgi_page(failures: Mapping[str, int], successes: int = 10, *, batch_max_total_tokens: float | None = None,
             batch_current_max_tokens: float | None = None, input_lengths: list[int] | None = None,
             generated: list[int] | None = None, max_input_tokens: int = 4095, max_total_tokens: int = 4096) -> str:
    """metrics-exporter-prometheus layout: counters without `_total`, no HELP for undescribed ones."""
    lines = ["# TYPE tgi_request_success counter", f"tgi_request_success {successes}", ""]
    if failures:
        lines.append("# TYPE tgi_request_failure counter")
        lines += [f'tgi_request_failure{{err="{err}"}} {n}' for err, n in failures.items()]
        lines.append("")
    for name, value in (("tgi_batch_max_total_tokens", batch_max_total_tokens),
                        ("tgi_batch_current_max_tokens", batch_current_max_tokens)):
        if value is not None:
            lines += [f"# TYPE {name} gauge", f"{name} {value}", ""]
    for name, observed, top in (("tgi_request_input_length", input_lengths, max_input_tokens),
                                ("tgi_request_generated_tokens", generated, max_total_tokens)):
        if observed is None:
            continue
        edges = [top / 100.0 * (k + 1) for k in range(100)]  # server.rs: max/100 x (k+1)
        lines.append(f"# TYPE {name} histogram")
        for edge in edges:
            lines.append(f'{name}_bucket{{le="{edge}"}} {sum(1 for v in observed if v <= edge)}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {len(observed)}')
        lines += [f"{name}_sum {float(sum(observed))}", f"{name}_count {len(observed)}", ""]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# trtllm-serve: tensorrt_llm/metrics/collector.py, tensorrt_llm/serve/openai_server.py (multiprocess mode)
# ------------------------------------------------------------------------------------------
def trtllm_serve_page(reasons: Mapping[str, int], *, model_name: str = LLAMA, paused: float | None = None,
                      errors: Mapping[str, int] | None = None, prompt_tokens: float | None = None,
                      cached_tokens: float | None = None, reused_blocks: float | None = None,
                      missed_blocks: float | None = None, tokens_per_block: float | None = None) -> str:
    """MetricsCollector({"model_name": <served name>, "engine_type": <backend>}); gauges carry `pid`
    (multiprocess mode "all"), counters do not."""
    reg = CollectorRegistry()
    labels = {"model_name": model_name, "engine_type": "pytorch"}
    names = list(labels)
    success = Counter("trtllm_request_success_total", "Count of successfully processed requests.",
                      names + ["finished_reason"], registry=reg)
    for reason, n in reasons.items():
        success.labels(**labels, finished_reason=reason).inc(n)
    if paused is not None:
        Gauge("trtllm_num_paused_requests", "Number of paused requests", names + ["pid"], registry=reg).labels(
            **labels, pid="77").set(paused)
    if errors:
        err = Counter("trtllm_request_error_total", "Total request errors, labeled by HTTP status code.",
                      names + ["http_code"], registry=reg)
        for code, n in errors.items():
            err.labels(**labels, http_code=code).inc(n)
    if prompt_tokens is not None:
        Counter("trtllm_prompt_tokens_total", "Cumulative number of prompt (input) tokens processed.", names,
                registry=reg).labels(**labels).inc(prompt_tokens)
    if cached_tokens is not None:
        Counter("trtllm_prompt_cached_tokens_total", "Process-lifetime total prompt tokens served from KV cache.",
                names, registry=reg).labels(**labels).inc(cached_tokens)
    for name, value in (("trtllm_kv_cache_reused_blocks", reused_blocks),
                        ("trtllm_kv_cache_missed_blocks", missed_blocks)):
        if value is not None:
            Counter(name, name, names, registry=reg).labels(**labels).inc(value)
    if tokens_per_block is not None:
        Gauge("trtllm_kv_cache_tokens_per_block", "Number of tokens per KV cache block", names + ["pid"],
              registry=reg).labels(**labels, pid="77").set(tokens_per_block)
    return text(reg)


# ------------------------------------------------------------------------------------------
# vLLM 0.33: vllm/v1/metrics/loggers.py
# ------------------------------------------------------------------------------------------
def vllm_page(*, reasons: Mapping[str, int] | None = None, sleep: tuple[int, int] | None = None,
              engines: Iterable[int] = (0,), rejections: Mapping[str, int] | None = None,
              usage: float | None = None, num_gpu_blocks: int = 1000, block_size: int = 16,
              prompt_lengths: list[int] | None = None, generation_lengths: list[int] | None = None,
              max_model_len: int = 4096) -> str:
    """`sleep` is record_sleep_state(sleep, level) applied to every engine index."""
    reg = CollectorRegistry()
    engines = list(engines)
    names = ["model_name", "engine"]
    if reasons:
        c = Counter("vllm:request_success", "Count of successfully processed requests.", names + ["finished_reason"],
                    registry=reg)
        for reason, n in reasons.items():
            c.labels(LLAMA, str(engines[0]), reason).inc(n)
    if sleep is not None:
        g = Gauge("vllm:engine_sleep_state", "Engine sleep state", names + ["sleep_state"], registry=reg,
                  multiprocess_mode="mostrecent")
        is_asleep, level = sleep
        state = {"awake": 0 if is_asleep else 1, "weights_offloaded": int(is_asleep == 1 and level == 1),
                 "discard_all": int(is_asleep == 1 and level == 2)}
        for idx in engines:
            for name, value in state.items():
                g.labels(engine=idx, model_name=LLAMA, sleep_state=name).set(value)
    if rejections is not None:
        c = Counter("vllm:admission_rejections", "Number of admission attempts rejected by a queue limit, by reason.",
                    ["model_name", "reason"], registry=reg)
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            c.labels(model_name=LLAMA, reason=reason).inc(rejections.get(reason, 0))
    if usage is not None:
        g = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", names, registry=reg,
                  multiprocess_mode="mostrecent")
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                     ["block_size", "num_gpu_blocks", "engine"], registry=reg, multiprocess_mode="mostrecent")
        for idx in engines:
            g.labels(LLAMA, str(idx)).set(usage)
            info.labels(block_size=str(block_size), num_gpu_blocks=str(num_gpu_blocks), engine=str(idx)).set(1)
        Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", names, registry=reg,
              multiprocess_mode="mostrecent").labels(LLAMA, str(engines[0])).set(0)
    buckets = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, max_model_len]  # build_1_2_5_buckets(4096)
    for name, observed in (("vllm:request_prompt_tokens", prompt_lengths),
                           ("vllm:request_generation_tokens", generation_lengths)):
        if observed is not None:
            h = Histogram(name, "Number of tokens processed.", names, buckets=buckets, registry=reg)
            observe_all(h.labels(LLAMA, str(engines[0])), observed)
    return text(reg)


# ------------------------------------------------------------------------------------------
# Triton + TensorRT-LLM backend: custom_metrics_reporter.cc, triton core src/metrics.cc (prometheus-cpp layout)
# ------------------------------------------------------------------------------------------
def triton_page(*, engine_model: str = "tensorrt_llm", frontends: Mapping[str, list[float]] | None = None,
                engine_ttft_ms: list[float] | None = None, pending: Mapping[str, int] | None = None,
                waiting: int = 1, scheduled: int = 3, paused: int = 0,
                failures: Mapping[str, Mapping[str, int]] | None = None,
                input_lengths: list[int] | None = None, output_lengths: list[int] | None = None) -> str:
    """`frontends` maps a client-facing model (ensemble, BLS) to its first-response times in ms."""
    lines = ["# HELP nv_trt_llm_request_metrics TRT LLM request metrics", "# TYPE nv_trt_llm_request_metrics gauge"]
    for rtype, value in (("active", waiting + scheduled), ("max", 256), ("scheduled", scheduled), ("context", 1),
                         ("waiting", waiting)):
        lines.append(f'nv_trt_llm_request_metrics{{model="{engine_model}",request_type="{rtype}",version="1"}} {value}')
    lines += ["# HELP nv_trt_llm_inflight_batcher_metrics TRT LLM inflight_batcher-specific metrics",
              "# TYPE nv_trt_llm_inflight_batcher_metrics gauge"]
    for metric, value in (("total_context_tokens", 612), ("generation_requests", 2), ("micro_batch_id", 0),
                          ("paused_requests", paused)):
        lines.append(f'nv_trt_llm_inflight_batcher_metrics{{inflight_batcher_specific_metric="{metric}",'
                     f'model="{engine_model}",version="1"}} {value}')

    def histogram(name: str, model: str, observed: list[float], edges: list[float], extra: str = "") -> list[str]:
        out = [f'{name}_count{{{extra}model="{model}",version="1"}} {len(observed)}',
               f'{name}_sum{{{extra}model="{model}",version="1"}} {float(sum(observed))}']
        for edge in edges:
            out.append(f'{name}_bucket{{{extra}model="{model}",version="1",le="{edge:g}"}} '
                       f'{sum(1 for v in observed if v <= edge)}')
        out.append(f'{name}_bucket{{{extra}model="{model}",version="1",le="+Inf"}} {len(observed)}')
        return out

    token_edges = [10.0, 50.0, 100.0, 500.0, 1000.0]
    if output_lengths is not None:
        lines += ["# HELP nv_llm_output_token_len TRT LLM response metrics", "# TYPE nv_llm_output_token_len histogram"]
        lines += histogram("nv_llm_output_token_len", engine_model, output_lengths, token_edges,
                           'response_metric_type="total_output_tokens",')
    if input_lengths is not None:
        lines += ["# HELP nv_llm_input_token_len TRT LLM response metrics", "# TYPE nv_llm_input_token_len histogram"]
        lines += histogram("nv_llm_input_token_len", engine_model, input_lengths, token_edges,
                           'response_metric_type="total_input_tokens",')
    models = [*(frontends or {}), engine_model]
    if failures:
        lines += ["# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes",
                  "# TYPE nv_inference_request_failure counter"]
        for model, by_reason in failures.items():
            for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
                lines.append(f'nv_inference_request_failure{{model="{model}",reason="{reason}",version="1"}} '
                             f'{by_reason.get(reason, 0)}')
    if pending is not None:
        lines += ["# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting "
                  "execution per-model.", "# TYPE nv_inference_pending_request_count gauge"]
        for model in models:
            lines.append(f'nv_inference_pending_request_count{{model="{model}",version="1"}} {pending.get(model, 0)}')
    ttft = {**(frontends or {}), **({engine_model: engine_ttft_ms} if engine_ttft_ms is not None else {})}
    if ttft:
        lines += ["# HELP nv_inference_first_response_histogram_ms Duration from request to first response in "
                  "milliseconds", "# TYPE nv_inference_first_response_histogram_ms histogram"]
        for model, observed in ttft.items():
            lines += histogram("nv_inference_first_response_histogram_ms", model, observed, [100, 500, 2000, 5000])
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# llama.cpp's server (llama-server --metrics), llama.cpp 0c1e570 as vendored by llama-cpp-python 0.3.36:
# tools/server/server-task.cpp server_task_result_metrics::to_metrics(). Not prometheus_client: the server
# writes the text itself, HELP, TYPE and one unlabelled sample per family, counters first, then gauges,
# each value through a C++ stringstream (default precision: 6 significant digits, as printf's %g), then the
# per-position speculative counter when any draft was accepted.
# ------------------------------------------------------------------------------------------
LLAMACPP_COUNTERS = (  # (name after "llamacpp:", HELP), in the server's order
    ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "Total time spent processing prompts"),
    ("tokens_predicted_total", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "Total time spent generating tokens"),
    ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding"),
    ("n_tokens_max", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated"),
    ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the target model"),
    ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps"),
)
LLAMACPP_GAUGES = (
    ("prompt_tokens_seconds", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "Average generation throughput in tokens/s"),
    ("requests_processing", "Number of requests processing"),
    ("requests_deferred", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call"),
)


def cpp_double(value: float) -> str:
    """A double as `std::stringstream << double` writes it: %g with 6 significant digits."""
    return f"{float(value):g}"


def llamacpp_page(*, prompt_decoded: int = 0, prompt_cached: int | None = 0, predicted: int = 0,
                  processing: int = 0, deferred: int = 0, prompt_us: int = 0, predicted_us: int = 0,
                  n_decode: int = 0, n_busy_slots: int = 0, n_tokens_max: int = 0, prompt_rate: float = 0.0,
                  predicted_rate: float = 0.0, drafts: tuple[int, int, int] = (0, 0, 0),
                  accepted_per_pos: Iterable[int] = ()) -> str:
    """The page from the server's state (server_metrics and the two per-scrape counts); `prompt_cached=None`
    leaves out `prompt_tokens_cached_total`, as servers from before that counter write the page."""
    counters = {
        "prompt_tokens_total": prompt_decoded, "prompt_tokens_cached_total": prompt_cached,
        "prompt_seconds_total": prompt_us / 1e6, "tokens_predicted_total": predicted,
        "tokens_predicted_seconds_total": predicted_us / 1e6, "n_decode_total": n_decode,
        "n_tokens_max": n_tokens_max, "spec_decode_num_draft_tokens_total": drafts[0],
        "spec_decode_num_accepted_tokens_total": drafts[1], "spec_decode_num_drafts_total": drafts[2],
    }
    gauges = {
        "prompt_tokens_seconds": prompt_rate, "predicted_tokens_seconds": predicted_rate,
        "requests_processing": processing, "requests_deferred": deferred,
        "n_busy_slots_per_decode": n_busy_slots / max(n_decode, 1),
    }
    lines: list[str] = []
    for kind, items, values in (("counter", LLAMACPP_COUNTERS, counters), ("gauge", LLAMACPP_GAUGES, gauges)):
        for name, help_text in items:
            if values[name] is None:
                continue
            lines += [f"# HELP llamacpp:{name} {help_text}", f"# TYPE llamacpp:{name} {kind}",
                      f"llamacpp:{name} {cpp_double(values[name])}"]
    per_pos = list(accepted_per_pos)
    if per_pos:
        lines += ["# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position",
                  "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter"]
        lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {n}'
                  for i, n in enumerate(per_pos)]
    return "\n".join(lines) + "\n"
