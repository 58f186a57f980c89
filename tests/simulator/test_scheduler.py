"""Scheduler invariants and behaviour, all in virtual time."""

from __future__ import annotations

import math

from simulator.clock import VirtualClock
from simulator.costmodel import CostModel, StepShape
from simulator.engine import EngineCore, StepStats, run_virtual
from simulator.faults import FaultState
from simulator.kvcache import cdiv
from simulator.request import Request, Status
from simulator.virtual import simulate
from simulator.workload import LengthDist, WorkloadSpec, generate

SPEC = WorkloadSpec(rate=20, duration=20, prompt_len=LengthDist(400, 0.5, 16, 2000),
                    output_len=LengthDist(120, 0.6, 2, 800), seed=7)


class InvariantChecker:
    """Checks the KV cache and the batch after every step."""

    def __init__(self) -> None:
        self.steps = 0
        self.max_loras_seen = 0
        self.max_running = 0

    def on_step(self, core: EngineCore, stats: StepStats) -> None:
        self.steps += 1
        kv, sched = core.kv, core.scheduler
        assert kv.num_used_blocks <= kv.num_blocks
        if kv.reserved_blocks == 0:
            assert kv.num_used_blocks <= kv.usable_blocks
        referenced = {b for r in sched.running + sched.held for b in r.block_ids}
        assert len(referenced) <= kv.num_used_blocks  # shared prefix blocks are counted once
        for r in sched.running:
            assert r.status is Status.RUNNING
            assert len(r.block_ids) >= cdiv(r.num_computed_tokens, kv.block_size)
        for r in sched.waiting:
            assert r.status is Status.WAITING and r.block_ids == [] and r.num_computed_tokens == 0
        assert len(sched.running) <= core.config.max_num_seqs
        loras = sched.running_loras()
        self.max_loras_seen = max(self.max_loras_seen, len(loras))
        assert len(loras) <= core.config.max_loras
        self.max_running = max(self.max_running, len(sched.running))
        if self.steps % 50 == 0:
            kv.check_consistency()

    def on_finished(self, req: Request) -> None:
        assert req.block_ids == []


def test_blocks_never_exceed_capacity_and_preempted_requests_resume_to_completion(make_config):
    checker = InvariantChecker()
    config = make_config(num_gpu_blocks_override=400, max_model_len=2048)  # 6400 tokens: forces preemption
    run = simulate(config, SPEC, observers=(checker,))
    records = run.recorder.records
    assert checker.steps > 100
    assert run.summary["preemptions"] > 0
    assert run.summary["peak_kv_usage"] > 0.9
    assert len(records) == run.summary["requests"] > 300 and run.summary["unfinished"] == 0
    assert all(r.ok for r in records)  # every admitted request completed, preempted ones included
    assert not run.core.scheduler.has_work()
    kv = run.core.kv
    assert kv.num_used_blocks == 0  # nothing leaked after the drain
    kv.check_consistency()


def test_preemption_picks_the_most_recently_admitted(make_config):
    clock = VirtualClock()
    # 7 blocks of 16: one is vLLM's null block, the other 96 tokens hold one request of 40 + 50 at a time
    core = EngineCore(make_config(num_gpu_blocks_override=7, block_size=16, max_model_len=96), clock)
    first = core.new_request(list(range(40)), 50, ignore_eos=True)
    second = core.new_request(list(range(1000, 1040)), 50, ignore_eos=True)
    run_virtual(core, clock, [(0.0, first), (0.001, second)])
    assert first.finished and second.finished
    assert first.num_output_tokens == 50 and second.num_output_tokens == 50
    assert first.num_preemptions == 0 and second.num_preemptions >= 1
    assert core.scheduler.num_preemptions == second.num_preemptions
    assert second.finished_time > first.finished_time


def test_output_token_counts_survive_recomputation(make_config):
    config = make_config(num_gpu_blocks_override=300, max_model_len=2048)
    run = simulate(config, SPEC)
    wanted = sorted(item.output_len for item in generate(SPEC, config.model_len))
    assert sorted(r.output_tokens for r in run.recorder.records) == wanted
    assert run.summary["preemptions"] > 0


def test_prefix_cache_hit_rate_follows_the_shared_prefix_fraction(make_config):
    rates = {}
    for fraction in (0.0, 0.3, 0.7):
        spec = WorkloadSpec(rate=10, duration=30, prompt_len=LengthDist(600, 0.3, 100, 2000), shared_prefix=fraction)
        rates[fraction] = simulate(make_config(), spec).summary["prefix_cache_hit_rate"]
    assert rates[0.0] == 0.0
    for fraction in (0.3, 0.7):
        # Lower only by each prefix's partial last block and the first request of each shared prompt.
        assert fraction - 0.05 < rates[fraction] <= fraction, rates


def test_prefix_caching_off_means_no_hits(make_config):
    spec = WorkloadSpec(rate=10, duration=10, shared_prefix=0.5)
    assert simulate(make_config(enable_prefix_caching=False), spec).summary["prefix_cache_hit_rate"] == 0.0


def test_lora_slot_limit_is_respected_and_deferred_requests_still_finish(make_config):
    checker = InvariantChecker()
    spec = WorkloadSpec(rate=10, duration=20, lora_mix=(("a", 0.3), ("b", 0.3), ("c", 0.2)), seed=3)
    config = make_config(lora_adapters=("a", "b", "c"), max_loras=2)
    run = simulate(config, spec, observers=(checker,))
    assert checker.max_loras_seen == 2
    assert run.summary["unfinished"] == 0 and all(r.ok for r in run.recorder.records)
    # With one slot, adapters take turns: latency suffers compared with enough slots.
    one = simulate(make_config(lora_adapters=("a", "b", "c"), max_loras=1), spec)
    three = simulate(make_config(lora_adapters=("a", "b", "c"), max_loras=3), spec)
    assert one.summary["ttft_s"]["p90"] > three.summary["ttft_s"]["p90"]


def test_chunked_prefill_keeps_streams_moving_during_a_long_prompt(make_config):
    clock = VirtualClock()
    core = EngineCore(make_config(max_num_batched_tokens=512), clock)
    gaps: list[float] = []
    streaming = core.new_request(list(range(100)), 200, ignore_eos=True)
    streaming.listener = lambda r: gaps.append(r.last_token_time - r.prev_token_time)
    long_prompt = core.new_request(list(range(5000, 8500)), 5, ignore_eos=True)
    run_virtual(core, clock, [(0.0, streaming), (0.5, long_prompt)])
    whole_prefill = core.cost.prefill_step_time(3500)
    assert long_prompt.first_token_time - long_prompt.scheduled_time >= whole_prefill * 0.9  # several chunks
    assert max(gaps[1:]) < whole_prefill / 3  # the stream never waited for the whole prompt


def test_continuous_batching_beats_static_on_goodput(make_config):
    spec = WorkloadSpec(rate=8, duration=60, seed=11)
    cont = simulate(make_config(batching="continuous"), spec).summary
    static = simulate(make_config(batching="static"), spec).summary
    assert cont["requests"] == static["requests"]
    assert static["preemptions"] == 0
    assert cont["goodput_rps"] > 1.5 * static["goodput_rps"]
    assert cont["ttft_s"]["p90"] < static["ttft_s"]["p90"]


def test_past_saturation_queue_and_ttft_grow_while_tpot_stays_bounded(make_config):
    config = make_config()
    results = {}
    for rate in (10, 60, 90):  # capacity for this workload is ~40 req/s
        spec = WorkloadSpec(rate=rate, duration=30, seed=5)
        results[rate] = simulate(config, spec).summary
    low, high, higher = results[10], results[60], results[90]
    assert low["peak_queue"] < high["peak_queue"] < higher["peak_queue"]
    assert low["ttft_s"]["p90"] < 0.2 < high["ttft_s"]["p90"] < higher["ttft_s"]["p90"]
    # TPOT plateaus: bounded by the step time of a full token budget, not by the queue.
    bound = longest_step(config)
    assert higher["tpot_s"]["p99"] <= bound, (higher["tpot_s"], bound)
    assert higher["tpot_s"]["p50"] < 1.3 * high["tpot_s"]["p50"]
    assert higher["throughput_rps"] < 1.2 * high["throughput_rps"]  # the server is saturated


def longest_step(config) -> float:
    """The longest possible step: a full token budget of prefill next to max_num_seqs decoding sequences."""
    cost = CostModel(config.deployment)
    n = config.max_num_batched_tokens
    seqs = config.max_num_seqs
    return cost.step_time(StepShape(n, seqs, seqs * config.model_len, n * config.model_len))


def test_a_stall_until_cleared_stops_the_virtual_run_without_hanging(make_config):
    clock = VirtualClock()
    faults = FaultState(stall_until=math.inf)
    core = EngineCore(make_config(), clock, faults=faults)
    req = core.new_request(list(range(50)), 5, ignore_eos=True)
    run_virtual(core, clock, [(0.0, req)])
    assert not req.finished and req.status is Status.WAITING
    faults.update({"stall": False}, clock.now())
    run_virtual(core, clock, [])
    assert req.finished and req.num_output_tokens == 5


def test_a_timed_stall_delays_first_tokens_by_its_length(make_config):
    spec = WorkloadSpec(rate=2, duration=5, seed=1)
    base = simulate(make_config(), spec).summary
    stalled = simulate(make_config(), spec, faults=FaultState(stall_until=3.0)).summary
    assert stalled["ttft_s"]["p99"] > 2.0 > base["ttft_s"]["p99"]


def test_kv_capacity_reduction_causes_preemptions(make_config):
    spec = WorkloadSpec(rate=20, duration=20, seed=2)
    config = make_config(num_gpu_blocks_override=8000)
    full = simulate(config, spec).summary
    reduced = simulate(config, spec, faults=FaultState(kv_capacity_factor=0.1)).summary
    assert full["preemptions"] == 0 and reduced["preemptions"] > 0
    assert reduced["unfinished"] == 0 and reduced["failed"] == 0


def test_slowdown_stretches_token_latency(make_config):
    spec = WorkloadSpec(rate=2, duration=10, seed=4)
    base = simulate(make_config(), spec).summary["tpot_s"]["p50"]
    slow = simulate(make_config(), spec, faults=FaultState(slowdown=3.0)).summary["tpot_s"]["p50"]
    assert 2.5 < slow / base < 3.5


def test_error_rate_fails_that_share_of_requests(make_config):
    spec = WorkloadSpec(rate=20, duration=20, seed=9)
    for mode in ("http500", "abort"):
        summary = simulate(make_config(), spec, faults=FaultState(error_rate=0.25, error_mode=mode)).summary
        share = summary["failed"] / summary["requests"]
        assert 0.18 < share < 0.32, (mode, share)
