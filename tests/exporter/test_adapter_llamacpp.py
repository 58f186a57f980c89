"""The llama.cpp adapter against pages built the way llama.cpp's server writes them (engine_pages.llamacpp_page,
from tools/server/server-task.cpp @ 0c1e570): what maps, what does not, detection, and the page's own rounding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from exporter import adapters
from exporter.adapters import llamacpp
from exporter.promtext import parse_page
from llmslo import conventions as c
from tests.exporter import engine_pages as pages

REPO = Path(__file__).resolve().parents[2]
IDENTITY = {"pod": "llama-0", "namespace": "llm", "node": "node-1", "model": "tiny-llama", "engine": "llamacpp"}
LABELS = {"engine": "llamacpp", "model": "tiny-llama", "pod": "llama-0", "namespace": "llm", "node": "node-1"}


def normalized(text: str) -> dict[tuple[str, str, frozenset], float]:
    out = {}
    for s in llamacpp.adapt(parse_page(text, llamacpp.WANTED).families, IDENTITY):
        key = (s.metric.name, s.suffix, frozenset(s.labels.items()))
        assert key not in out
        out[key] = s.value
    return out


def series(**values: float) -> dict[tuple[str, str, frozenset], float]:
    return {(getattr(c, name).name, "", frozenset(LABELS.items())): v for name, v in values.items()}


def labelled(metric: c.MetricDef, label: str, values: dict[str, float]) -> dict[tuple[str, str, frozenset], float]:
    return {(metric.name, "", frozenset({**LABELS, label: key}.items())): v for key, v in values.items()}


def waiting(n: float) -> dict[tuple[str, str, frozenset], float]:
    """llama.cpp's deferred requests wait for a free slot: all of them wait for capacity."""
    return labelled(c.REQUESTS_WAITING_BY_REASON, c.LABEL_REASON, {"capacity": n})


def test_a_busy_page_maps_slots_queue_tokens_and_the_prompt_cache():
    page = pages.llamacpp_page(prompt_decoded=85, prompt_cached=31, predicted=21, processing=4, deferred=3,
                               prompt_us=14_347, predicted_us=5_149, n_decode=59, n_busy_slots=171, n_tokens_max=58,
                               prompt_rate=5924.58, predicted_rate=3690.04)
    assert normalized(page) == series(
        REQUESTS_RUNNING=4, REQUESTS_WAITING=3,
        PROMPT_TOKENS=85 + 31,  # decoded plus reused: every prompt token of the requests
        PREFIX_CACHE_QUERIES=85 + 31, PREFIX_CACHE_HITS=31, PROMPT_TOKENS_CACHED=31,
        GENERATION_TOKENS=21, SPEC_DRAFT_TOKENS=0, SPEC_ACCEPTED_TOKENS=0, SPEC_DRAFTS=0,  # the server writes them always
    ) | waiting(3)


def test_nothing_the_server_does_not_have_is_emitted():
    """No latency histogram, no KV gauge, no finished reasons; busy time, decode calls, the sequence-length maximum
    and the per-scrape throughput gauges stay unmapped. The speculative-decoding counters map (vLLM's names)."""
    page = pages.llamacpp_page(prompt_decoded=10, prompt_cached=0, predicted=5, prompt_us=2_000_000,
                               predicted_us=3_000_000, n_decode=40, n_busy_slots=80, n_tokens_max=4096,
                               prompt_rate=99.5, predicted_rate=12.25, drafts=(30, 20, 10), accepted_per_pos=(12, 8))
    got = normalized(page)
    assert got == series(REQUESTS_RUNNING=0, REQUESTS_WAITING=0, PROMPT_TOKENS=10, PREFIX_CACHE_QUERIES=10,
                         PREFIX_CACHE_HITS=0, PROMPT_TOKENS_CACHED=0, GENERATION_TOKENS=5,
                         SPEC_DRAFT_TOKENS=30, SPEC_ACCEPTED_TOKENS=20, SPEC_DRAFTS=10) | waiting(0) | labelled(
        c.SPEC_ACCEPTED_BY_POSITION, c.LABEL_POSITION, {"0": 12, "1": 8})
    assert all(name.startswith(c.LLAMACPP.PREFIX) for name in llamacpp.WANTED)
    assert c.LLAMACPP.N_TOKENS_MAX not in llamacpp.WANTED and c.LLAMACPP.PROMPT_TOKENS_SECONDS not in llamacpp.WANTED


def test_a_page_without_the_cached_counter_gives_decoded_prompt_tokens_and_no_prefix_cache():
    page = pages.llamacpp_page(prompt_decoded=700, prompt_cached=None, predicted=64, processing=1)
    assert "prompt_tokens_cached" not in page
    assert normalized(page) == series(REQUESTS_RUNNING=1, REQUESTS_WAITING=0, PROMPT_TOKENS=700, GENERATION_TOKENS=64,
                                      SPEC_DRAFT_TOKENS=0, SPEC_ACCEPTED_TOKENS=0, SPEC_DRAFTS=0) | waiting(0)


def test_counters_over_a_million_are_the_pages_six_significant_digits():
    """The server writes doubles through a stringstream: 6 significant digits, so 1,234,567 tokens read 1.23457e+06.
    The exporter passes on what the page says; the counter moves in steps of 10 tokens past a million."""
    page = pages.llamacpp_page(prompt_decoded=1_234_567, prompt_cached=7_654_321, predicted=2_000_001)
    assert "llamacpp:prompt_tokens_total 1.23457e+06" in page.splitlines()
    assert "llamacpp:tokens_predicted_total 2e+06" in page.splitlines()
    got = normalized(page)
    assert got == series(REQUESTS_RUNNING=0, REQUESTS_WAITING=0, PROMPT_TOKENS=1_234_570 + 7_654_320,
                         PREFIX_CACHE_QUERIES=1_234_570 + 7_654_320, PREFIX_CACHE_HITS=7_654_320,
                         PROMPT_TOKENS_CACHED=7_654_320, GENERATION_TOKENS=2_000_000,
                         SPEC_DRAFT_TOKENS=0, SPEC_ACCEPTED_TOKENS=0, SPEC_DRAFTS=0) | waiting(0)


def test_auto_detects_llamacpp_and_no_other_engine_claims_its_families():
    page = pages.llamacpp_page(prompt_decoded=3, predicted=2, processing=1)
    assert adapters.detect(parse_page(page, adapters.WANT_ALL).families) == "llamacpp"
    assert adapters.get("llamacpp") is llamacpp.ADAPTER
    others = [a.kind for a in adapters.ADAPTERS.values() if a.kind != "llamacpp"
              and any(a.claims(name) for name in parse_page(page).families)]
    assert others == []
    # and a llamacpp-looking name does not pull another engine's page to it
    assert adapters.detect(parse_page(pages.tgi_page({"dropped": 1}), adapters.WANT_ALL).families) == "tgi"


def test_the_exporter_detects_a_llamacpp_page_and_labels_it(tmp_path):
    page = tmp_path / "llamacpp.prom"
    page.write_text(pages.llamacpp_page(prompt_decoded=120, prompt_cached=40, predicted=33, processing=2, deferred=1))
    out = subprocess.run([sys.executable, "-m", "exporter", "--once", "--gpu", "off", "--node-name", "n1",
                          "--engine", f"auto=file://{page}", "--log-level", "warning"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("llm_") and not line.startswith("llm_exporter")]
    ident = 'engine="llamacpp",model="",namespace="",node="n1",pod=""'
    assert sorted(lines) == sorted([
        f"llm_requests_running{{{ident}}} 2",
        f"llm_requests_waiting{{{ident}}} 1",
        f'llm_requests_waiting_by_reason{{{ident},reason="capacity"}} 1',
        f"llm_prompt_tokens_cached_total{{{ident}}} 40",
        f"llm_spec_decode_drafts_total{{{ident}}} 0",
        f"llm_spec_decode_draft_tokens_total{{{ident}}} 0",
        f"llm_spec_decode_accepted_tokens_total{{{ident}}} 0",
        f"llm_prompt_tokens_total{{{ident}}} 160",
        f"llm_prefix_cache_queries_total{{{ident}}} 160",
        f"llm_prefix_cache_hits_total{{{ident}}} 40",
        f"llm_generation_tokens_total{{{ident}}} 33",
    ])
    assert f'llm_exporter_target_up{{engine="llamacpp",target="file://{page}"}} 1' in out.stdout
