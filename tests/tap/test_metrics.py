"""Tap metrics: names from conventions, every threshold an exact bucket edge, bounded model labels."""

from __future__ import annotations

import random

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.metrics import HISTOGRAMS, LATENCY_LADDER, OVERFLOW_MODEL, TapMetrics, le_label
from exporter.tap.models import MAX_LABEL_CHARS, ModelNames, ServedModels
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
    ids = dict(zip((d.name for d, _ in HISTOGRAMS), m.bucket_ids, strict=True))
    key = lambda d, le: (d.bucket(), (("buckets", ids[d.name]), ("le", le), ("model", "chat-a"),  # noqa: E731
                                      ("slo_class", "interactive")))
    assert key(C.TAP_TTFT, le_label(0.333)) in s
    assert key(C.TAP_TPOT, "0.047") in s
    assert key(C.TAP_E2E, "12.3") in s


def test_bucket_at_threshold_over_count_is_the_exact_sli() -> None:
    m = TapMetrics(CONFIG)
    rng = random.Random(3)
    values = [rng.choice([0.333, 0.3329, 0.3331, rng.uniform(0, 1)]) for _ in range(500)]
    for v in values:
        m.record("chat-a", "interactive", C.OUTCOME_OK, ok(v, 0.01), False)
    s = samples(m)
    labels = (("buckets", m.bucket_ids[0]), ("model", "chat-a"), ("slo_class", "interactive"))
    within = s[(C.TAP_TTFT.bucket(), labels[:1] + (("le", "0.333"),) + labels[1:])]
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
    assert s[(C.TAP_TTFT.count(), (("buckets", m.bucket_ids[0]),) + base)] == 2


def _served(*names: str) -> ServedModels:
    """A model list as if read from the upstream (never fetched: refresh_s=0)."""
    served = ServedModels("http://127.0.0.1:1", refresh_s=0)
    served.names = frozenset(names)
    return served


def test_model_label_admits_served_names_and_class_globs_only() -> None:
    m = TapMetrics(CONFIG, names=ModelNames(CONFIG, _served("llama-3-8b", "sql-lora")))
    assert [m.model_label(x) for x in ("llama-3-8b", "sql-lora", "chat-x", "made-up", "")] == [
        "llama-3-8b", "sql-lora", "chat-x", OVERFLOW_MODEL, OVERFLOW_MODEL,
    ]
    # A glob match, but too long, or with characters that would corrupt the page.
    assert m.model_label("chat-" + "x" * MAX_LABEL_CHARS) == OVERFLOW_MODEL
    assert m.model_label("chat-" + "x" * (MAX_LABEL_CHARS - 5)) == "chat-" + "x" * (MAX_LABEL_CHARS - 5)
    assert m.model_label('chat-"a\\b') == 'chat-"a\\b'  # printable: the page escapes it
    assert [m.model_label(x) for x in ("chat-a\n", "chat-\ud800", "chat-\x00", "x" * (1 << 20))] == [OVERFLOW_MODEL] * 4


def test_without_a_model_list_only_class_globs_are_admitted() -> None:
    m = TapMetrics(CONFIG)  # as before the first successful read of /v1/models
    assert (m.model_label("chat-a"), m.model_label("llama-3-8b")) == ("chat-a", OVERFLOW_MODEL)


def test_model_label_values_are_bounded_even_among_served_names() -> None:
    m = TapMetrics(CONFIG, max_models=3, names=ModelNames(CONFIG, _served(*(f"m{i}" for i in range(10)))))
    labels = [m.model_label(f"m{i}") for i in range(10)]
    assert labels[:3] == ["m0", "m1", "m2"] and set(labels[3:]) == {OVERFLOW_MODEL}
    assert m.model_label("m1") == "m1"


def test_an_upstream_model_called_like_the_overflow_bucket_keeps_its_own_series() -> None:
    """A served `__other__` is not merged into the overflow bucket: names starting `__` get one more `_`."""
    m = TapMetrics(CONFIG, names=ModelNames(CONFIG, _served("__other__", "___other__", "__x")))
    labels = [m.model_label(x) for x in ("__other__", "___other__", "__x", "made-up")]
    assert labels == ["___other__", "____other__", "___x", OVERFLOW_MODEL]
    t = Timings(0.01, 0.1, 0.01, 0.2, 3, C.USAGE_SOURCE_ENGINE)
    m.record(m.model_label("__other__"), "interactive", C.OUTCOME_OK, t, True)
    m.record(m.model_label("made-up"), "interactive", C.OUTCOME_OK, t, True)
    m.usage_rejected(m.model_label("__other__"), "interactive")  # a label it returned stays that label
    assert m.series[("___other__", "interactive")].goodput == 1
    assert m.series[("___other__", "interactive")].usage_rejected == 1
    assert m.series[(OVERFLOW_MODEL, "interactive")].goodput == 1


def test_refusals_exist_from_the_start_and_count_by_reason() -> None:
    m = TapMetrics(CONFIG)
    s = samples(m)
    assert {dict(k[1])["reason"]: v for k, v in s.items() if k[0] == C.TAP_REFUSALS.name} == dict.fromkeys(
        C.REFUSED_REASONS, 0.0
    )
    m.refused(C.REFUSED_BODY_TOO_LARGE)
    m.refused(C.REFUSED_BODY_TOO_LARGE)
    m.refused(C.REFUSED_MALFORMED)
    s = samples(m)
    got = {dict(k[1])["reason"]: v for k, v in s.items() if k[0] == C.TAP_REFUSALS.name}
    assert got == {**dict.fromkeys(C.REFUSED_REASONS, 0.0), C.REFUSED_BODY_TOO_LARGE: 2.0, C.REFUSED_MALFORMED: 1.0}
    with pytest.raises(ValueError):
        m.refused("made_up")


def test_usage_rejected_counts_per_model_and_class_under_a_bounded_label() -> None:
    m = TapMetrics(CONFIG)
    assert not [k for k in samples(m) if k[0] == C.TAP_USAGE_REJECTED.name], "no series before the first"
    m.usage_rejected("chat-a", "interactive")
    m.usage_rejected(m.model_label("chat-a"), "interactive")
    m.usage_rejected("x" * 10_000, "batch")  # a request's own name goes through model_label()
    s = samples(m)
    assert s[(C.TAP_USAGE_REJECTED.name, (("model", "chat-a"), ("slo_class", "interactive")))] == 2
    assert s[(C.TAP_USAGE_REJECTED.name, (("model", OVERFLOW_MODEL), ("slo_class", "batch")))] == 1


def test_families_are_the_conventions_tap_metrics() -> None:
    m = TapMetrics(CONFIG)
    m.record("x", "batch", C.OUTCOME_OK, ok(0.1, 0.01), True)
    names = {fam.name for fam in text_string_to_metric_families(generate_latest(m.registry).decode())}
    expected = {d.name.removesuffix("_total") for d in C.TAP_METRICS}
    assert expected == names


# ------------------------------------------------------------------------------ the first event counts (#26)


def _requests(m: TapMetrics, model: str, slo_class: str) -> dict[str, float]:
    return {dict(labels)[C.LABEL_OUTCOME]: v for (name, labels), v in samples(m).items()
            if name == C.TAP_REQUESTS.name and dict(labels)[C.LABEL_MODEL] == model
            and dict(labels)[C.LABEL_SLO_CLASS] == slo_class}


def test_every_class_and_served_model_has_its_series_at_0_before_its_first_request() -> None:
    """rate() and increase() never count a series' first sample: a series born at 1 hides its first
    request (at 6 requests an hour, the only failure). Before any request, the page shows every outcome of
    every class under __other__, and every served model under the class its name maps to, at 0."""
    served = _served("chat-small", "plain")
    m = TapMetrics(CONFIG, names=ModelNames(CONFIG, served))
    for cls in ("interactive", "batch"):
        assert _requests(m, OVERFLOW_MODEL, cls) == dict.fromkeys(C.OUTCOMES, 0)
    assert _requests(m, "chat-small", "interactive") == dict.fromkeys(C.OUTCOMES, 0)
    fallback = CONFIG.class_for_model("plain").name  # no glob matches it: the fallback class
    assert _requests(m, "plain", fallback) == dict.fromkeys(C.OUTCOMES, 0)
    good = {(n, dict(l)[C.LABEL_SLO_CLASS]) for (n, l), _ in samples(m).items()
            if n == C.GOODPUT_REQUESTS.name and dict(l)[C.LABEL_MODEL] == "chat-small"}
    assert good == {(C.GOODPUT_REQUESTS.name, "interactive")}
    # A model the upstream starts serving later is admitted (and at 0) by the next page.
    served.names = frozenset({"chat-small", "plain", "chat-new"})
    assert _requests(m, "chat-new", "interactive") == dict.fromkeys(C.OUTCOMES, 0)


def test_a_series_born_with_its_first_request_has_every_other_outcome_at_0() -> None:
    m = TapMetrics(CONFIG)
    m.record("chat-x", "batch", C.OUTCOME_OK, ok(0.1, 0.01), True)
    assert _requests(m, "chat-x", "batch") == {**dict.fromkeys(C.OUTCOMES, 0), C.OUTCOME_OK: 1}
    m.record("chat-x", "batch", C.OUTCOME_UPSTREAM_ERROR, ok(0.1, 0.01), False)
    assert _requests(m, "chat-x", "batch")[C.OUTCOME_UPSTREAM_ERROR] == 1
