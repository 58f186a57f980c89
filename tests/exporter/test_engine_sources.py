"""Adapters against pages built the way each engine's newest source writes them (issue #14).

The saved pages in ../shared predate some of these families and label sets (SGLang's priority label and
retraction counter, trtllm-serve's newer reasons and counters, vLLM 0.33's sleep and admission metrics),
so tests/exporter/engine_pages.py builds them with prometheus_client from the upstream declarations.
"""

from __future__ import annotations

import math

import pytest

from exporter import adapters
from exporter.adapters.base import normalize_finished_reason
from exporter.exposition import render
from exporter.model import NormSample
from exporter.promtext import parse_page
from llmslo import conventions as c
from tests.exporter import engine_pages as pages
from tests.helpers.samples import one, pick

IDENTITY = {"pod": "pod-a", "namespace": "llm", "node": "gpu-node-1", "model": "configured-model"}


def run(text: str, kind: str) -> list[NormSample]:
    adapter = adapters.get(kind)
    return adapter.adapt(parse_page(text, adapter.wanted).families, {**IDENTITY, "engine": kind})


def reasons(samples: list[NormSample]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in pick(samples, c.REQUESTS_FINISHED):
        out[s.labels[c.LABEL_REASON]] = out.get(s.labels[c.LABEL_REASON], 0.0) + s.value
    return out


# ------------------------------------------------------------------------------------------
# The fail-safe finished-reason mapping
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "normalized"), [
    ("stop", "stop"), ("LENGTH", "length"), ("abort", "abort"), ("error", "error"), ("repetition", "stop"),
    ("cancelled", "abort"), ("canceled", "abort"), ("timeout", "error"),
    # unknown, new, empty or placeholder reasons are failures, never successes
    ("something-new", "error"), ("", "error"), ("unknown", "error"), ("not_finished", "error"),
])
def test_finished_reasons_are_fail_safe(raw, normalized):
    assert normalize_finished_reason(raw) == normalized
    assert normalized in c.FINISHED_REASONS


def test_an_engines_own_spellings_extend_the_mapping_without_changing_others():
    extra = {"not_finished": c.FINISHED_COMPLETED}
    assert normalize_finished_reason("not_finished", extra) == "completed"
    assert normalize_finished_reason("stop", extra) == "stop"
    assert normalize_finished_reason("brand-new", extra) == "error"


def test_unknown_reasons_burn_the_availability_sli():
    """Every reason a page can carry ends in a bucket; the ones we do not know land in a bad one."""
    for raw in ("made_up", "timeout", "KILLED", " "):
        assert normalize_finished_reason(raw) in c.FINISHED_BAD_REASONS


# ------------------------------------------------------------------------------------------
# trtllm-serve: finished reasons from tensorrt_llm/executor/result.py
# ------------------------------------------------------------------------------------------
def test_trtllm_serve_timeout_and_unknown_reasons_are_errors_not_successes():
    text = pages.trtllm_serve_page({"stop": 50, "length": 7, "cancelled": 3, "timeout": 4, "not_finished": 6,
                                    "some_future_reason": 2})
    s = run(text, "trtllm-serve")
    assert reasons(s) == {"stop": 50, "length": 7, "abort": 3, "error": 4 + 2, "completed": 6}
    assert one(s, c.REQUESTS_FINISHED, reason="error", model=pages.LLAMA) == 6


def test_trtllm_serve_undefined_model_name_falls_back_to_the_identity():
    s = run(pages.trtllm_serve_page({"stop": 5}, model_name="undefined"), "trtllm-serve")
    assert {x.labels[c.LABEL_MODEL] for x in s} == {"configured-model"}
    assert one(s, c.REQUESTS_FINISHED, reason="stop") == 5


# ------------------------------------------------------------------------------------------
# vLLM: FinishReason (stop, length, abort, error, repetition); anything else is an error
# ------------------------------------------------------------------------------------------
def test_vllm_reasons_and_an_unknown_one():
    s = run(pages.vllm_page(reasons={"stop": 9, "length": 2, "abort": 1, "error": 1, "repetition": 3, "novel": 4}),
            "vllm")
    assert reasons(s) == {"stop": 12, "length": 2, "abort": 1, "error": 5}


# ------------------------------------------------------------------------------------------
# TGI: err="dropped" is a client that went away
# ------------------------------------------------------------------------------------------
def test_tgi_dropped_is_abort_the_clients_own_failures_nothing_and_every_other_failure_is_error():
    s = run(pages.tgi_page({"dropped": 4, "validation": 2, "overloaded": 1, "generation": 1, "incomplete": 1,
                            "template": 1, "brand_new": 3}), "tgi")
    # validation and template (422) are the client's own: refused, not finished badly
    assert reasons(s) == {"completed": 10, "abort": 4, "error": 1 + 1 + 1 + 3}


def test_tgi_without_dropped_requests_has_no_abort_series():
    s = run(pages.tgi_page({"generation": 2}), "tgi")
    assert reasons(s) == {"completed": 10, "error": 2}


# ------------------------------------------------------------------------------------------
# SGLang 0.5: priority scheduling, retractions
# ------------------------------------------------------------------------------------------
def test_sglang_priority_totals_are_read_once_not_summed_with_their_breakdown():
    text = pages.sglang_page(priority=True, running={"": 5, "0": 3, "1": 2}, queued={"": 4, "0": 1, "7": 3},
                             grammar_queue=1)
    assert 'priority=""' in text and 'priority="7"' in text
    s = run(text, "sglang")
    assert one(s, c.REQUESTS_RUNNING, model=pages.LLAMA) == 5  # not 10
    assert one(s, c.REQUESTS_WAITING, model=pages.LLAMA) == 4 + 1  # not 8 + 1: the grammar queue is separate
    assert all("priority" not in x.labels for x in s)


def test_sglang_without_priority_scheduling_reads_the_plain_gauges():
    s = run(pages.sglang_page(priority=False, running={"": 5}, queued={"": 4}), "sglang")
    assert one(s, c.REQUESTS_RUNNING) == 5 and one(s, c.REQUESTS_WAITING) == 4


def test_sglang_per_request_metrics_under_priorities_are_summed():
    """Tokenizer metrics are written once per request under its own priority: all of them count."""
    text = pages.sglang_page(priority=True, running={"": 0}, ttft_by_priority={"0": [0.05, 0.3], "1": [0.5, 3.0, 5.0]})
    s = run(text, "sglang")
    assert one(s, c.TTFT, "_count") == 5
    assert one(s, c.TTFT, "_sum") == pytest.approx(8.85)
    ttft = {float(x.labels["le"]): x.value for x in pick(s, c.TTFT, "_bucket")}
    assert ttft[0.1] == 1 and ttft[0.6] == 3 and ttft[4.0] == 4 and ttft[math.inf] == 5


def test_sglang_retractions_are_preemptions():
    s = run(pages.sglang_page(running={"": 1}, retracted_total=17, retracted_gauge=2), "sglang")
    assert one(s, c.PREEMPTIONS, model=pages.LLAMA) == 17  # the counter, not the point-in-time gauge


def test_sglang_without_the_retraction_counter_has_no_preemptions():
    s = run(pages.sglang_page(running={"": 1}, retracted_gauge=2), "sglang")
    assert pick(s, c.PREEMPTIONS) == []


# ------------------------------------------------------------------------------------------
# The output of these pages stays lint-clean
# ------------------------------------------------------------------------------------------
def test_output_of_the_built_pages_is_promtool_clean():
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    samples: list[NormSample] = []
    for text, kind in (
        (pages.sglang_page(priority=True, running={"": 5, "0": 5}, queued={"": 1}, retracted_total=3), "sglang"),
        (pages.tgi_page({"dropped": 1, "validation": 1}), "tgi"),
        (pages.trtllm_serve_page({"stop": 1, "timeout": 1}), "trtllm-serve"),
        (pages.vllm_page(reasons={"stop": 1}), "vllm"),
    ):
        samples += run(text, kind)
    proc = subprocess.run([promtool, "check", "metrics"], input=render(samples), capture_output=True, timeout=30)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


# ------------------------------------------------------------------------------------------
# Item 2: signals on-call needs
# ------------------------------------------------------------------------------------------
def buckets(samples: list[NormSample], metric: c.MetricDef, **labels: str) -> dict[float, float]:
    return {float(s.labels["le"]): s.value for s in pick(samples, metric, "_bucket", **labels)}


@pytest.mark.parametrize(("sleep", "sleeping"), [((0, 0), 0.0), ((1, 1), 1.0), ((1, 2), 1.0), ((1, 0), 1.0)])
def test_vllm_sleep_state(sleep, sleeping):
    s = run(pages.vllm_page(sleep=sleep, usage=0.25, num_gpu_blocks=1000), "vllm")
    assert one(s, c.ENGINE_SLEEPING, model=pages.LLAMA) == sleeping
    assert one(s, c.KV_BLOCKS_TOTAL) == 999  # num_gpu_blocks less the null block
    # asleep: no seats, whatever the usage gauge last said; awake: usable x (1 - usage)
    assert one(s, c.KV_BLOCKS_FREE) == (0 if sleeping else round(999 * 0.75))


def test_vllm_sleep_is_per_data_parallel_engine():
    text = pages.vllm_page(sleep=(0, 0), usage=0.5, engines=(0, 1), num_gpu_blocks=100)
    # engine 1 goes to sleep on its own (its awake series flips to 0)
    text = text.replace('vllm:engine_sleep_state{engine="1",model_name="%s",sleep_state="awake"} 1.0' % pages.LLAMA,
                        'vllm:engine_sleep_state{engine="1",model_name="%s",sleep_state="awake"} 0.0' % pages.LLAMA)
    s = run(text, "vllm")
    assert one(s, c.ENGINE_SLEEPING) == 1
    assert one(s, c.KV_BLOCKS_TOTAL) == 198 and one(s, c.KV_BLOCKS_FREE) == round(99 * 0.5)  # only engine 0's seats


def test_vllm_without_a_sleep_gauge_says_nothing_about_sleep():
    s = run(pages.vllm_page(usage=0.25), "vllm")
    assert pick(s, c.ENGINE_SLEEPING) == [] and one(s, c.KV_BLOCKS_FREE) == round(999 * 0.75)


def test_vllm_admission_rejections_by_reason_are_also_errors():
    s = run(pages.vllm_page(reasons={"stop": 10, "error": 1}, rejections={"max_num_queued_reqs": 4,
                                                                            "max_num_queued_tokens": 2}), "vllm")
    rejected = {x.labels[c.LABEL_REASON]: x.value for x in pick(s, c.REQUESTS_REJECTED, model=pages.LLAMA)}
    assert rejected == {"max_num_queued_reqs": 4, "max_num_queued_tokens": 2}
    assert reasons(s) == {"stop": 10, "error": 1 + 4 + 2}


def test_vllm_per_request_token_histograms_keep_the_engines_edges():
    prompts, outputs = [3, 40, 700, 2500, 4096], [1, 15, 15, 600, 2000]
    s = run(pages.vllm_page(prompt_lengths=prompts, generation_lengths=outputs), "vllm")
    assert one(s, c.REQUEST_PROMPT_TOKENS, "_count") == 5 and one(s, c.REQUEST_PROMPT_TOKENS, "_sum") == sum(prompts)
    assert one(s, c.REQUEST_GENERATION_TOKENS, "_sum") == sum(outputs)
    b = buckets(s, c.REQUEST_PROMPT_TOKENS)
    assert b[5.0] == 1 and b[50.0] == 2 and b[1000.0] == 3 and b[4096.0] == 5 and b[math.inf] == 5
    assert buckets(s, c.REQUEST_GENERATION_TOKENS)[20.0] == 3


def test_sglang_paused_requests():
    s = run(pages.sglang_page(running={"": 1}, paused=3), "sglang")
    assert one(s, c.REQUESTS_PAUSED, model=pages.LLAMA) == 3


def test_sglang_hybrid_swa_full_pool_is_the_usage_ratio():
    # full-attention pool 20% used, SWA pool 95% used: the SWA pool runs out first
    text = pages.sglang_page(running={"": 1}, pools={"kv": (2000, 6000, 2000), "swa": (1900, 50, 50)},
                             max_total_num_tokens=10000, max_total_num_tokens_swa=2000, page_size=1)
    s = run(text, "sglang")
    assert one(s, c.KV_CACHE_USAGE, model=pages.LLAMA) == pytest.approx(0.95)  # not 0.2
    pools = {x.labels[c.LABEL_KV_POOL]: x.value for x in pick(s, c.KV_POOL_USAGE)}
    assert pools == pytest.approx({"full": 0.2, "swa": 0.95})
    assert one(s, c.KV_BLOCKS_FREE) == 8000  # free seats stay the full-attention pool's


def test_sglang_hybrid_mamba_pool():
    text = pages.sglang_page(running={"": 1}, pools={"kv": (500, 9000, 500), "mamba": (60, 4, 0)},
                             max_total_num_tokens=10000, page_size=16)
    s = run(text, "sglang")
    assert one(s, c.KV_CACHE_USAGE) == pytest.approx(60 / 64)
    assert {x.labels[c.LABEL_KV_POOL] for x in pick(s, c.KV_POOL_USAGE)} == {"full", "mamba"}


def test_sglang_non_hybrid_pages_have_one_pool_and_no_pool_series():
    """SGLang writes the swa/mamba gauges as 0 for every model: a pool of 0 tokens does not exist."""
    text = pages.sglang_page(running={"": 1}, pools={"kv": (2500, 7000, 500), "swa": (0, 0, 0), "mamba": (0, 0, 0)},
                             max_total_num_tokens=10000, page_size=1)
    s = run(text, "sglang")
    assert one(s, c.KV_CACHE_USAGE) == pytest.approx(0.25)
    assert pick(s, c.KV_POOL_USAGE) == []


def test_sglang_per_request_token_histograms_sum_priorities():
    text = pages.sglang_page(running={"": 0}, prompt_lengths={"0": [50, 400], "1": [2500]},
                             generation_lengths={"0": [10, 10], "1": [1200]})
    s = run(text, "sglang")
    assert one(s, c.REQUEST_PROMPT_TOKENS, "_count") == 3 and one(s, c.REQUEST_PROMPT_TOKENS, "_sum") == 2950
    assert buckets(s, c.REQUEST_PROMPT_TOKENS)[500.0] == 2
    assert one(s, c.REQUEST_GENERATION_TOKENS, "_sum") == 1220


def test_tgi_batch_token_budget_refusals_and_request_sizes():
    text = pages.tgi_page({"overloaded": 5, "validation": 2, "dropped": 1, "generation": 1},
                          batch_max_total_tokens=327680, batch_current_max_tokens=2881,
                          input_lengths=[100, 2000, 4000], generated=[41, 41, 4096])
    s = run(text, "tgi")
    assert one(s, c.BATCH_MAX_TOKENS, model="configured-model") == 327680
    assert one(s, c.BATCH_RESERVED_TOKENS) == 2881
    rejected = {x.labels[c.LABEL_REASON]: x.value for x in pick(s, c.REQUESTS_REJECTED)}
    assert rejected == {"overloaded": 5, "validation": 2}  # refused before queueing; not dropped or generation
    # overloaded (429) is the engine's, an error; validation (422) the client's own, never an error
    assert reasons(s) == {"completed": 10, "abort": 1, "error": 5 + 1}
    assert one(s, c.REQUEST_PROMPT_TOKENS, "_count") == 3 and one(s, c.REQUEST_PROMPT_TOKENS, "_sum") == 6100
    assert buckets(s, c.REQUEST_PROMPT_TOKENS)[4095 / 100 * 49] == 2  # edge max_input_tokens/100 x 49 = 2006.55
    assert one(s, c.REQUEST_GENERATION_TOKENS, "_sum") == 41 + 41 + 4096
    assert one(s, c.PROMPT_TOKENS) == 6100  # the totals are still the histograms' sums


def test_trtllm_serve_paused_and_refused_requests():
    s = run(pages.trtllm_serve_page({"stop": 8}, paused=2, errors={"400": 3, "503": 1}), "trtllm-serve")
    assert one(s, c.REQUESTS_PAUSED, model=pages.LLAMA) == 2
    rejected = {x.labels[c.LABEL_REASON]: x.value for x in pick(s, c.REQUESTS_REJECTED)}
    assert rejected == {"http_400": 3, "http_503": 1}
    assert reasons(s) == {"stop": 8, "error": 1}  # the 503 only: a client's own 400 is never the engine's failure


def test_a_clients_own_4xx_is_never_an_error_on_any_engine():
    """4xx but 429 is the client's fault: visible as refused, never in llm_requests_finished_total. 429, 5xx and a
    code that cannot be read are the engine's (fail-safe)."""
    errors = {"400": 3, "404": 2, "413": 1, "422": 4, "429": 5, "500": 6, "503": 7, "": 8, "abc": 9, "9999": 1,
              "600": 2}
    s = run(pages.trtllm_serve_page({"stop": 8}, errors=errors), "trtllm-serve")
    rejected = {x.labels[c.LABEL_REASON]: x.value for x in pick(s, c.REQUESTS_REJECTED)}
    # the page writes the code: anything but an HTTP status (100-599) is `other`, never a label value of its own
    assert rejected == {"http_400": 3, "http_404": 2, "http_413": 1, "http_422": 4, "http_429": 5, "http_500": 6,
                        "http_503": 7, "http": 8, c.OTHER: 9 + 1 + 2}
    assert reasons(s) == {"stop": 8, "error": 5 + 6 + 7 + 8 + 9 + 1 + 2}
    # TGI: validation and template failures (422) are the client's; overloaded (429) and the rest the engine's
    s = run(pages.tgi_page({"validation": 4, "template": 3}), "tgi")
    assert {x.labels[c.LABEL_REASON]: x.value for x in pick(s, c.REQUESTS_REJECTED)} == {"validation": 4, "template": 3}
    assert reasons(s) == {"completed": 10, "error": 0}
    s = run(pages.tgi_page({"validation": 4, "overloaded": 2, "incomplete": 1, "some_new_kind": 1}), "tgi")
    assert reasons(s) == {"completed": 10, "error": 2 + 1 + 1}
    assert [c.http_status_is_client_fault(code) for code in (399, 400, 404, 422, 429, 499, 500, 503)] == [
        False, True, True, True, False, True, False, False]


def test_trtllm_serve_exact_cached_prompt_tokens_win_over_the_block_estimate():
    text = pages.trtllm_serve_page({"stop": 8}, prompt_tokens=10_000, cached_tokens=3_310, reused_blocks=104,
                                   missed_blocks=209, tokens_per_block=32)
    s = run(text, "trtllm-serve")
    assert one(s, c.PREFIX_CACHE_HITS) == 3310 and one(s, c.PREFIX_CACHE_QUERIES) == 10_000  # not 104 x 32 = 3328


def test_trtllm_serve_falls_back_to_blocks_without_cached_token_counts():
    for cached in (None, 0):  # absent, or present but never counted while blocks were reused
        text = pages.trtllm_serve_page({"stop": 8}, prompt_tokens=10_000, cached_tokens=cached, reused_blocks=104,
                                       missed_blocks=209, tokens_per_block=32)
        s = run(text, "trtllm-serve")
        assert one(s, c.PREFIX_CACHE_HITS) == 104 * 32 and one(s, c.PREFIX_CACHE_QUERIES) == (104 + 209) * 32


def test_trtllm_serve_no_reuse_at_all_is_an_exact_zero():
    s = run(pages.trtllm_serve_page({"stop": 8}, prompt_tokens=500, cached_tokens=0, reused_blocks=0, missed_blocks=16,
                                    tokens_per_block=32), "trtllm-serve")
    assert one(s, c.PREFIX_CACHE_HITS) == 0 and one(s, c.PREFIX_CACHE_QUERIES) == 500


def test_triton_frontend_ttft_pending_paused_refused_and_sizes():
    text = pages.triton_page(frontends={"ensemble": [80, 150, 600], "tensorrt_llm_bls": [90]},
                             engine_ttft_ms=[50, 120, 550, 70], pending={"tensorrt_llm": 6, "preprocessing": 9},
                             waiting=1, paused=2, failures={"tensorrt_llm": {"REJECTED": 3, "CANCELED": 1}},
                             input_lengths=[30, 700], output_lengths=[8, 80])
    s = run(text, "trtllm-triton")
    m = {"model": "tensorrt_llm"}
    assert one(s, c.REQUESTS_WAITING, **m) == 1 + 6  # batcher waiting + Triton's pending, not preprocessing's
    assert one(s, c.REQUESTS_PAUSED, **m) == 2
    assert {x.labels[c.LABEL_REASON]: x.value for x in pick(s, c.REQUESTS_REJECTED, **m)} == {"REJECTED": 3}
    assert one(s, c.REQUESTS_FINISHED, reason="error", **m) == 3 and one(s, c.REQUESTS_FINISHED, reason="abort") == 1
    # the engine's own TTFT stays the TRT-LLM model's; each front model gets its own, in seconds
    assert one(s, c.TTFT, "_count", **m) == 4
    assert one(s, c.FRONTEND_TTFT, "_count", model="ensemble") == 3
    assert one(s, c.FRONTEND_TTFT, "_sum", model="ensemble") == pytest.approx(0.83)
    assert buckets(s, c.FRONTEND_TTFT, model="ensemble") == {0.1: 1, 0.5: 2, 2.0: 3, 5.0: 3, math.inf: 3}
    assert one(s, c.FRONTEND_TTFT, "_count", model="tensorrt_llm_bls") == 1
    assert pick(s, c.FRONTEND_TTFT, "_count", model="tensorrt_llm") == []
    assert one(s, c.REQUEST_PROMPT_TOKENS, "_sum", **m) == 730
    assert buckets(s, c.REQUEST_GENERATION_TOKENS, **m) == {10.0: 1, 50.0: 1, 100.0: 2, 500.0: 2, 1000.0: 2,
                                                            math.inf: 2}


def test_triton_page_without_the_backend_has_no_frontend_series():
    """The ensemble's histogram alone (no nv_trt_llm_* gauges) is not this engine's page."""
    text = pages.triton_page(frontends={"ensemble": [80]})
    text = "\n".join(ln for ln in text.splitlines() if "nv_trt_llm" not in ln) + "\n"
    assert run(text, "trtllm-triton") == []


def test_item_two_output_is_promtool_clean_and_every_new_name_appears():
    import shutil
    import subprocess

    samples: list[NormSample] = []
    for text, kind in (
        (pages.vllm_page(reasons={"stop": 1}, sleep=(1, 1), rejections={"max_num_queued_reqs": 1}, usage=0.1,
                         prompt_lengths=[5], generation_lengths=[5]), "vllm"),
        (pages.sglang_page(running={"": 1}, paused=1, pools={"kv": (1, 8, 1), "swa": (5, 5, 0)},
                           max_total_num_tokens=10, page_size=1, prompt_lengths={"": [5]}), "sglang"),
        (pages.tgi_page({"overloaded": 1}, batch_max_total_tokens=100, batch_current_max_tokens=10,
                        input_lengths=[5], generated=[5]), "tgi"),
        (pages.trtllm_serve_page({"stop": 1}, paused=1, errors={"400": 1}), "trtllm-serve"),
        (pages.triton_page(frontends={"ensemble": [80]}, engine_ttft_ms=[50], pending={}, input_lengths=[5],
                           output_lengths=[5]), "trtllm-triton"),
    ):
        samples += run(text, kind)
    new = {c.KV_POOL_USAGE, c.ENGINE_SLEEPING, c.REQUESTS_PAUSED, c.REQUESTS_REJECTED, c.BATCH_MAX_TOKENS,
           c.BATCH_RESERVED_TOKENS, c.REQUEST_PROMPT_TOKENS, c.REQUEST_GENERATION_TOKENS, c.FRONTEND_TTFT}
    assert new <= {s.metric for s in samples} and new <= set(c.ENGINE_METRICS)
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    proc = subprocess.run([promtool, "check", "metrics"], input=render(samples), capture_output=True, timeout=30)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()
