"""Presets, the cost model's calibration and the paged KV cache with its prefix cache."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.config import EngineConfig
from simulator.costmodel import CostModel, StepShape
from simulator.kvcache import KVCacheManager
from simulator.presets import DEPLOYMENTS, GIB, MODELS, get_deployment
from simulator.request import Request
from simulator.virtual import simulate
from simulator.workload import LengthDist, WorkloadSpec


# ---------------------------------------------------------------------------- presets
def test_kv_bytes_per_token_follow_the_model_shape():
    llama8 = MODELS["meta-llama/Llama-3.1-8B-Instruct"]
    llama70 = MODELS["meta-llama/Llama-3.1-70B-Instruct"]
    assert llama8.kv_bytes_per_token() == 32 * 8 * 128 * 2 * 2 == 131072
    assert llama70.kv_bytes_per_token(tp=4) == 80 * 8 * 128 * 2 * 2 / 4


def test_capacity_is_hbm_left_after_weights_over_block_bytes():
    d = get_deployment("llama3-8b-h100")
    expected = (80 * GIB * 0.9 - 8.03e9 * 2 - 4 * GIB) // (131072 * 16)
    assert d.num_gpu_blocks(16) == expected
    # vLLM's own page for this pair (at 0.92 utilization, with its profiled activations) says 27102 blocks.
    assert 26000 < d.num_gpu_blocks(16) < 28500
    assert get_deployment("llama3-70b-h100x4").num_gpu_blocks(16) > 0


def test_a_model_too_big_for_the_gpu_is_refused_with_the_fix():
    d = dataclasses.replace(get_deployment("llama3-70b-h100x4"), tp=1)
    with pytest.raises(ValueError, match="raise --tp"):
        d.num_gpu_blocks(16)


def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match="llama3-8b-h100"):
        get_deployment("gpt-5-on-a-toaster")


# ---------------------------------------------------------------------------- cost model
def test_decode_grows_with_batch_and_context_prefill_with_tokens():
    cost = CostModel(get_deployment("llama3-8b-h100"))
    assert cost.decode_step_time(256, 600) > cost.decode_step_time(64, 600) > cost.decode_step_time(1, 600)
    assert cost.decode_step_time(32, 4000) > cost.decode_step_time(32, 500)
    fixed = cost.params.step_overhead_s + 32 * cost.params.layer_overhead_s + cost.params.per_seq_overhead_s
    t1, t2 = cost.prefill_step_time(1000) - fixed, cost.prefill_step_time(2000) - fixed
    assert 1.9 < t2 / t1 < 2.3  # linear in tokens, plus the small quadratic attention term


def test_tensor_parallel_splits_the_work():
    model = MODELS["meta-llama/Llama-3.1-70B-Instruct"]
    tp4 = CostModel(get_deployment("llama3-70b-h100x4"))
    tp8 = CostModel(dataclasses.replace(get_deployment("llama3-70b-h100x4"), tp=8))
    shape = StepShape(2048, 1, 2048, 2048 * 1024)
    assert tp8.step_time(shape) < tp4.step_time(shape)
    assert model.kv_bytes_per_token(8) == model.kv_bytes_per_token(4) / 2


def test_ttft_for_a_500_token_prompt_is_50_to_100_ms_at_low_load():
    spec = WorkloadSpec(rate=0.5, duration=60, prompt_len=LengthDist(500, 0), output_len=LengthDist(20, 0))
    ttft = simulate(EngineConfig(), spec).summary["ttft_s"]
    assert 0.050 <= ttft["p50"] <= 0.100


def test_every_preset_builds_an_engine():
    for d in DEPLOYMENTS.values():
        assert CostModel(d).decode_step_time(1, 100) > 0
        assert EngineConfig(deployment=d).num_gpu_blocks > 0


# ---------------------------------------------------------------------------- kv cache
def _req(tokens: list[int], rid: str = "r", lora: str | None = None) -> Request:
    return Request(rid, tokens, max_tokens=10, output_len=10, arrival_time=0.0, lora=lora)


def test_allocation_fails_whole_when_blocks_run_out_and_free_returns_them():
    kv = KVCacheManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    a, b = _req(list(range(10)), "a"), _req(list(range(100, 110)), "b")
    assert kv.allocate_slots(a, 10)  # 3 blocks
    assert not kv.allocate_slots(b, 10)  # needs 3, 1 free: nothing is taken
    assert kv.num_free_blocks == 1 and b.block_ids == []
    kv.free(a)
    assert kv.num_free_blocks == 4
    assert kv.allocate_slots(b, 10)
    kv.check_consistency()


def test_prefix_hits_cover_shared_full_blocks_only():
    kv = KVCacheManager(num_blocks=16, block_size=4)
    first = _req([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "first")
    assert kv.get_computed_blocks(first) == []
    kv.allocate_slots(first, 10)
    first.num_computed_tokens = 10
    second = _req([1, 2, 3, 4, 5, 6, 7, 99, 9, 10], "second")  # agrees on block 0 only
    assert kv.get_computed_blocks(second) == first.block_ids[:1]
    same = _req([1, 2, 3, 4, 5, 6, 7, 8, 9], "same")  # 9 tokens: 2 full blocks, both cached
    assert kv.get_computed_blocks(same) == first.block_ids[:2]
    exact = _req([1, 2, 3, 4, 5, 6, 7, 8], "exact")  # the last token is always recomputed
    assert kv.get_computed_blocks(exact) == first.block_ids[:1]
    other_adapter = _req([1, 2, 3, 4, 5, 6, 7, 8, 9], "lora", lora="sql")
    assert kv.get_computed_blocks(other_adapter) == []


def test_freed_cached_blocks_stay_findable_until_evicted_oldest_first():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    old, new = _req([1, 2, 3, 4, 5], "old"), _req([9, 9, 9, 9, 5], "new")
    for r in (old, new):
        kv.allocate_slots(r, 5)
        r.num_computed_tokens = 5
    kv.free(old)
    kv.free(new)
    assert kv.num_free_blocks == 4
    assert kv.get_computed_blocks(_req([1, 2, 3, 4, 0], "x")) != []
    assert kv.usage == 0.0  # cached blocks nobody references are free (vLLM's get_usage)
    # two blocks: the two partly filled ones, which have no hash, go first (vLLM's free_blocks puts them at the
    # head of the free queue), and both cached blocks stay findable
    filler = _req(list(range(200, 208)), "filler")
    kv.allocate_slots(filler, 8)
    assert kv.get_computed_blocks(_req([1, 2, 3, 4, 0], "y")) != []
    one_more = _req(list(range(300, 304)), "one more")  # then the least recently freed cached block
    kv.allocate_slots(one_more, 4)
    assert kv.get_computed_blocks(_req([1, 2, 3, 4, 0], "y")) == []  # old's block went first
    assert kv.get_computed_blocks(_req([9, 9, 9, 9, 0], "z")) != []
    kv.check_consistency()


def test_a_hit_on_a_free_cached_block_counts_against_free_space():
    kv = KVCacheManager(num_blocks=2, block_size=4)
    a = _req([1, 2, 3, 4, 5], "a")
    kv.allocate_slots(a, 5)
    a.num_computed_tokens = 5
    kv.free(a)
    b = _req([1, 2, 3, 4, 7, 8, 9, 10, 11], "b")
    hits = kv.get_computed_blocks(b)
    assert len(hits) == 1
    assert not kv.allocate_slots(b, 5, hits)  # 1 revived + 2 new > 2 blocks
    assert kv.allocate_slots(b, 4, hits)  # 1 revived + 1 new
    assert kv.num_free_blocks == 0
    kv.check_consistency()


def test_capacity_factor_withholds_blocks():
    kv = KVCacheManager(num_blocks=10, block_size=4)
    kv.set_capacity_factor(0.5)
    assert kv.usable_blocks == 5
    big = _req(list(range(24)), "big")
    assert not kv.allocate_slots(big, 24)  # 6 blocks > 5 usable
    assert kv.allocate_slots(big, 20)
    assert kv.usage == 1.0
