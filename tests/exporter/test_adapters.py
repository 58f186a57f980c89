"""Engine adapters against every saved page in ../shared/peers/engine-metrics, asserting values.

Expected numbers are read off the pages (see each test); histogram buckets are also compared
wholesale with the page as prometheus_client parses it, independently of the adapter code.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from functools import cache
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter import adapters
from exporter.adapters import base
from exporter.adapters import tap as tap_adapter
from exporter.model import MetricFamily, NormSample, Sample
from exporter.promtext import parse_page
from llmslo import conventions as c
from tests.exporter.sample_pages import SAMPLE_PAGES, SHARED_PAGES
from tests.helpers.needs import shared_dir
from tests.helpers.samples import one, pick

PAGES = SHARED_PAGES
shared_dir(PAGES, "engine sample pages")

PAGE_KINDS = SAMPLE_PAGES
IDENTITY = {"pod": "pod-a", "namespace": "llm", "node": "gpu-node-1", "model": "configured-model"}
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


@cache
def page_text(page: str) -> str:
    return (PAGES / page).read_text()


def run_text(text: str, kind: str, identity: dict[str, str] | None = None) -> list[NormSample]:
    adapter = adapters.get(kind)
    return adapter.adapt(parse_page(text, adapter.wanted).families, {**IDENTITY, "engine": kind, **(identity or {})})


@cache
def _run_page(page: str) -> tuple[NormSample, ...]:
    return tuple(run_text(page_text(page), PAGE_KINDS[page]))


def run(page: str) -> list[NormSample]:
    return list(_run_page(page))


def bucket(samples: list[NormSample], metric: c.MetricDef, le: float, **labels: str) -> float:
    found = [s for s in pick(samples, metric, "_bucket", **labels) if float(s.labels[c.LABEL_LE]) == le]
    assert len(found) == 1, f"{metric.name} le={le}: {len(found)} buckets"
    return found[0].value


def out_buckets(samples: list[NormSample], metric: c.MetricDef) -> dict[float, float]:
    return {float(s.labels[c.LABEL_LE]): s.value for s in pick(samples, metric, "_bucket")}


def page_buckets(page: str, family: str, divisor: float = 1.0, **where: str) -> dict[float, float]:
    """A histogram's buckets straight from prometheus_client, summed over the labels the adapter drops."""
    out: dict[float, float] = {}
    for fam in text_string_to_metric_families(page_text(page)):
        if fam.name != family:
            continue
        for s in fam.samples:
            if s.name == family + "_bucket" and all(s.labels.get(k) == v for k, v in where.items()):
                edge = float(s.labels["le"]) / divisor
                out[edge] = out.get(edge, 0.0) + s.value
    assert out, f"{family} has no buckets on {page}"
    return out


# ------------------------------------------------------------------------------------------
# Every page
# ------------------------------------------------------------------------------------------
def test_every_sample_page_is_covered():
    assert sorted(p.name for p in PAGES.glob("*.prom")) == sorted(PAGE_KINDS)


@pytest.mark.parametrize("page", sorted(PAGE_KINDS))
def test_detect_names_the_engine_of_every_page(page):
    assert adapters.detect(parse_page(page_text(page), adapters.WANT_ALL).families) == PAGE_KINDS[page]
    assert adapters.detect(parse_page(page_text(page)).families) == PAGE_KINDS[page]


@pytest.mark.parametrize("page", sorted(PAGE_KINDS))
def test_every_sample_is_defined_in_conventions_and_carries_identity(page):
    samples = run(page)
    assert len(samples) > 10
    defined = c.by_name()
    for s in samples:
        assert defined.get(s.metric.name) == s.metric, s.metric.name
        assert s.metric in c.ENGINE_METRICS
        assert s.suffix in (("_bucket", "_sum", "_count") if s.metric.kind == "histogram" else ("",))
        expected = list(c.ENGINE_IDENTITY_LABELS) + list(s.metric.labels) + ([c.LABEL_LE] if s.suffix == "_bucket" else [])
        assert sorted(s.labels) == sorted(expected), (s.name, s.labels)
        assert s.labels[c.LABEL_ENGINE] == PAGE_KINDS[page]
        assert (s.labels[c.LABEL_POD], s.labels[c.LABEL_NAMESPACE], s.labels[c.LABEL_NODE]) == ("pod-a", "llm", "gpu-node-1")
        assert not s.name.endswith("_created")
        assert isinstance(s.value, float) and not math.isnan(s.value)


@pytest.mark.parametrize("page", sorted(PAGE_KINDS))
def test_no_series_is_emitted_twice(page):
    keys = [(s.name, tuple(sorted(s.labels.items()))) for s in run(page)]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("page", sorted(PAGE_KINDS))
def test_histograms_are_complete_and_cumulative(page):
    samples = run(page)
    for metric in {s.metric for s in samples if s.metric.kind == "histogram"}:
        edges = sorted(out_buckets(samples, metric).items())
        assert edges[-1][0] == math.inf
        assert [v for _, v in edges] == sorted(v for _, v in edges)
        assert edges[-1][1] == one(samples, metric, "_count")


@pytest.mark.parametrize("page", sorted(PAGE_KINDS))
def test_a_page_missing_families_gives_fewer_samples_and_no_exception(page):
    kind = PAGE_KINDS[page]
    families = parse_page(page_text(page), adapters.get(kind).wanted).families
    full = adapters.get(kind).adapt(families, IDENTITY)
    halved = {name: fam for i, (name, fam) in enumerate(sorted(families.items())) if i % 2}
    partial = adapters.get(kind).adapt(halved, IDENTITY)
    assert 0 < len(partial) < len(full)
    assert adapters.get(kind).adapt({}, IDENTITY) == []


@pytest.mark.parametrize("page", sorted(PAGE_KINDS))
def test_adapters_are_pure(page):
    kind = PAGE_KINDS[page]
    families = parse_page(page_text(page), adapters.get(kind).wanted).families
    before = copy.deepcopy(families)
    first = adapters.get(kind).adapt(families, IDENTITY)
    second = adapters.get(kind).adapt(families, IDENTITY)
    assert families == before
    assert first == second


# ------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------
def test_registry_kinds_want_all_and_get():
    assert set(adapters.ADAPTERS) == {"vllm", "sglang", "tgi", "trtllm-triton", "trtllm-serve", "llamacpp", "tap"}
    for kind, adapter in adapters.ADAPTERS.items():
        assert adapter.kind == kind and adapter is adapters.get(kind)
        assert adapter.wanted <= adapters.WANT_ALL
        assert not any(name.endswith("_created") for name in adapter.wanted)
    with pytest.raises(dataclasses.FrozenInstanceError):
        adapters.get("vllm").kind = "x"  # type: ignore[misc]
    with pytest.raises(KeyError, match="unknown engine kind 'ollama'.*vllm"):
        adapters.get("ollama")


def test_each_adapter_declares_its_own_families_and_no_two_claim_one():
    """Detection lives with each adapter (Adapter.claims): every engine claims the families it reads, only its own."""
    for adapter in adapters.ADAPTERS.values():
        claimed = {name for name in adapters.WANT_ALL if adapter.claims(name)}
        assert claimed and claimed <= adapter.wanted, adapter.kind
        others = [a.kind for a in adapters.ADAPTERS.values() if a is not adapter and any(a.claims(n) for n in claimed)]
        assert not others, (adapter.kind, others)


def test_detect_returns_none_for_a_page_of_no_known_engine():
    assert adapters.detect(parse_page("# TYPE node_load1 gauge\nnode_load1 0.5\n").families) is None
    assert adapters.detect({}) is None


# ------------------------------------------------------------------------------------------
# vLLM
# ------------------------------------------------------------------------------------------
def test_vllm_v1_values():
    s = run("vllm-v1.prom")
    m = {"model": LLAMA}  # the page's model_name wins over the configured one
    assert one(s, c.REQUESTS_RUNNING, **m) == 3
    assert one(s, c.REQUESTS_WAITING, **m) == 1
    assert one(s, c.KV_CACHE_USAGE, **m) == pytest.approx(0.16335)
    # cache_config_info num_gpu_blocks less V1's null block, which its usage gauge leaves out
    assert one(s, c.KV_BLOCKS_TOTAL, **m) == 27102 - 1
    assert one(s, c.KV_BLOCKS_FREE, **m) == round((27102 - 1) * (1 - 0.16335))
    assert one(s, c.KV_BLOCK_SIZE, **m) == 16
    assert one(s, c.PREEMPTIONS, **m) == 3
    assert one(s, c.PREFIX_CACHE_QUERIES, **m) == 163149
    assert one(s, c.PREFIX_CACHE_HITS, **m) == 54087
    assert one(s, c.PROMPT_TOKENS) == 163149
    assert one(s, c.GENERATION_TOKENS) == 45309
    finished = {x.labels[c.LABEL_REASON]: x.value for x in pick(s, c.REQUESTS_FINISHED)}
    assert finished == {"stop": 216, "length": 21, "abort": 3, "error": 0}  # repetition (0) folded into stop
    assert bucket(s, c.TTFT, 0.1) == 170 and bucket(s, c.TTFT, 0.25) == 237
    assert one(s, c.TTFT, "_count") == 240
    assert one(s, c.TTFT, "_sum") == pytest.approx(19.421453771202437)
    assert one(s, c.ITL, "_count") == 45069 and bucket(s, c.ITL, 0.01) == 6445
    assert one(s, c.ITL, "_sum") == pytest.approx(583.4436211560944)
    assert one(s, c.TPOT, "_count") == 240 and bucket(s, c.TPOT, 0.025) == 240 and bucket(s, c.TPOT, 0.01) == 0
    assert one(s, c.TPOT, "_sum") == pytest.approx(3.1030430589686633)
    assert bucket(s, c.E2E, 5.0) == 223 and one(s, c.E2E, "_sum") == pytest.approx(603.1748894704076)
    assert one(s, c.QUEUE_TIME, "_count") == 240 and one(s, c.QUEUE_TIME, "_sum") == pytest.approx(8.459418284260954)
    assert one(s, c.ENGINE_SLEEPING, **m) == 0  # engine_sleep_state{sleep_state="awake"} 1
    assert {x.labels[c.LABEL_REASON]: x.value for x in pick(s, c.REQUESTS_REJECTED)} == {
        "max_num_queued_reqs": 0, "max_num_queued_tokens": 0}
    assert one(s, c.REQUEST_PROMPT_TOKENS, "_count") == 240 and one(s, c.REQUEST_GENERATION_TOKENS, "_sum") == 45309
    assert out_buckets(s, c.REQUEST_PROMPT_TOKENS) == page_buckets("vllm-v1.prom", "vllm:request_prompt_tokens")


@pytest.mark.parametrize(("metric", "family"), [
    (c.TTFT, "vllm:time_to_first_token_seconds"), (c.ITL, "vllm:inter_token_latency_seconds"),
    (c.TPOT, "vllm:request_time_per_output_token_seconds"), (c.E2E, "vllm:e2e_request_latency_seconds"),
    (c.QUEUE_TIME, "vllm:request_queue_time_seconds"),
])
def test_vllm_v1_histograms_keep_the_engines_bucket_edges_and_counts(metric, family):
    assert out_buckets(run("vllm-v1.prom"), metric) == page_buckets("vllm-v1.prom", family)


def test_vllm_0_10_transition_prefers_new_names_and_never_double_counts():
    s = run("vllm-v1-0.10-transition.prom")
    assert one(s, c.KV_CACHE_USAGE) == pytest.approx(0.16335)  # kv_cache_usage_perc, not also gpu_cache_usage_perc
    assert one(s, c.PREFIX_CACHE_HITS) == 54087  # prefix_cache_hits, not + gpu_prefix_cache_hits
    assert one(s, c.PREFIX_CACHE_QUERIES) == 163149
    # 0.10 has no inter_token_latency_seconds: its time_per_output_token_seconds is per token -> ITL
    assert one(s, c.ITL, "_count") == 45069 and bucket(s, c.ITL, 0.025) == 44651
    assert out_buckets(s, c.ITL) == page_buckets("vllm-v1-0.10-transition.prom", "vllm:time_per_output_token_seconds")
    assert pick(s, c.TPOT, "_count") == []  # no per-request TPOT on 0.10: none invented
    assert one(s, c.KV_BLOCKS_TOTAL) == 27102 - 1 and one(s, c.KV_BLOCK_SIZE) == 16  # V1: the null block aside


def test_vllm_v0_legacy_maps_old_names():
    s = run("vllm-v0-legacy.prom")
    assert one(s, c.KV_CACHE_USAGE, model=LLAMA) == pytest.approx(0.16335)  # gpu_cache_usage_perc
    assert one(s, c.ITL, "_count") == 45069  # V0 time_per_output_token_seconds is per token
    assert one(s, c.ITL, "_sum") == pytest.approx(583.4436211560944)
    assert pick(s, c.TPOT, "_count") == []
    assert one(s, c.QUEUE_TIME, "_count") == 240  # request_queue_time_seconds only, not + time_in_queue_requests
    assert one(s, c.PREEMPTIONS) == 3
    assert pick(s, c.PREFIX_CACHE_HITS) == []  # V0 only has a hit-rate gauge, no counters
    assert one(s, c.KV_BLOCKS_TOTAL) == 27102 and one(s, c.KV_BLOCKS_FREE) == 22675  # V0 has no null block
    finished = {x.labels[c.LABEL_REASON]: x.value for x in pick(s, c.REQUESTS_FINISHED)}
    assert finished == {"stop": 216, "length": 21, "abort": 3}
    assert one(s, c.LORA_ADAPTERS_RUNNING) == 1 and one(s, c.LORA_ADAPTERS_WAITING) == 0


def test_vllm_lora_uses_only_the_newest_lora_requests_info_series():
    s = run("vllm-v1.prom")
    # two series on the page; the one whose value (a timestamp) is newest: 1.76722697793e9
    assert one(s, c.LORA_ADAPTERS_RUNNING, model=LLAMA) == 2
    assert one(s, c.LORA_ADAPTERS_WAITING, model=LLAMA) == 1
    assert one(s, c.LORA_ADAPTERS_MAX, model=LLAMA) == 4
    active = {(x.labels[c.LABEL_ADAPTER], x.labels[c.LABEL_LORA_STATE]) for x in pick(s, c.LORA_ADAPTER_ACTIVE)}
    assert active == {("sql-lora", "running"), ("tool-lora", "running"), ("chat-lora", "waiting")}


def test_vllm_lora_selection_is_by_timestamp_value_not_page_order():
    lines = page_text("vllm-v1.prom").splitlines()
    lora = [i for i, line in enumerate(lines) if line.startswith("vllm:lora_requests_info{")]
    assert len(lora) == 2
    lines[lora[0]], lines[lora[1]] = lines[lora[1]], lines[lora[0]]  # the stale series now comes last
    s = run_text("\n".join(lines) + "\n", "vllm")
    assert one(s, c.LORA_ADAPTERS_RUNNING) == 2 and one(s, c.LORA_ADAPTERS_WAITING) == 1


def test_vllm_data_parallel_engines_are_summed_not_duplicated():
    text = page_text("vllm-v0-legacy.prom")  # no `engine` label of its own; add two DP engines
    def dp(line: str, engine: str, value: str) -> str:
        name, rest = line.split("{", 1)
        return f'{name}{{engine="{engine}",{rest.rsplit(" ", 1)[0]} {value}'
    keep = [ln for ln in text.splitlines()
            if not ln.startswith(("vllm:num_requests_running{", "vllm:gpu_cache_usage_perc{", "vllm:cache_config_info{"))]
    running = next(ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running{"))
    usage = next(ln for ln in text.splitlines() if ln.startswith("vllm:gpu_cache_usage_perc{"))
    config = next(ln for ln in text.splitlines() if ln.startswith("vllm:cache_config_info{"))
    extra = [dp(running, "0", "3"), dp(running, "1", "5"), dp(usage, "0", "0.25"), dp(usage, "1", "0.75"),
             dp(config, "0", "1.0"), dp(config, "1", "1.0")]
    s = run_text("\n".join(keep + extra) + "\n", "vllm")
    assert one(s, c.REQUESTS_RUNNING) == 8
    assert one(s, c.KV_BLOCKS_TOTAL) == 2 * 27102  # a V0 page: no null block
    assert one(s, c.KV_CACHE_USAGE) == pytest.approx(0.5)
    assert one(s, c.KV_BLOCKS_FREE) == round(27102 * 0.75) + round(27102 * 0.25)
    # the same engines on V1 (no V0-only family on the page): a null block per data-parallel engine
    v1 = [ln for ln in keep + extra if "vllm:num_requests_swapped" not in ln and "vllm:cpu_cache_usage_perc" not in ln]
    s = run_text("\n".join(v1) + "\n", "vllm")
    assert one(s, c.KV_BLOCKS_TOTAL) == 2 * (27102 - 1)
    assert one(s, c.KV_BLOCKS_FREE) == round(27101 * 0.75) + round(27101 * 0.25)


# ------------------------------------------------------------------------------------------
# SGLang
# ------------------------------------------------------------------------------------------
def test_sglang_values():
    s = run("sglang.prom")
    m = {"model": LLAMA}
    assert one(s, c.REQUESTS_RUNNING, **m) == 3
    assert one(s, c.REQUESTS_WAITING, **m) == 1  # num_queue_reqs 1 + num_grammar_queue_reqs 0
    assert one(s, c.KV_CACHE_USAGE, **m) == pytest.approx(8816 / 439000)  # kv_used_tokens / max_total_num_tokens
    assert one(s, c.KV_CACHE_USAGE, **m) == pytest.approx(0.02, abs=0.005)  # the page's token_usage
    assert one(s, c.KV_BLOCK_SIZE, **m) == 1  # page_size
    assert one(s, c.KV_BLOCKS_TOTAL, **m) == 439000  # num_pages
    assert one(s, c.KV_BLOCKS_FREE, **m) == 287120 + 143064  # available + evictable tokens, / page_size
    assert one(s, c.PREFIX_CACHE_HITS, **m) == 54087  # cached_tokens_total, not the cache_hit_rate gauge
    assert one(s, c.PREFIX_CACHE_QUERIES, **m) == 163149
    assert one(s, c.PROMPT_TOKENS, **m) == 55004 + 108145  # summed over is_streaming
    assert one(s, c.GENERATION_TOKENS, **m) == 12087 + 33222
    assert one(s, c.REQUESTS_FINISHED, reason="abort") == 3
    assert one(s, c.REQUESTS_FINISHED, reason="completed") == 240 - 3
    assert one(s, c.TTFT, "_count") == 80 + 160
    assert one(s, c.TTFT, "_sum") == pytest.approx(6.179136691829106 + 13.242317079373334)
    assert one(s, c.TPOT, "_count") == 240  # request_time_per_output_token_seconds: per request
    assert one(s, c.ITL, "_count") == 45069
    assert one(s, c.QUEUE_TIME, "_sum") == pytest.approx(8.459418284260954)
    assert one(s, c.E2E, "_sum") == pytest.approx(160.99032300437827 + 442.18456646602885)
    assert one(s, c.LORA_ADAPTERS_MAX, **m) == 4 and one(s, c.LORA_ADAPTERS_RUNNING, **m) == 2
    assert pick(s, c.PREEMPTIONS) == []  # this page predates num_retracted_requests_total
    assert one(s, c.REQUESTS_PAUSED, **m) == 0  # num_paused_reqs{pid=...}
    assert one(s, c.REQUEST_PROMPT_TOKENS, "_count") == 240 and one(s, c.REQUEST_GENERATION_TOKENS, "_sum") == 45309
    assert pick(s, c.KV_POOL_USAGE) == []  # not a hybrid model


@pytest.mark.parametrize(("metric", "family"), [
    (c.TTFT, "sglang:time_to_first_token_seconds"), (c.E2E, "sglang:e2e_request_latency_seconds"),
    (c.TPOT, "sglang:request_time_per_output_token_seconds"), (c.QUEUE_TIME, "sglang:queue_time_seconds"),
])
def test_sglang_histograms_sum_the_streaming_and_rank_series(metric, family):
    assert out_buckets(run("sglang.prom"), metric) == page_buckets("sglang.prom", family)


def test_sglang_pid_label_is_aggregated_away():
    text = page_text("sglang.prom")
    line = next(ln for ln in text.splitlines() if ln.startswith("sglang:num_running_reqs{"))
    labels = line[line.index("{") + 1:line.index("}")]
    two_pids = f'sglang:num_running_reqs{{{labels},pid="101"}} 3.0\nsglang:num_running_reqs{{{labels},pid="202"}} 2.0'
    s = run_text(text.replace(line, two_pids), "sglang")
    assert one(s, c.REQUESTS_RUNNING) == 5
    assert all(c.LABEL_PID not in x.labels for x in s)
    assert one(run("sglang.prom"), c.REQUESTS_RUNNING) == 3


def test_sglang_legacy_docs_page():
    s = run("sglang-legacy-docs.prom")
    assert one(s, c.REQUESTS_RUNNING) == 162 and one(s, c.REQUESTS_WAITING) == 2826
    assert one(s, c.KV_CACHE_USAGE) == pytest.approx(0.28)  # no token capacity on the page: token_usage
    assert one(s, c.ITL, "_count") == 7400757  # old time_per_output_token_seconds is per token
    assert pick(s, c.TPOT, "_count") == []
    assert bucket(s, c.TTFT, 30.0) == 2513 and bucket(s, c.TTFT, math.inf) == 11008
    assert one(s, c.PROMPT_TOKENS) == 8128902
    assert pick(s, c.KV_BLOCKS_TOTAL) == []  # no page_size: tokens are not turned into blocks by guesswork
    assert pick(s, c.PREFIX_CACHE_HITS) == []  # only the windowed cache_hit_rate gauge


# ------------------------------------------------------------------------------------------
# TGI
# ------------------------------------------------------------------------------------------
def test_tgi_values_and_no_invented_ttft():
    s = run("tgi.prom")
    m = {"model": "configured-model"}  # TGI labels nothing with the model: the identity's is used
    assert pick(s, c.TTFT, "_count") == [] and pick(s, c.ITL, "_count") == []
    assert one(s, c.REQUESTS_RUNNING, **m) == 3  # tgi_batch_current_size
    assert one(s, c.REQUESTS_WAITING, **m) == 1  # tgi_queue_size
    assert one(s, c.E2E, "_count", **m) == 237 and one(s, c.E2E, "_sum") == pytest.approx(601.57917216038)
    assert bucket(s, c.E2E, 0.49878850951194753) == 1 and bucket(s, c.E2E, 19.175105923288406) == 237
    assert one(s, c.TPOT, "_count") == 237 and one(s, c.TPOT, "_sum") == pytest.approx(3.0635237182569868)
    assert one(s, c.QUEUE_TIME, "_sum") == pytest.approx(8.356865641865731)
    assert one(s, c.REQUESTS_FINISHED, reason="completed") == 237  # tgi_request_success (no _total)
    # tgi_request_failure{err="validation"} 2: the client's own 422, refused (below), never an error
    assert one(s, c.REQUESTS_FINISHED, reason="error") == 0
    assert one(s, c.PROMPT_TOKENS) == 163149 and one(s, c.GENERATION_TOKENS) == 45214
    assert out_buckets(s, c.E2E) == page_buckets("tgi.prom", "tgi_request_duration")
    assert pick(s, c.KV_CACHE_USAGE) == []
    assert one(s, c.BATCH_MAX_TOKENS) == 327680 and one(s, c.BATCH_RESERVED_TOKENS) == 2881
    assert one(s, c.REQUEST_PROMPT_TOKENS, "_sum") == 163149 and one(s, c.REQUEST_GENERATION_TOKENS, "_count") == 237
    assert {x.labels[c.LABEL_REASON]: x.value for x in pick(s, c.REQUESTS_REJECTED)} == {"validation": 2}


def test_tgi_counters_read_with_or_without_total_suffix():
    """prometheus_client renames `tgi_request_success` to `..._total`; a raw parser may not."""
    for sample_name in ("tgi_request_success", "tgi_request_success_total"):
        fam = MetricFamily("tgi_request_success", "counter", samples=[Sample(sample_name, {}, 237.0)])
        s = adapters.get("tgi").adapt({"tgi_request_success": fam}, IDENTITY)
        assert one(s, c.REQUESTS_FINISHED, reason="completed") == 237


# ------------------------------------------------------------------------------------------
# TensorRT-LLM behind Triton
# ------------------------------------------------------------------------------------------
def test_triton_extended_values_and_unit_conversion():
    s = run("triton-trtllm-extended.prom")
    m = {"model": "tensorrt_llm"}
    assert one(s, c.REQUESTS_RUNNING, **m) == 3  # request_type="scheduled"
    assert one(s, c.REQUESTS_WAITING, **m) == 1  # request_type="waiting" (= active 4 - scheduled 3)
    assert one(s, c.KV_BLOCKS_TOTAL, **m) == 6784 and one(s, c.KV_BLOCKS_FREE, **m) == 5676
    assert one(s, c.KV_BLOCK_SIZE, **m) == 64
    assert one(s, c.KV_CACHE_USAGE, **m) == pytest.approx(0.1633254716981132)  # used / max = the page's fraction
    # first-response histogram: milliseconds -> seconds, edges included
    assert {x.labels[c.LABEL_LE] for x in pick(s, c.TTFT, "_bucket")} == {"0.1", "0.5", "2.0", "5.0", "+Inf"}
    assert bucket(s, c.TTFT, 0.1, **m) == 171 and bucket(s, c.TTFT, 0.5) == 240  # tensorrt_llm, not ensemble (170)
    assert one(s, c.TTFT, "_sum") == pytest.approx(18941.453771202432 / 1000)
    assert out_buckets(s, c.TTFT) == page_buckets(
        "triton-trtllm-extended.prom", "nv_inference_first_response_histogram_ms", 1000.0, model="tensorrt_llm")
    # cumulative microsecond counters -> seconds, as a histogram's sum with the success count
    assert one(s, c.E2E, "_sum") == pytest.approx(602454889 / 1e6) and one(s, c.E2E, "_count") == 240
    assert one(s, c.QUEUE_TIME, "_sum") == pytest.approx(19873 / 1e6)
    assert bucket(s, c.E2E, math.inf) == 240
    # only the TRT-LLM model's requests: not 4 x 240 across the ensemble's steps, not the ensemble's 2 OTHER failures
    assert one(s, c.REQUESTS_FINISHED, reason="completed") == 240
    assert one(s, c.REQUESTS_FINISHED, reason="error") == 0
    assert one(s, c.REQUESTS_FINISHED, reason="abort") == 0  # CANCELED
    assert one(s, c.PROMPT_TOKENS) == 163149 and one(s, c.GENERATION_TOKENS) == 45309
    assert {x.labels[c.LABEL_MODEL] for x in s if x.metric != c.FRONTEND_TTFT} == {"tensorrt_llm"}
    # what clients see: the ensemble's first response, pre- and postprocessing included
    assert {x.labels[c.LABEL_MODEL] for x in pick(s, c.FRONTEND_TTFT, "_count")} == {"ensemble"}
    assert out_buckets(s, c.FRONTEND_TTFT) == page_buckets(
        "triton-trtllm-extended.prom", "nv_inference_first_response_histogram_ms", 1000.0, model="ensemble")
    assert bucket(s, c.FRONTEND_TTFT, 0.1) == 170 and one(s, c.FRONTEND_TTFT, "_sum") == pytest.approx(19.42145377120243)
    assert one(s, c.REQUESTS_PAUSED, **m) == 0  # paused_requests of the inflight batcher
    assert one(s, c.REQUEST_PROMPT_TOKENS, "_count") == 240
    assert out_buckets(s, c.REQUEST_GENERATION_TOKENS) == page_buckets(
        "triton-trtllm-extended.prom", "nv_llm_output_token_len", model="tensorrt_llm")


def test_triton_readme_page_uses_block_counts_over_its_inconsistent_fraction():
    s = run("triton-trtllm.prom")
    assert one(s, c.REQUESTS_RUNNING) == 1 and one(s, c.REQUESTS_WAITING) == 1
    assert one(s, c.KV_BLOCKS_TOTAL) == 6239 and one(s, c.KV_BLOCKS_FREE) == 6239
    assert one(s, c.KV_CACHE_USAGE) == pytest.approx(1 / 6239)  # the README pasted fraction=0.4875 with used=1
    assert one(s, c.REQUESTS_FINISHED, reason="completed") == 0
    assert one(s, c.E2E, "_count") == 0 and pick(s, c.TTFT, "_count") == []


def test_triton_falls_back_to_fraction_without_used_blocks():
    text = "\n".join(ln for ln in page_text("triton-trtllm.prom").splitlines() if 'kv_cache_block_type="used"' not in ln)
    assert one(run_text(text + "\n", "trtllm-triton"), c.KV_CACHE_USAGE) == pytest.approx(0.4875)


# ------------------------------------------------------------------------------------------
# trtllm-serve
# ------------------------------------------------------------------------------------------
def test_trtllm_serve_values():
    s = run("trtllm-serve.prom")
    m = {"model": LLAMA}
    assert one(s, c.REQUESTS_RUNNING, **m) == 3 and one(s, c.REQUESTS_WAITING, **m) == 1
    assert one(s, c.KV_BLOCKS_TOTAL, **m) == 6784 and one(s, c.KV_BLOCKS_FREE, **m) == 5676
    assert one(s, c.KV_BLOCK_SIZE, **m) == 32
    assert one(s, c.KV_CACHE_USAGE, **m) == pytest.approx(0.1633, abs=1e-4)
    assert one(s, c.PREFIX_CACHE_HITS, **m) == 3380 * 32  # reused blocks x tokens per block
    assert one(s, c.PREFIX_CACHE_QUERIES, **m) == (3380 + 6816) * 32
    ratio = one(s, c.PREFIX_CACHE_HITS) / one(s, c.PREFIX_CACHE_QUERIES)
    assert ratio == pytest.approx(0.3315, abs=1e-4)  # the page's trtllm_kv_cache_hit_rate
    finished = {x.labels[c.LABEL_REASON]: x.value for x in pick(s, c.REQUESTS_FINISHED)}
    assert finished == {"stop": 216, "length": 21, "abort": 3}
    assert one(s, c.TPOT, "_count") == 240 and one(s, c.TPOT, "_sum") == pytest.approx(3.1030430589686633)
    assert pick(s, c.ITL, "_count") == []
    assert one(s, c.TTFT, "_count") == 240 and bucket(s, c.TTFT, 0.1) == 170
    assert out_buckets(s, c.TTFT) == page_buckets("trtllm-serve.prom", "trtllm_time_to_first_token_seconds")
    assert out_buckets(s, c.E2E) == page_buckets("trtllm-serve.prom", "trtllm_e2e_request_latency_seconds")
    assert one(s, c.PROMPT_TOKENS) == 163149 and one(s, c.GENERATION_TOKENS) == 45309


def test_created_series_never_reach_the_output():
    text = page_text("trtllm-serve.prom")
    assert "_created" in text
    families = parse_page(text).families  # everything, `_created` gauges included
    s = adapters.get("trtllm-serve").adapt(families, IDENTITY)
    assert s == run("trtllm-serve.prom")
    assert all(1.7e9 > x.value for x in s if x.metric.kind != "histogram")  # no creation timestamp leaked


# ------------------------------------------------------------------------------------------
# Tap
# ------------------------------------------------------------------------------------------
def _tap_page() -> str:
    registry = CollectorRegistry()
    labels = [label for label in c.TAP_TTFT.labels]
    ttft = Histogram(c.TAP_TTFT.name, c.TAP_TTFT.help, labels, registry=registry, buckets=(0.1, 0.5, 1.0))
    requests = Counter(tap_adapter.family_name(c.TAP_REQUESTS), c.TAP_REQUESTS.help, list(c.TAP_REQUESTS.labels),
                       registry=registry)
    for value in (0.05, 0.3, 0.4, 2.0):
        ttft.labels(model="llama-3-8b", slo_class="interactive", buckets="1a2b3c4d").observe(value)
    requests.labels(model="llama-3-8b", slo_class="interactive", outcome="ok").inc(3)
    requests.labels(model="llama-3-8b", slo_class="interactive", outcome="aborted").inc(1)
    return generate_latest(registry).decode()


def test_tap_passes_its_families_through_with_identity():
    text = _tap_page()
    assert "_created" in text
    assert adapters.detect(parse_page(text, adapters.WANT_ALL).families) == "tap"
    s = run_text(text, "tap")
    m = {"model": "llama-3-8b", "slo_class": "interactive", "engine": "tap", "pod": "pod-a", "node": "gpu-node-1"}
    assert bucket(s, c.TAP_TTFT, 0.1, **m) == 1 and bucket(s, c.TAP_TTFT, 0.5, **m, buckets="1a2b3c4d") == 3
    assert one(s, c.TAP_TTFT, "_count", **m) == 4 and one(s, c.TAP_TTFT, "_sum") == pytest.approx(2.75)
    assert one(s, c.TAP_REQUESTS, outcome="ok", **m) == 3 and one(s, c.TAP_REQUESTS, outcome="aborted") == 1
    for x in s:
        assert x.metric in c.TAP_METRICS and not x.name.endswith("_created")
        expected = set(c.ENGINE_IDENTITY_LABELS) | set(x.metric.labels) | ({c.LABEL_LE} if x.suffix == "_bucket" else set())
        assert set(x.labels) == expected


# ------------------------------------------------------------------------------------------
# docs/metrics.md stays in step with conventions
# ------------------------------------------------------------------------------------------
def test_metric_reference_documents_every_engine_and_self_metric():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    rows = {line.split("|")[1].strip().strip("`") for line in doc.splitlines() if line.startswith("| `")}
    for metric in c.ENGINE_METRICS + c.EXPORTER_METRICS:
        assert metric.name in rows, f"{metric.name} missing from docs/metrics.md"
    mapping = doc.split("## Per-engine mapping", 1)[1].split("## Engine notes", 1)[0]
    mapped = {line.split("|")[1].strip().split("`")[1].split("{")[0] for line in mapping.splitlines() if line.startswith("| `")}
    assert mapped == {m.name for m in c.ENGINE_METRICS}
    for reason in c.FINISHED_REASONS:
        assert f"| `{reason}` |" in doc
    for heading in ("## GPU (NVML)", "## Goodput tap", "## Exporter self-metrics", "## OpenTelemetry GenAI equivalents"):
        assert heading in doc


@pytest.mark.parametrize(("raw", "normalized"), [
    ("stop", "stop"), ("LENGTH", "length"), ("abort", "abort"), ("error", "error"), ("repetition", "stop"),
    ("canceled", "abort"), ("something-new", "error"), ("timeout", "error"),
])
def test_finished_reasons_normalize_onto_the_conventions_set(raw, normalized):
    from exporter.adapters.base import normalize_finished_reason
    assert normalize_finished_reason(raw) == normalized
    assert normalized in c.FINISHED_REASONS


@pytest.mark.parametrize(("text", "number", "edge"), [
    ("27102", 27102.0, 27102.0), ("0.5", 0.5, 0.5), ("+Inf", None, math.inf), ("-Inf", None, -math.inf),
    ("NaN", None, None), ("None", None, None), ("", None, None), (None, None, None),
])
def test_a_label_value_reads_as_a_number_only_when_finite_and_as_an_edge_when_not_nan(text, number, edge):
    assert base.parse_number(text) == number
    assert base.parse_edge(text) == edge
