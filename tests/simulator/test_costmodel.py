"""The calibrated step-time model, pinned per preset against step times derived by hand from the formula
(costmodel.py's docstring) and the spec-sheet constants written out here, not read from the code."""

from __future__ import annotations

import dataclasses

import pytest

from simulator.costmodel import CostModel, CostParams, StepShape
from simulator.presets import DEPLOYMENTS, get_deployment

# Engine overheads: 0.8 ms per step, 50 us per layer, 4 us per sequence.
STEP, LAYER, SEQ = 0.8e-3, 50e-6, 4e-6
# GPU: HBM B/s x bandwidth efficiency, peak FLOP/s x matmul efficiency, link B/s, link latency.
GPU = {
    "H100": (3.35e12 * 0.80, 989e12 * 0.46, 360e9, 10e-6),
    "H200": (4.8e12 * 0.80, 989e12 * 0.46, 360e9, 10e-6),
    "A100-80": (2.04e12 * 0.70, 312e12 * 0.63, 240e9, 10e-6),
    "A100-40": (1.56e12 * 0.85, 312e12 * 0.63, 240e9, 10e-6),
    "L40S": (0.864e12 * 0.70, 362e12 * 0.63, 25e9, 20e-6),
    "L4": (0.3e12 * 0.70, 121e12 * 0.63, 25e9, 20e-6),
    "CPU": (15e9, 140e9, 10e9, 10e-6),  # one core running vLLM's CPU build: measured, efficiencies 1
}
# Model: parameters, layers, hidden, KV bytes per token (layers x kv_heads x 128 x 2 x 2), vocab.
MODEL = {
    "llama8": (8.03e9, 32, 4096, 32 * 8 * 128 * 4, 128256),
    "llama70": (70.6e9, 80, 8192, 80 * 8 * 128 * 4, 128256),
    "mistral7": (7.25e9, 32, 4096, 32 * 8 * 128 * 4, 32768),
    "qwen7": (7.62e9, 28, 3584, 28 * 4 * 128 * 4, 152064),
    # float32, 4 KV heads of 64: 4 x 4 x 64 x 2 x 4 B per token; one tied 4096 x 256 matrix
    "tiny": (3_672_320, 4, 256, 4 * 4 * 64 * 2 * 4, 4096),
}
# The CPU engine's own overheads (step, layer, sequence): bench/sim_vs_vllm.py --calibrate.
OVERHEADS = {"tiny-llama-cpu": (1.5e-3, 0.0, 70e-6)}
PRESETS = {
    "llama3-8b-h100": ("llama8", "H100", 1),
    "llama3-8b-a100": ("llama8", "A100-80", 1),
    "llama3-8b-a100-40gb": ("llama8", "A100-40", 1),
    "llama3-8b-h200": ("llama8", "H200", 1),
    "llama3-8b-l4": ("llama8", "L4", 1),
    "llama3-70b-h100x4": ("llama70", "H100", 4),
    "llama3-70b-h200x2": ("llama70", "H200", 2),
    "mistral-7b-a100": ("mistral7", "A100-80", 1),
    "mistral-7b-l40s": ("mistral7", "L40S", 1),
    "qwen2.5-7b-h100": ("qwen7", "H100", 1),
    "tiny-llama-cpu": ("tiny", "CPU", 1),
}


def by_hand(preset: str, tokens: int, seqs: int, sampled: int, context: int, pairs: float) -> float:
    model, gpu, tp = PRESETS[preset]
    params, layers, hidden, kv, vocab = MODEL[model]
    bw, flops, link, latency = GPU[gpu]
    flops *= tp
    head = vocab * hidden  # untied: an embedding (a lookup) and an LM head of this size
    tied = model == "tiny"  # one matrix for both
    body = params - (1 if tied else 2) * head
    dtype = 4 if tied else 2
    linear = max((2 * body * tokens + 2 * head * sampled) / flops, (body + head) * dtype / tp / bw)
    attention = 4 * layers * hidden * pairs / flops + kv / tp * context / bw
    comm = 2 * layers * (latency + tokens * hidden * 2 * 2 * (tp - 1) / tp / link) if tp > 1 else 0.0
    step, layer, seq = OVERHEADS.get(preset, (STEP, LAYER, SEQ))
    return step + layers * layer + seq * seqs + linear + attention + comm


def test_every_preset_is_pinned_here():
    assert set(PRESETS) == set(DEPLOYMENTS)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_decode_prefill_and_mixed_steps_match_the_hand_derivation(preset):
    cost = CostModel(get_deployment(preset))
    for batch, ctx in ((1, 600), (64, 600), (256, 1500)):
        expected = by_hand(preset, batch, batch, batch, batch * (ctx + 1), batch * (ctx + 0.5))
        assert cost.decode_step_time(batch, ctx) == pytest.approx(expected, rel=1e-9), (batch, ctx)
    assert cost.prefill_step_time(2000) == pytest.approx(by_hand(preset, 2000, 1, 1, 2000, 2000 * 1000), rel=1e-9)
    # A mixed step: a 1500-token prompt chunk (not sampling yet) beside 100 decoding sequences at 800 tokens.
    mixed = StepShape(1600, 101, 1500 + 100 * 801, 1500 * 750 + 100 * 800.5, 100)
    assert cost.step_time(mixed) == pytest.approx(by_hand(preset, 1600, 101, 100, 1500 + 100 * 801,
                                                          1500 * 750 + 100 * 800.5), rel=1e-9)


def test_worked_numbers_for_llama8b_on_h100():
    """Written out: weights (8.03e9 - 128256 x 4096) x 2 B = 15.01 GB at 3.35 TB/s x 0.8 = 5.60 ms, KV of 601
    tokens 0.03 ms, 2.4 ms fixed (0.8 + 32 x 0.05), 4 us per sequence: 8.03 ms, vLLM's ~8.7 ms TPOT at QPS 2."""
    cost = CostModel(get_deployment("llama3-8b-h100"))
    assert cost.decode_step_time(1, 600) == pytest.approx(8.034e-3, abs=0.01e-3)
    # 2000 prompt tokens: 2 x 6.98e9 x 2000 FLOP + the LM head once, at 989 TFLOP/s x 0.46, plus attention.
    assert cost.prefill_step_time(2000) == pytest.approx(66.17e-3, abs=0.05e-3)


def test_light_load_decode_is_no_longer_floored_near_11_ms():
    """The old 4 ms per step kept an 8B decode step above ~10.9 ms where vLLM measures 7.8-8.7 ms on H100."""
    assert CostModel(get_deployment("llama3-8b-h100")).decode_step_time(4, 400) < 8.7e-3
    assert CostModel(get_deployment("llama3-8b-h200")).decode_step_time(8, 100) < 6.5e-3


def test_lm_head_runs_only_for_sequences_that_sample():
    cost = CostModel(get_deployment("llama3-8b-a100"))
    chunk = StepShape(2048, 1, 2048, 2048 * 1024, num_sampled=0)  # a prompt chunk with more to come
    last = StepShape(2048, 1, 2048, 2048 * 1024, num_sampled=1)
    head_flops = 2 * 128256 * 4096
    assert cost.step_time(last) - cost.step_time(chunk) == pytest.approx(head_flops / (312e12 * 0.63), rel=1e-9)


def test_a_mixed_step_adds_the_decode_kv_reads_to_the_prefill_compute():
    """Attention reads each sequence's KV in its own kernel: it cannot hide behind the prompt's GEMMs."""
    cost = CostModel(get_deployment("llama3-70b-h100x4"))
    prompt = StepShape(2048, 1, 2048, 2048 * 1024, 0)
    decodes_kv = 200 * 2000 * 80 * 8 * 128 * 4 / 4 / (3.35e12 * 0.8)
    mixed = StepShape(2048 + 200, 201, 2048 + 200 * 2000, 2048 * 1024 + 200 * 2000, 200)
    assert cost.step_time(mixed) - cost.step_time(prompt) > decodes_kv


def test_tensor_parallel_all_reduce_grows_with_tokens_and_link_speed():
    d = get_deployment("llama3-70b-h100x4")
    fast, slow = CostModel(d), CostModel(dataclasses.replace(d, gpu=dataclasses.replace(d.gpu, link_bandwidth_bytes_s=25e9)))
    small, big = StepShape(16, 16, 16 * 500, 16 * 500), StepShape(2048, 1, 2048, 2048 * 1024, 1)
    # 2 all-reduces x 80 layers of 2048 x 8192 x 2 B x 1.5: 1.25 ms at 360 GB/s, 18 ms at 25 GB/s.
    assert slow.step_time(big) - fast.step_time(big) == pytest.approx(
        160 * 2048 * 8192 * 2 * 1.5 * (1 / 25e9 - 1 / 360e9), rel=1e-9)
    assert slow.step_time(small) - fast.step_time(small) < 0.01 * (slow.step_time(big) - fast.step_time(big))


def test_vidurs_a100_linear_profile_is_reproduced():
    """Vidur's A100 profile of Llama-3-8B's 32 layers of linear operators: 9.8 ms at 1 token, 146 ms at 2048."""
    cost = CostModel(get_deployment("llama3-8b-a100"))
    assert cost.layers_linear_time(1) == pytest.approx(9.8e-3, rel=0.05)
    assert cost.layers_linear_time(2048) == pytest.approx(146e-3, rel=0.05)


def test_engine_overheads_are_parameters_not_constants():
    d = get_deployment("llama3-8b-h100")
    lean = CostModel(d, CostParams(step_overhead_s=0.0, layer_overhead_s=0.0, per_seq_overhead_s=0.0))
    assert CostModel(d).decode_step_time(8, 100) - lean.decode_step_time(8, 100) == pytest.approx(
        STEP + 32 * LAYER + 8 * SEQ, rel=1e-9)
