"""Tap metrics: names from conventions, every threshold an exact bucket edge, bounded model labels."""

from __future__ import annotations

import random

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.metrics import LATENCY_LADDER, OVERFLOW_MODEL, TapMetrics, le_label
from exporter.tap.timing import Timings
from llmslo import conventions as C

# Thresholds off every ladder, including ones that are not exactly representable in binary.
CONFIG = SloConfig(
    (SloClass("interactive", 0.333, 0.047, ("chat-*",)), SloClass("batch", 7.77, 0.19)),
    {"ttft": (0.333, 0.35, 7.77), "tpot": (0.047, 0.19), "e2e": (12.3,)},
)


def samples(m: TapMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(m.registry).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def ok(ttft: float, tpot: float, e2e: float = 1.0, n: int = 10) -> Timings:
    return Timings(0.001, ttft, tpot, e2e, n, C.USAGE_SOURCE_ENGINE)


def test_every_threshold_is_a_bucket_edge() -> None:
    m = TapMetrics(CONFIG)
    for t in (0.333, 0.35, 7.77):
        assert t in m.edges["ttft"] and t in m.edges["ttfb"]
    assert {0.047, 0.19} <= set(m.edges["tpot"]) and 12.3 in m.edges["e2e"]
    assert set(LATENCY_LADDER) <= set(m.edges["ttft"])
    m.record("chat-a", "interactive", C.OUTCOME_OK, ok(0.2, 0.01), True)
    s = samples(m)
    key = lambda name, le: (name, (("le", le), ("model", "chat-a"), ("slo_class", "interactive")))  # noqa: E731
    assert key(C.TAP_TTFT.bucket(), le_label(0.333)) in s
    assert key(C.TAP_TPOT.bucket(), "0.047") in s
    assert key(C.TAP_E2E.bucket(), "12.3") in s


def test_bucket_at_threshold_over_count_is_the_exact_sli() -> None:
    m = TapMetrics(CONFIG)
    rng = random.Random(3)
    values = [rng.choice([0.333, 0.3329, 0.3331, rng.uniform(0, 1)]) for _ in range(500)]
    for v in values:
        m.record("chat-a", "interactive", C.OUTCOME_OK, ok(v, 0.01), False)
    s = samples(m)
    labels = (("model", "chat-a"), ("slo_class", "interactive"))
    within = s[(C.TAP_TTFT.bucket(), (("le", "0.333"),) + labels)]
    count = s[(C.TAP_TTFT.count(), labels)]
    assert count == 500
    assert within == sum(1 for v in values if v <= 0.333)


def test_counters_by_outcome_goodput_and_tokens() -> None:
    m = TapMetrics(CONFIG)
    m.record("chat-a", "interactive", C.OUTCOME_OK, ok(0.1, 0.01, n=7), True)
    m.record("chat-a", "interactive", C.OUTCOME_OK, ok(0.9, 0.01, n=5), False)
    m.record("chat-a", "interactive", C.OUTCOME_ABORTED, Timings(0.001, 0.1, 0.0, None, 2, C.USAGE_SOURCE_CHUNKS), False)
    m.record("chat-a", "interactive", C.OUTCOME_UPSTREAM_ERROR, Timings(None, None, None, 0.01, 0, C.USAGE_SOURCE_CHUNKS), False)
    s = samples(m)
    base = (("model", "chat-a"), ("slo_class", "interactive"))
    req = lambda o: s[(C.TAP_REQUESTS.name, base[:1] + (("outcome", o),) + base[1:])]  # noqa: E731
    assert (req("ok"), req("aborted"), req("upstream_error")) == (2, 1, 1)
    assert s[(C.GOODPUT_REQUESTS.name, base)] == 1
    tokens = lambda name, src: s[(name, base + (("usage_source", src),))]  # noqa: E731
    assert tokens(C.OUTPUT_TOKENS.name, "usage") == 12
    assert tokens(C.OUTPUT_TOKENS.name, "chunks") == 2  # delivered before the abort
    assert tokens(C.GOODPUT_TOKENS.name, "usage") == 7
    # Latency histograms describe completed requests only.
    assert s[(C.TAP_TTFT.count(), base)] == 2


def test_model_label_values_are_bounded() -> None:
    m = TapMetrics(CONFIG, max_models=3)
    labels = [m.model_label(f"m{i}") for i in range(10)]
    assert labels[:3] == ["m0", "m1", "m2"] and set(labels[3:]) == {OVERFLOW_MODEL}
    assert m.model_label("m1") == "m1"


def test_families_are_the_conventions_tap_metrics() -> None:
    m = TapMetrics(CONFIG)
    m.record("x", "batch", C.OUTCOME_OK, ok(0.1, 0.01), True)
    names = {fam.name for fam in text_string_to_metric_families(generate_latest(m.registry).decode())}
    expected = {d.name.removesuffix("_total") for d in C.TAP_METRICS}
    assert expected <= names
