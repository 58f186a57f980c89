"""vLLM V1 /metrics pages carrying N LoRA adapters, produced at run time by the simulator's metrics module.

The simulator emits vLLM 0.33's families, labels and bucket edges (see `simulator/metrics.py`), so the page is
vLLM's shape with realistic contents: a short mixed workload first (histograms, counters and, as in vLLM,
every past `lora_requests_info` label set, each still on the page), then one long request per adapter, so
the newest `lora_requests_info` series names all N adapters, comma-separated, in `running_lora_adapters`
(`max_loras` = N/4 slots) and `waiting_lora_adapters` (the rest).
"""

from __future__ import annotations

import random

from simulator.clock import VirtualClock
from simulator.config import EngineConfig
from simulator.engine import EngineCore, run_virtual
from simulator.metrics import VllmMetrics
from simulator.request import Status
from simulator.workload import WorkloadSpec, generate

WARMUP_SECONDS = 30.0
WARMUP_RATE = 8.0  # requests per second; half go to adapters
LORA_SHARE = 0.5
PROMPT_TOKENS = 300
OUTPUT_TOKENS = 1000  # long enough that no adapter request finishes before the page is rendered


def adapter_names(count: int) -> tuple[str, ...]:
    return tuple(f"adapter-{i:03d}" for i in range(count))


def vllm_lora_page(adapters: int, seed: int = 0, warmup_s: float = WARMUP_SECONDS) -> str:
    """A vLLM V1 page whose newest `lora_requests_info` series carries `adapters` adapters."""
    names = adapter_names(adapters)
    config = EngineConfig(lora_adapters=names, max_loras=max(1, adapters // 4), max_model_len=8192, seed=seed)
    clock = VirtualClock()
    core = EngineCore(config, clock)
    metrics = VllmMetrics(core)
    if warmup_s > 0:
        spec = WorkloadSpec(rate=WARMUP_RATE, duration=warmup_s, shared_prefix=0.3, seed=seed,
                            lora_mix=tuple((name, LORA_SHARE / adapters) for name in names))
        arrivals = []
        for item in generate(spec, config.model_len):
            req = core.new_request(item.prompt_token_ids, item.output_len, output_len=item.output_len, lora=item.lora)
            arrivals.append((item.arrival, req))
        run_virtual(core, clock, arrivals)
    _put_every_adapter_in_flight(core, clock, names, random.Random(seed))
    return metrics.render().decode()


def _put_every_adapter_in_flight(core: EngineCore, clock: VirtualClock, names: tuple[str, ...],
                                 rng: random.Random) -> None:
    """One long request per adapter, in a shuffled order, stepped until all have reached the scheduler."""
    order = list(names)
    rng.shuffle(order)
    requests = []
    for name in order:
        prompt = [rng.randrange(1 << 40) for _ in range(PROMPT_TOKENS)]
        req = core.new_request(prompt, OUTPUT_TOKENS, output_len=OUTPUT_TOKENS, lora=name)
        core.add_request(req)
        requests.append(req)
    stepped = False
    while not stepped or any(r.status is Status.PENDING for r in requests):
        planned = core.begin_step()
        if planned is None:
            wake = core.next_wakeup()
            if wake is None:
                break
            clock.set(max(clock.now(), wake))
            continue
        clock.advance(planned.duration)
        core.finish_step(planned)
        stepped = True
