"""Virtual-time runs: a workload through the engine in simulated seconds, as fast as the CPU allows.

This is the capacity-planning mode (how many requests per second fit under a TTFT and TPOT objective on a
given GPU, model and workload) and what the tests and benchmarks use to compare scheduling policies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from simulator.clock import VirtualClock
from simulator.config import EngineConfig
from simulator.costmodel import CostParams
from simulator.engine import EngineCore, StepStats, run_virtual
from simulator.faults import FaultState
from simulator.metrics import VllmMetrics
from simulator.request import FINISH_LENGTH, FINISH_STOP, Request
from simulator.stats import RequestRecord, summarize
from simulator.workload import WorkloadSpec, generate


class RunRecorder:
    """Observer keeping per-request records and the run's peaks."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []
        self.steps = 0
        self.peak_kv_usage = 0.0
        self.peak_queue = 0
        self.last_finish = 0.0
        self.prefix_queries = 0
        self.prefix_hits = 0

    def on_step(self, core: EngineCore, stats: StepStats) -> None:
        self.steps += 1
        self.prefix_queries += stats.prefix_queries
        self.prefix_hits += stats.prefix_hits
        usage = core.kv.usage
        if usage > self.peak_kv_usage:
            self.peak_kv_usage = usage
        waiting = len(core.scheduler.waiting)
        if waiting > self.peak_queue:
            self.peak_queue = waiting

    def on_finished(self, req: Request) -> None:
        ok = req.finish_reason in (FINISH_STOP, FINISH_LENGTH)
        started = req.num_output_tokens > 0
        self.records.append(
            RequestRecord(
                start=req.arrival_time,
                ok=ok,
                ttft=req.first_token_time - req.arrival_time if started else None,
                e2e=req.finished_time - req.arrival_time,
                prompt_tokens=req.num_prompt_tokens,
                output_tokens=req.num_output_tokens,
                error="" if ok else req.finish_reason,
            )
        )
        self.last_finish = max(self.last_finish, req.finished_time)


@dataclass
class VirtualRun:
    core: EngineCore
    recorder: RunRecorder
    summary: dict
    metrics: VllmMetrics | None = None  # the run's vLLM /metrics, when asked for


def simulate(
    config: EngineConfig,
    spec: WorkloadSpec,
    *,
    ttft_slo: float = 0.5,
    tpot_slo: float = 0.05,
    cost_params: CostParams | None = None,
    faults: FaultState | None = None,
    observers: tuple = (),
    metrics: bool = False,
) -> VirtualRun:
    """Run `spec` to completion (every request finishes; past saturation the queue drains after arrivals stop).
    With `metrics`, the run also keeps vLLM's /metrics page (slower: every token is observed)."""
    clock = VirtualClock()
    core = EngineCore(config, clock, cost_params, faults)
    recorder = RunRecorder()
    core.observers.append(recorder)
    core.observers.extend(observers)
    page = VllmMetrics(core) if metrics else None
    items = generate(spec, config.model_len)
    # Requests are made as they arrive, so a finished one (and its prefix-cache hashes) is freed at once.
    arrivals = ((item.arrival, core.new_request(item.prompt_token_ids, item.output_len, output_len=item.output_len,
                                                lora=item.lora)) for item in items)
    wall, cpu = time.perf_counter(), time.process_time()
    run_virtual(core, clock, arrivals)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    summary = summarize(recorder.records, recorder.last_finish, ttft_slo, tpot_slo)
    summary |= {
        "batching": config.batching,
        "preset": config.deployment.name,
        "kv_blocks": config.num_gpu_blocks,
        "unfinished": len(items) - len(recorder.records),
        "preemptions": core.scheduler.num_preemptions,
        "peak_kv_usage": recorder.peak_kv_usage,
        "peak_queue": recorder.peak_queue,
        "prefix_cache_hit_rate": recorder.prefix_hits / recorder.prefix_queries if recorder.prefix_queries else 0.0,
        "steps": recorder.steps,
        "wall_s": wall,
        "cpu_s": cpu,
        "simulated_requests_per_wall_s": len(recorder.records) / max(wall, 1e-9),
    }
    return VirtualRun(core, recorder, summary, page)
