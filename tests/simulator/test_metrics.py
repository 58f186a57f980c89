"""The simulator's /metrics page against vLLM's own (names, types, HELP, labels, bucket edges) and its arithmetic."""

from __future__ import annotations

import pytest

from exporter.promtext import parse_page
from llmslo.conventions import VLLM as V
from simulator.metrics import token_buckets
from simulator.virtual import simulate
from simulator.workload import WorkloadSpec

REQUIRED = (
    V.KV_CACHE_USAGE_PERC, V.NUM_REQUESTS_RUNNING, V.NUM_REQUESTS_WAITING, V.NUM_PREEMPTIONS, V.PREFIX_CACHE_QUERIES,
    V.PREFIX_CACHE_HITS, V.TTFT, V.ITL, V.REQUEST_TPOT, V.E2E, V.QUEUE_TIME, V.PREFILL_TIME, V.DECODE_TIME,
    V.PROMPT_TOKENS, V.GENERATION_TOKENS, V.REQUEST_SUCCESS, V.CACHE_CONFIG_INFO, V.LORA_REQUESTS_INFO,
)


@pytest.fixture(scope="module")
def page_run():
    """A busy virtual run (preemptions, prefix hits, LoRA, an abort share) with vLLM's max_model_len of the sample."""
    from simulator.config import EngineConfig
    from simulator.faults import FaultState

    config = EngineConfig(max_model_len=4096, lora_adapters=("sql-lora", "tool-lora"), max_loras=1,
                          num_gpu_blocks_override=600)
    spec = WorkloadSpec(rate=15, duration=20, shared_prefix=0.4, lora_mix=(("sql-lora", 0.2), ("tool-lora", 0.1)),
                        seed=12)
    run = simulate(config, spec, metrics=True, faults=FaultState(error_rate=0.05, error_mode="abort"))
    return run, parse_page(run.metrics.render().decode()).families


def _labels(fam) -> set[str]:
    return {k for s in fam.samples for k in s.labels if k != "le"}


def _edges(fam) -> list[str]:
    first = None
    out = []
    for s in fam.samples:
        if s.name.endswith("_bucket"):
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            first = first or key
            if key == first:
                out.append(s.labels["le"])
    return out


def test_every_family_matches_vllm_v1_names_types_help_labels_and_buckets(page_run, shared_dir):
    _, ours = page_run
    vllm = parse_page((shared_dir / "peers" / "engine-metrics" / "vllm-v1.prom").read_text()).families
    for name in REQUIRED:
        assert name in ours, f"simulator does not emit {name}"
    for name, fam in ours.items():
        if name.endswith("_created"):
            continue
        assert name in vllm, f"{name} is not a vLLM V1 family"
        theirs = vllm[name]
        assert fam.type == theirs.type, name
        assert fam.help == theirs.help, name
        assert _labels(fam) == _labels(theirs), name
        if fam.type == "histogram":
            assert [float(e) for e in _edges(fam)] == [float(e) for e in _edges(theirs)], name


def test_token_buckets_follow_vllms_1_2_5_rule():
    assert token_buckets(4096) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert token_buckets(8192)[-1] == 5000


def test_histogram_counts_equal_finished_requests_and_counters_add_up(page_run):
    run, fam = page_run

    def total(name: str, suffix: str = "", **labels: str) -> float:
        return sum(s.value for s in fam[name].samples
                   if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items()))

    records = run.recorder.records
    finished = total(V.REQUEST_SUCCESS, "_total")
    assert finished == len(records) > 200
    aborted = total(V.REQUEST_SUCCESS, "_total", finished_reason="abort")
    assert aborted == sum(1 for r in records if not r.ok) > 0
    for name in (V.E2E, V.QUEUE_TIME, V.PREFILL_TIME, V.DECODE_TIME, V.INFERENCE_TIME, V.REQUEST_TPOT,
                 V.REQUEST_PROMPT_TOKENS, V.REQUEST_GENERATION_TOKENS, V.REQUEST_NUM_PREEMPTIONS):
        assert total(name, "_count") == finished, name
    generated = sum(r.output_tokens for r in records)
    assert total(V.GENERATION_TOKENS, "_total") == generated == total(V.REQUEST_GENERATION_TOKENS, "_sum")
    assert total(V.TTFT, "_count") == sum(1 for r in records if r.output_tokens > 0)
    assert total(V.ITL, "_count") == generated - total(V.TTFT, "_count")
    assert total(V.PROMPT_TOKENS, "_total") == (
        total(V.PROMPT_TOKENS_BY_SOURCE, "_total", source="local_compute")
        + total(V.PROMPT_TOKENS_BY_SOURCE, "_total", source="local_cache_hit")
    )
    assert total(V.NUM_PREEMPTIONS, "_total") == run.summary["preemptions"] > 0
    assert total(V.REQUEST_NUM_PREEMPTIONS, "_sum") == total(V.NUM_PREEMPTIONS, "_total")
    hits, queries = total(V.PREFIX_CACHE_HITS, "_total"), total(V.PREFIX_CACHE_QUERIES, "_total")
    assert 0.25 < hits / queries < 0.6  # above 0.4: resumed preempted requests find their own blocks
    e2e = [r.e2e for r in records]
    assert total(V.E2E, "_sum") == pytest.approx(sum(e2e))
    config = fam[V.CACHE_CONFIG_INFO].samples[0].labels
    assert config["num_gpu_blocks"] == "600" and config["block_size"] == "16"
    assert config["enable_prefix_caching"] == "True"


def test_lora_info_keeps_stale_series_with_their_timestamps(page_run):
    _, fam = page_run
    series = fam[V.LORA_REQUESTS_INFO].samples
    assert len(series) > 1  # every combination seen stays, as in vLLM
    assert all(s.labels["max_lora"] == "1" for s in series)
    assert all("," not in s.labels["running_lora_adapters"] for s in series)  # one slot: never two running
    assert {s.labels["running_lora_adapters"] for s in series} >= {"sql-lora", "tool-lora"}
