"""The engines' newest signals, normalized (issue #37, part 4): pages as vLLM 0.34 and SGLang 0.5.23 register the
families (tests/exporter/newest_pages.py), every new signal mapped, and every label value a page writes bounded."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest

from exporter import adapters
from exporter.adapters.base import position
from exporter.exposition import render
from exporter.model import NormSample
from exporter.promtext import parse_page
from llmslo import conventions as c
from tests.exporter import newest_pages as pages
from tests.exporter.engine_pages import LLAMA
from tests.helpers.samples import one, pick

IDENTITY = {"pod": "pod-a", "namespace": "llm", "node": "gpu-node-1", "model": "configured-model"}
SHARED_SAMPLE = Path(__file__).resolve().parents[3] / "shared" / "peers" / "engine-metrics" / "vllm-v1.prom"


def run(text: str, kind: str) -> list[NormSample]:
    adapter = adapters.get(kind)
    return adapter.adapt(parse_page(text, adapter.wanted).families, {**IDENTITY, "engine": kind})


def by(samples: list[NormSample], metric: c.MetricDef, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in pick(samples, metric):
        out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out


def buckets(samples: list[NormSample], metric: c.MetricDef) -> dict[float, float]:
    return {float(s.labels["le"]): s.value for s in pick(samples, metric, "_bucket")}


# ------------------------------------------------------------------------------------------
# vLLM
# ------------------------------------------------------------------------------------------
def test_every_new_vllm_signal_is_mapped_and_data_parallel_engines_are_summed():
    e0 = pages.VllmEngine()
    e1 = pages.VllmEngine(waiting={"capacity": 2, "deferred": 0}, by_source={"local_compute": 100, "local_cache_hit": 20},
                          cached_by_source={"device": 15, "host": 5}, prefill_computed=(3000,), drafts=(10, 30, 12),
                          accepted_per_pos={"0": 8, "1": 3, "2": 1})
    text = pages.vllm_newest_page({0: e0, 1: e1}, rejections={"max_num_queued_reqs": 7, "max_num_queued_tokens": 2})
    s = run(text, "vllm")
    m = {c.LABEL_MODEL: LLAMA}
    assert by(s, c.REQUESTS_WAITING_BY_REASON, c.LABEL_REASON) == {"capacity": 5, "deferred": 1}
    assert sum(by(s, c.REQUESTS_WAITING_BY_REASON, c.LABEL_REASON).values()) == one(s, c.REQUESTS_WAITING, **m) == 6
    sources = by(s, c.PROMPT_TOKENS_BY_SOURCE, c.LABEL_SOURCE)
    assert sources == {"computed": 1000, "local_cache": 320, "external_transfer": 50}
    assert sum(sources.values()) == one(s, c.PROMPT_TOKENS, **m)  # PromptTokenStats: the sources add up to the total
    assert one(s, c.PROMPT_TOKENS_CACHED, **m) == 320 + 50 == sources["local_cache"] + sources["external_transfer"]
    assert by(s, c.PROMPT_TOKENS_CACHED_BY_TIER, c.LABEL_CACHE_TIER) == {
        "device": 315, "host": 5, "p2p": 50, "disk": 0, "external": 0}
    assert one(s, c.REQUEST_PREFILL_COMPUTED_TOKENS, "_count", **m) == 4
    assert one(s, c.REQUEST_PREFILL_COMPUTED_TOKENS, "_sum", **m) == 4 + 90 + 806 + 3000
    edges = buckets(s, c.REQUEST_PREFILL_COMPUTED_TOKENS)
    assert sorted(edges)[:-1] == [float(b) for b in pages.request_tokens_buckets(4096)]  # vLLM's own edges kept
    assert edges[5.0] == 1 and edges[100.0] == 2 and edges[1000.0] == 3 and edges[math.inf] == 4
    assert one(s, c.SPEC_DRAFTS, **m) == 50 and one(s, c.SPEC_DRAFT_TOKENS, **m) == 150
    assert one(s, c.SPEC_ACCEPTED_TOKENS, **m) == 82
    assert by(s, c.SPEC_ACCEPTED_BY_POSITION, c.LABEL_POSITION) == {"0": 43, "1": 25, "2": 14}
    assert by(s, c.REQUESTS_REJECTED, c.LABEL_REASON) == {"max_num_queued_reqs": 7, "max_num_queued_tokens": 2}
    assert {x.labels[c.LABEL_ENGINE] for x in s} == {"vllm"}  # vLLM's data-parallel `engine` is summed away


def test_without_a_draft_model_there_is_no_spec_decode_series():
    s = run(pages.vllm_newest_page({0: pages.VllmEngine(drafts=None)}), "vllm")
    for metric in (c.SPEC_DRAFTS, c.SPEC_DRAFT_TOKENS, c.SPEC_ACCEPTED_TOKENS, c.SPEC_ACCEPTED_BY_POSITION):
        assert pick(s, metric) == []
    assert by(s, c.PROMPT_TOKENS_BY_SOURCE, c.LABEL_SOURCE)["computed"] == 900  # the rest is there


def test_label_values_a_newer_or_hostile_vllm_writes_are_other():
    """A reason, source or tier vLLM adds later is `other`; a page writing 500 made-up values adds one series."""
    e = pages.VllmEngine(waiting={"capacity": 1, "deferred": 0, "kv_fetch": 4},
                         by_source={"local_compute": 10, "from_the_moon": 5},
                         cached_by_source={"device": 2, "cxl": 3}, accepted_per_pos={"0": 1, "40": 2, "x": 3})
    rejections = {"max_num_queued_reqs": 1, **{f"cap_{i}": 1 for i in range(500)}}
    s = run(pages.vllm_newest_page({0: e}, rejections=rejections), "vllm")
    assert by(s, c.REQUESTS_REJECTED, c.LABEL_REASON) == {"max_num_queued_reqs": 1, "max_num_queued_tokens": 0,
                                                         c.OTHER: 500}
    assert by(s, c.REQUESTS_WAITING_BY_REASON, c.LABEL_REASON) == {"capacity": 1, "deferred": 0, c.OTHER: 4}
    assert by(s, c.PROMPT_TOKENS_BY_SOURCE, c.LABEL_SOURCE) == {"computed": 10, "local_cache": 0,
                                                               "external_transfer": 0, c.OTHER: 5}
    assert by(s, c.PROMPT_TOKENS_CACHED_BY_TIER, c.LABEL_CACHE_TIER)[c.OTHER] == 3
    assert by(s, c.SPEC_ACCEPTED_BY_POSITION, c.LABEL_POSITION) == {"0": 1, c.OTHER: 5}
    # each refusal at an unknown cap is still an error: the client got a 503
    finished = by(s, c.REQUESTS_FINISHED, c.LABEL_REASON)
    assert finished == {c.FINISHED_ERROR: 501}
    for metric, label, known in ((c.REQUESTS_REJECTED, c.LABEL_REASON, c.VLLM.ADMISSION_REJECTION_REASONS),
                                 (c.REQUESTS_WAITING_BY_REASON, c.LABEL_REASON, c.WAITING_REASONS),
                                 (c.PROMPT_TOKENS_BY_SOURCE, c.LABEL_SOURCE, c.PROMPT_SOURCES),
                                 (c.PROMPT_TOKENS_CACHED_BY_TIER, c.LABEL_CACHE_TIER, c.CACHE_TIERS)):
        assert set(by(s, metric, label)) <= {*known, c.OTHER}


@pytest.mark.parametrize(("raw", "kept"), [
    ("0", "0"), ("15", "15"), ("007", "7"), (" 3 ", "3"), ("16", c.OTHER), ("-1", c.OTHER), ("1e1", c.OTHER),
    ("", c.OTHER), (None, c.OTHER), ("\uff11", c.OTHER), ("\u00b2", c.OTHER), ("9" * 400, c.OTHER), ("0x1", c.OTHER),
])
def test_a_draft_position_is_one_of_sixteen_or_other(raw, kept):
    assert position(raw) == kept


def test_the_output_of_the_newest_pages_is_promtool_clean():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    samples = run(pages.vllm_newest_page({0: pages.VllmEngine(), 1: pages.VllmEngine()},
                                         rejections={"max_num_queued_reqs": 1}), "vllm")
    samples += run(pages.sglang_newest_page(cached={"device": 5, "host": 1}, uncached=(10, 2000), queued=1), "sglang")
    proc = subprocess.run([promtool, "check", "metrics"], input=render(samples), capture_output=True, timeout=30)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


@pytest.mark.skipif(not SHARED_SAMPLE.exists(), reason="the engine samples in ../shared are not in a user's clone")
def test_the_shared_vllm_033_sample_maps_every_new_signal():
    """vllm-v1.prom: made by exec'ing vLLM 0.33.0's own metric definitions (PROVENANCE.md), with spec decoding on."""
    s = run(SHARED_SAMPLE.read_text(), "vllm")
    m = {c.LABEL_MODEL: "meta-llama/Llama-3.1-8B-Instruct"}
    assert by(s, c.REQUESTS_WAITING_BY_REASON, c.LABEL_REASON) == {"capacity": 1, "deferred": 0}
    assert by(s, c.PROMPT_TOKENS_BY_SOURCE, c.LABEL_SOURCE) == {"computed": 109062, "local_cache": 54087,
                                                               "external_transfer": 0}
    assert one(s, c.PROMPT_TOKENS_CACHED, **m) == 54087
    assert by(s, c.PROMPT_TOKENS_CACHED_BY_TIER, c.LABEL_CACHE_TIER) == {"device": 54087, "host": 0, "p2p": 0,
                                                                        "disk": 0, "external": 0}
    assert one(s, c.REQUEST_PREFILL_COMPUTED_TOKENS, "_sum", **m) == 109062
    assert one(s, c.REQUEST_PREFILL_COMPUTED_TOKENS, "_count", **m) == 240
    assert (one(s, c.SPEC_DRAFTS, **m), one(s, c.SPEC_DRAFT_TOKENS, **m), one(s, c.SPEC_ACCEPTED_TOKENS, **m)) == (
        1804, 5412, 2297)
    assert by(s, c.SPEC_ACCEPTED_BY_POSITION, c.LABEL_POSITION) == {"0": 1102, "1": 757, "2": 438}
    assert by(s, c.REQUESTS_REJECTED, c.LABEL_REASON) == {"max_num_queued_reqs": 0, "max_num_queued_tokens": 0}
    assert one(s, c.ENGINE_SLEEPING, **m) == 0


# ------------------------------------------------------------------------------------------
# SGLang
# ------------------------------------------------------------------------------------------
def test_sglang_newest_signals():
    text = pages.sglang_newest_page(cached={"device": 600, "host": 150, "storage": 50, "total": 25},
                                    uncached=(120, 480, 2500), queued=4, grammar_queue=2)
    s = run(text, "sglang")
    m = {c.LABEL_MODEL: LLAMA}
    assert by(s, c.REQUESTS_WAITING_BY_REASON, c.LABEL_REASON) == {"capacity": 4, "deferred": 2}
    assert one(s, c.REQUESTS_WAITING, **m) == 6  # the reasons add up to the waiting requests
    # `total` is a request without a breakdown: cached, in no tier
    assert one(s, c.PROMPT_TOKENS_CACHED, **m) == 825
    assert by(s, c.PROMPT_TOKENS_CACHED_BY_TIER, c.LABEL_CACHE_TIER) == {"device": 600, "host": 150, "storage": 50}
    assert one(s, c.PREFIX_CACHE_HITS, **m) == 825  # unchanged: every cache_source
    assert one(s, c.REQUEST_PREFILL_COMPUTED_TOKENS, "_count", **m) == 3
    assert one(s, c.REQUEST_PREFILL_COMPUTED_TOKENS, "_sum", **m) == 3100
    edges = buckets(s, c.REQUEST_PREFILL_COMPUTED_TOKENS)
    assert sorted(edges)[:-1] == [float(b) for b in pages.SGLANG_PROMPT_TOKEN_BUCKETS]
    assert edges[500.0] == 2 and edges[3000.0] == 3


def test_sglang_unknown_cache_source_is_other_and_an_older_page_has_no_tier():
    s = run(pages.sglang_newest_page(cached={"device": 1, "nvme_of": 9}), "sglang")
    assert by(s, c.PROMPT_TOKENS_CACHED_BY_TIER, c.LABEL_CACHE_TIER) == {"device": 1, c.OTHER: 9}
    s = run(pages.sglang_newest_page(cached=None), "sglang")  # no cache_source label at all
    assert one(s, c.PROMPT_TOKENS_CACHED) == 77 and pick(s, c.PROMPT_TOKENS_CACHED_BY_TIER) == []
