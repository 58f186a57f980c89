"""The exporter's vLLM adapter reads the simulator's /metrics with nothing lost.

The page is taken mid-run (requests running and waiting, LoRA adapters busy, preemptions done, some finished
and some aborted), so every gauge, counter and histogram carries a value worth checking.
"""

from __future__ import annotations

import math
import random

import pytest

from exporter import adapters
from exporter.promtext import parse_page
from llmslo import conventions as c
from llmslo.conventions import VLLM as V
from simulator.clock import VirtualClock
from simulator.config import EngineConfig
from simulator.engine import EngineCore
from simulator.faults import FaultState
from simulator.metrics import VllmMetrics

IDENTITY = {"engine": "vllm", "pod": "sim-0", "namespace": "llm", "node": "node-a"}


@pytest.fixture(scope="module")
def mid_run_page() -> tuple[EngineCore, str]:
    clock = VirtualClock()
    config = EngineConfig(max_model_len=2048, num_gpu_blocks_override=150, lora_adapters=("sql", "tool", "chat"),
                          max_loras=2, max_num_seqs=24)
    core = EngineCore(config, clock, faults=FaultState(error_rate=0.2, error_mode="abort"))
    metrics = VllmMetrics(core)
    rng = random.Random(3)
    for i in range(60):
        prompt = list(range(1000 * i, 1000 * i + rng.randint(50, 400)))
        req = core.new_request(prompt, rng.randint(5, 120), ignore_eos=True,
                               lora=rng.choice([None, None, "sql", "tool", "chat"]))
        core.add_request(req)
    clock.advance(1.0)
    aborted = metrics.success["abort"]
    for _ in range(2000):  # step until the page has aborts and preemptions to show
        planned = core.begin_step()
        assert planned is not None
        clock.advance(planned.duration)
        core.finish_step(planned)
        if aborted._value.get() >= 2 and core.scheduler.num_preemptions >= 2:
            break
    return core, metrics.render().decode()


def _sim(families, name: str, suffix: str = "", **labels: str) -> float:
    return math.fsum(s.value for s in families[name].samples
                     if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()))


def _norm(samples, metric: c.MetricDef, suffix: str = "", **labels: str) -> list[float]:
    return [s.value for s in samples
            if s.metric is metric and s.suffix == suffix and all(s.labels.get(k) == v for k, v in labels.items())]


def test_vllm_adapter_reads_the_simulator_page_with_nothing_lost(mid_run_page, shared_dir):
    core, text = mid_run_page
    adapter = adapters.get("vllm")
    everything = parse_page(text).families
    families = parse_page(text, adapter.wanted).families
    out = adapter.adapt(families, IDENTITY)
    model = core.config.model_name

    # The page is busy: every value below is a real check, not 0 == 0.
    assert _sim(everything, V.NUM_REQUESTS_RUNNING) > 0 and _sim(everything, V.NUM_REQUESTS_WAITING) > 0
    assert _sim(everything, V.NUM_PREEMPTIONS, "_total") > 0
    assert _sim(everything, V.REQUEST_SUCCESS, "_total", finished_reason="abort") > 0

    # The simulator emits every V1 family the adapter reads (the rest of `wanted` are older vLLM names), but the
    # speculative-decoding ones: vLLM writes them only with a draft model, which the simulator does not model.
    v1 = parse_page((shared_dir / "peers" / "engine-metrics" / "vllm-v1.prom").read_text()).families
    spec = {V.SPEC_DRAFTS, V.SPEC_DRAFT_TOKENS, V.SPEC_ACCEPTED_TOKENS, V.SPEC_ACCEPTED_PER_POS}
    assert spec <= set(v1) and not spec & set(everything)
    assert adapter.wanted & set(v1) - spec <= set(everything), sorted((adapter.wanted & set(v1)) - spec - set(everything))

    # Identity labels on every output series.
    for s in out:
        for label in c.ENGINE_IDENTITY_LABELS:
            assert label in s.labels, (s.name, label)
        assert s.labels[c.LABEL_MODEL] == model and s.labels[c.LABEL_POD] == "sim-0"
        assert s.labels[c.LABEL_ENGINE] == "vllm"

    scalars = (
        (c.REQUESTS_RUNNING, V.NUM_REQUESTS_RUNNING, ""),
        (c.REQUESTS_WAITING, V.NUM_REQUESTS_WAITING, ""),
        (c.KV_CACHE_USAGE, V.KV_CACHE_USAGE_PERC, ""),
        (c.PREEMPTIONS, V.NUM_PREEMPTIONS, "_total"),
        (c.PREFIX_CACHE_QUERIES, V.PREFIX_CACHE_QUERIES, "_total"),
        (c.PREFIX_CACHE_HITS, V.PREFIX_CACHE_HITS, "_total"),
        (c.PROMPT_TOKENS, V.PROMPT_TOKENS, "_total"),
        (c.GENERATION_TOKENS, V.GENERATION_TOKENS, "_total"),
    )
    for norm, vllm_name, suffix in scalars:
        assert _norm(out, norm) == [pytest.approx(_sim(everything, vllm_name, suffix))], (norm.name, vllm_name)

    for reason in ("stop", "length", "abort", "error"):
        got = sum(_norm(out, c.REQUESTS_FINISHED, reason=reason))
        want = _sim(everything, V.REQUEST_SUCCESS, "_total", finished_reason=reason)
        if reason == "stop":
            want += _sim(everything, V.REQUEST_SUCCESS, "_total", finished_reason="repetition")
        assert got == want, reason

    for norm, vllm_name in ((c.TTFT, V.TTFT), (c.ITL, V.ITL), (c.TPOT, V.REQUEST_TPOT), (c.E2E, V.E2E),
                            (c.QUEUE_TIME, V.QUEUE_TIME)):
        theirs = {float(s.labels["le"]): s.value for s in everything[vllm_name].samples if s.name.endswith("_bucket")}
        ours = {float(s.labels["le"]): s.value for s in out if s.metric is norm and s.suffix == "_bucket"}
        assert ours == theirs, norm.name
        assert _norm(out, norm, "_count") == [_sim(everything, vllm_name, "_count")], norm.name
        assert _norm(out, norm, "_sum") == [pytest.approx(_sim(everything, vllm_name, "_sum"))], norm.name

    cfg = core.config
    usable = cfg.num_gpu_blocks - 1  # the simulator sets a null block aside, as vLLM V1 does
    assert _norm(out, c.KV_BLOCKS_TOTAL) == [usable]
    assert _norm(out, c.KV_BLOCK_SIZE) == [cfg.block_size]
    usage = _sim(everything, V.KV_CACHE_USAGE_PERC)
    assert _norm(out, c.KV_BLOCKS_FREE) == [round(usable * (1 - usage))] == [core.kv.num_free_blocks]

    running = core.scheduler.running_loras()
    waiting = core.scheduler.waiting_loras()
    assert running, "the page should show LoRA adapters running"
    assert _norm(out, c.LORA_ADAPTERS_MAX) == [cfg.max_loras]
    assert _norm(out, c.LORA_ADAPTERS_RUNNING) == [len(running)]
    assert _norm(out, c.LORA_ADAPTERS_WAITING) == [len(waiting)]
    active = {(s.labels[c.LABEL_ADAPTER], s.labels[c.LABEL_LORA_STATE]) for s in out if s.metric is c.LORA_ADAPTER_ACTIVE}
    assert active == {(a, c.LORA_STATE_RUNNING) for a in running} | {(a, c.LORA_STATE_WAITING) for a in waiting}
