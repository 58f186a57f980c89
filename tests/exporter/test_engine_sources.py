"""Adapters against pages built the way each engine's newest source writes them (issue #14).

The saved pages in ../shared predate some of these families and label sets (SGLang's priority label and
retraction counter, trtllm-serve's newer reasons and counters, vLLM 0.33's sleep and admission metrics),
so tests/exporter/engine_pages.py builds them with prometheus_client from the upstream declarations.
"""

from __future__ import annotations

import math

import pytest

from exporter import adapters
from exporter.adapters.base import normalize_finished_reason
from exporter.exposition import render
from exporter.model import NormSample
from exporter.promtext import parse
from llmslo import conventions as c
from tests.exporter import engine_pages as pages

IDENTITY = {"pod": "pod-a", "namespace": "llm", "node": "gpu-node-1", "model": "configured-model"}


def run(text: str, kind: str) -> list[NormSample]:
    adapter = adapters.get(kind)
    return adapter.adapt(parse(text, adapter.wanted), {**IDENTITY, "engine": kind})


def pick(samples: list[NormSample], metric: c.MetricDef, suffix: str = "", **labels: str) -> list[NormSample]:
    return [s for s in samples if s.metric == metric and s.suffix == suffix
            and all(s.labels.get(k) == v for k, v in labels.items())]


def one(samples: list[NormSample], metric: c.MetricDef, suffix: str = "", **labels: str) -> float:
    found = pick(samples, metric, suffix, **labels)
    assert len(found) == 1, f"{metric.name}{suffix} {labels}: {len(found)} samples"
    return found[0].value


def reasons(samples: list[NormSample]) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in pick(samples, c.REQUESTS_FINISHED):
        out[s.labels[c.LABEL_REASON]] = out.get(s.labels[c.LABEL_REASON], 0.0) + s.value
    return out


# ------------------------------------------------------------------------------------------
# The fail-safe finished-reason mapping
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("raw", "normalized"), [
    ("stop", "stop"), ("LENGTH", "length"), ("abort", "abort"), ("error", "error"), ("repetition", "stop"),
    ("cancelled", "abort"), ("canceled", "abort"), ("timeout", "error"),
    # unknown, new, empty or placeholder reasons are failures, never successes
    ("something-new", "error"), ("", "error"), ("unknown", "error"), ("not_finished", "error"),
])
def test_finished_reasons_are_fail_safe(raw, normalized):
    assert normalize_finished_reason(raw) == normalized
    assert normalized in c.FINISHED_REASONS


def test_an_engines_own_spellings_extend_the_mapping_without_changing_others():
    extra = {"not_finished": c.FINISHED_COMPLETED}
    assert normalize_finished_reason("not_finished", extra) == "completed"
    assert normalize_finished_reason("stop", extra) == "stop"
    assert normalize_finished_reason("brand-new", extra) == "error"


def test_unknown_reasons_burn_the_availability_sli():
    """Every reason a page can carry ends in a bucket; the ones we do not know land in a bad one."""
    for raw in ("made_up", "timeout", "KILLED", " "):
        assert normalize_finished_reason(raw) in c.FINISHED_BAD_REASONS


# ------------------------------------------------------------------------------------------
# trtllm-serve: finished reasons from tensorrt_llm/executor/result.py
# ------------------------------------------------------------------------------------------
def test_trtllm_serve_timeout_and_unknown_reasons_are_errors_not_successes():
    text = pages.trtllm_serve_page({"stop": 50, "length": 7, "cancelled": 3, "timeout": 4, "not_finished": 6,
                                    "some_future_reason": 2})
    s = run(text, "trtllm-serve")
    assert reasons(s) == {"stop": 50, "length": 7, "abort": 3, "error": 4 + 2, "completed": 6}
    assert one(s, c.REQUESTS_FINISHED, reason="error", model=pages.LLAMA) == 6


def test_trtllm_serve_undefined_model_name_falls_back_to_the_identity():
    s = run(pages.trtllm_serve_page({"stop": 5}, model_name="undefined"), "trtllm-serve")
    assert {x.labels[c.LABEL_MODEL] for x in s} == {"configured-model"}
    assert one(s, c.REQUESTS_FINISHED, reason="stop") == 5


# ------------------------------------------------------------------------------------------
# vLLM: FinishReason (stop, length, abort, error, repetition); anything else is an error
# ------------------------------------------------------------------------------------------
def test_vllm_reasons_and_an_unknown_one():
    s = run(pages.vllm_page(reasons={"stop": 9, "length": 2, "abort": 1, "error": 1, "repetition": 3, "novel": 4}),
            "vllm")
    assert reasons(s) == {"stop": 12, "length": 2, "abort": 1, "error": 5}


# ------------------------------------------------------------------------------------------
# TGI: err="dropped" is a client that went away
# ------------------------------------------------------------------------------------------
def test_tgi_dropped_is_abort_and_every_other_failure_is_error():
    s = run(pages.tgi_page({"dropped": 4, "validation": 2, "overloaded": 1, "generation": 1, "incomplete": 1,
                            "template": 1, "brand_new": 3}), "tgi")
    assert reasons(s) == {"completed": 10, "abort": 4, "error": 2 + 1 + 1 + 1 + 1 + 3}


def test_tgi_without_dropped_requests_has_no_abort_series():
    s = run(pages.tgi_page({"validation": 2}), "tgi")
    assert reasons(s) == {"completed": 10, "error": 2}


# ------------------------------------------------------------------------------------------
# SGLang 0.5: priority scheduling, retractions
# ------------------------------------------------------------------------------------------
def test_sglang_priority_totals_are_read_once_not_summed_with_their_breakdown():
    text = pages.sglang_page(priority=True, running={"": 5, "0": 3, "1": 2}, queued={"": 4, "0": 1, "7": 3},
                             grammar_queue=1)
    assert 'priority=""' in text and 'priority="7"' in text
    s = run(text, "sglang")
    assert one(s, c.REQUESTS_RUNNING, model=pages.LLAMA) == 5  # not 10
    assert one(s, c.REQUESTS_WAITING, model=pages.LLAMA) == 4 + 1  # not 8 + 1: the grammar queue is separate
    assert all("priority" not in x.labels for x in s)


def test_sglang_without_priority_scheduling_reads_the_plain_gauges():
    s = run(pages.sglang_page(priority=False, running={"": 5}, queued={"": 4}), "sglang")
    assert one(s, c.REQUESTS_RUNNING) == 5 and one(s, c.REQUESTS_WAITING) == 4


def test_sglang_per_request_metrics_under_priorities_are_summed():
    """Tokenizer metrics are written once per request under its own priority: all of them count."""
    text = pages.sglang_page(priority=True, running={"": 0}, ttft_by_priority={"0": [0.05, 0.3], "1": [0.5, 3.0, 5.0]})
    s = run(text, "sglang")
    assert one(s, c.TTFT, "_count") == 5
    assert one(s, c.TTFT, "_sum") == pytest.approx(8.85)
    ttft = {float(x.labels["le"]): x.value for x in pick(s, c.TTFT, "_bucket")}
    assert ttft[0.1] == 1 and ttft[0.6] == 3 and ttft[4.0] == 4 and ttft[math.inf] == 5


def test_sglang_retractions_are_preemptions():
    s = run(pages.sglang_page(running={"": 1}, retracted_total=17, retracted_gauge=2), "sglang")
    assert one(s, c.PREEMPTIONS, model=pages.LLAMA) == 17  # the counter, not the point-in-time gauge


def test_sglang_without_the_retraction_counter_has_no_preemptions():
    s = run(pages.sglang_page(running={"": 1}, retracted_gauge=2), "sglang")
    assert pick(s, c.PREEMPTIONS) == []


# ------------------------------------------------------------------------------------------
# The output of these pages stays lint-clean
# ------------------------------------------------------------------------------------------
def test_output_of_the_built_pages_is_promtool_clean():
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian package prometheus) is not installed")
    samples: list[NormSample] = []
    for text, kind in (
        (pages.sglang_page(priority=True, running={"": 5, "0": 5}, queued={"": 1}, retracted_total=3), "sglang"),
        (pages.tgi_page({"dropped": 1, "validation": 1}), "tgi"),
        (pages.trtllm_serve_page({"stop": 1, "timeout": 1}), "trtllm-serve"),
        (pages.vllm_page(reasons={"stop": 1}), "vllm"),
    ):
        samples += run(text, kind)
    proc = subprocess.run([promtool, "check", "metrics"], input=render(samples), capture_output=True, timeout=30)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()
