"""Collector, exposition and guard: real sample pages through the real parser and adapters,
checked by promtool and by prometheus_client's parser reading our own output back."""

from __future__ import annotations

import asyncio
import math
import re
import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter import adapters, promtext
from exporter.adapters import Adapter
from exporter.collector import Collector, Snapshot
from exporter.config import ExporterConfig, Limits, TargetConfig
from exporter.exposition import render
from exporter.gpu import FakeProvider
from exporter.guard import (
    DUPLICATE_SERIES,
    INVALID_HISTOGRAM,
    LORA_ADAPTER_LIMIT,
    SERIES_LIMIT,
    CardinalityGuard,
)
from exporter.model import NormSample
from exporter.series import complete_histogram
from exporter.sources.http import new_session
from llmslo import conventions as c
from llmslo.gofloat import go_g as go_float

NODE = "node-a"


def collect(targets: list[TargetConfig], *, cycles: int = 1, provider=None, limits: Limits = Limits()) -> list[Snapshot]:
    async def go() -> list[Snapshot]:
        config = ExporterConfig(targets=tuple(targets), interval_s=5, limits=limits)
        async with new_session() as session:
            collector = Collector(config, session, provider, NODE)
            return [await collector.collect(config.targets) for _ in range(cycles)]

    return asyncio.run(go())


def promtool_problems(body: bytes) -> list[str]:
    assert shutil.which("promtool"), "promtool (Debian package prometheus) is needed: make system-deps"
    proc = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, timeout=30)
    problems = [line for line in (proc.stdout + proc.stderr).decode().splitlines() if line.strip()]
    assert proc.returncode in (0, 3), problems  # 1 would be a parse failure: worse than lint
    return problems


def families_of(body: bytes):
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def self_metric(snapshot: Snapshot, metric: c.MetricDef, **labels: str) -> float:
    found = [s.value for s in snapshot.samples if s.metric.name == metric.name
             and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (metric.name, labels, found)
    return found[0]


def check_histograms_and_counters(body: bytes) -> None:
    """Every histogram series cumulative, ending in +Inf equal to _count; counters end in _total."""
    defined = c.by_name()
    for fam in text_string_to_metric_families(body.decode()):
        if fam.type == "counter":
            assert fam.name + "_total" in defined, fam.name
            assert all(s.name.endswith("_total") for s in fam.samples), fam.name
            continue
        assert fam.name in defined, f"{fam.name} is not defined in llmslo.conventions"
        if fam.type != "histogram":
            continue
        series: dict[tuple, dict] = {}
        for s in fam.samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            entry = series.setdefault(key, {"buckets": [], "count": None})
            if s.name.endswith("_bucket"):
                entry["buckets"].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                entry["count"] = s.value
        assert series, fam.name
        for key, entry in series.items():
            edges = [e for e, _ in entry["buckets"]]
            counts = [v for _, v in entry["buckets"]]
            assert edges == sorted(edges) and edges[-1] == math.inf, (fam.name, key)
            assert counts == sorted(counts), (fam.name, key, counts)
            assert entry["count"] == counts[-1], (fam.name, key)


# --------------------------------------------------------------------------------------
# Real pages end to end
# --------------------------------------------------------------------------------------
def test_every_sample_page_renders_clean_for_promtool_and_prometheus_client(sample_pages):
    for page, kind in sample_pages.items():
        [snap] = collect([TargetConfig(kind=kind, url=page.as_uri(), name=page.name)])
        [status] = snap.targets
        assert status.up and status.reason == "", (page.name, status)
        assert status.series > 10, (page.name, status.series)
        body = render(snap.samples)
        assert promtool_problems(body) == [], page.name
        check_histograms_and_counters(body)


def test_vllm_values_and_identity_labels_reach_the_output(pages_dir):
    target = TargetConfig(kind="vllm", url=(pages_dir / "vllm-v1.prom").as_uri(), name="vllm-0",
                          pod="vllm-0", namespace="llm")
    snap1, snap2 = collect([target], cycles=2)
    fams = families_of(render(snap2.samples))
    [running] = fams[c.REQUESTS_RUNNING.name].samples
    assert running.value == 3.0  # vllm:num_requests_running ... 3.0 on the page
    assert running.labels == {"engine": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "pod": "vllm-0",
                              "namespace": "llm", "node": NODE}
    [kv] = fams[c.KV_CACHE_USAGE.name].samples
    assert kv.value == pytest.approx(0.16335)
    assert self_metric(snap2, c.EXPORTER_TARGET_UP, target="vllm-0", engine="vllm") == 1
    assert self_metric(snap2, c.EXPORTER_PARSE_ERRORS, target="vllm-0") == 0
    assert self_metric(snap1, c.EXPORTER_CYCLES) == 1 and self_metric(snap2, c.EXPORTER_CYCLES) == 2
    assert not [s for s in snap2.samples if s.metric.name == c.EXPORTER_LAST_ERROR.name]  # never failed


def test_output_with_fake_gpus_passes_promtool(pages_dir):
    target = TargetConfig(kind="vllm", url=(pages_dir / "vllm-v1.prom").as_uri())
    [snap] = collect([target], provider=FakeProvider(2))
    body = render(snap.samples)
    assert snap.gpus_up == 2
    assert sum(1 for s in snap.samples if s.metric.name == c.GPU_UP.name) == 2
    assert promtool_problems(body) == []
    check_histograms_and_counters(body)


# --------------------------------------------------------------------------------------
# Exposition format
# --------------------------------------------------------------------------------------
def test_render_escapes_label_values_and_is_deterministic():
    weird = 'a "quoted" \\ back\nslash'
    samples = [
        NormSample(c.REQUESTS_WAITING, {"engine": "vllm", "model": weird, "pod": "", "namespace": "", "node": "n"}, 2),
        NormSample(c.REQUESTS_RUNNING, {"engine": "vllm", "model": "m", "pod": "", "namespace": "", "node": "n"}, 1),
    ]
    body = render(samples)
    assert body == render(list(reversed(samples)))
    text = body.decode()
    assert text.index(c.REQUESTS_RUNNING.name) < text.index(c.REQUESTS_WAITING.name)  # families sorted by name
    assert f"# HELP {c.REQUESTS_RUNNING.name} {c.REQUESTS_RUNNING.help}" in text
    assert f"# TYPE {c.REQUESTS_RUNNING.name} gauge" in text
    fams = families_of(body)
    assert fams[c.REQUESTS_WAITING.name].samples[0].labels["model"] == weird
    assert promtool_problems(body) == []


def test_bucket_edges_are_sorted_numerically_and_written_like_prometheus():
    labels = {"engine": "vllm", "model": "m", "pod": "", "namespace": "", "node": "n"}
    edges = ["1.0", "10.0", "2.5", "1e-05", "1000000", "+Inf"]
    counts = {"1e-05": 0, "1.0": 1, "2.5": 2, "10.0": 3, "1000000": 4, "+Inf": 5}
    samples = [NormSample(c.TTFT, {**labels, "le": e}, counts[e], "_bucket") for e in edges]
    samples += [NormSample(c.TTFT, dict(labels), 9.5, "_sum"), NormSample(c.TTFT, dict(labels), 5, "_count")]
    lines = [ln for ln in render(samples).decode().splitlines() if not ln.startswith("#")]
    assert [re.search(r'le="([^"]+)"', ln).group(1) for ln in lines[:6]] == ["1e-05", "1", "2.5", "10", "1e+06", "+Inf"]
    assert lines[6].startswith(c.TTFT.name + "_sum") and lines[7].startswith(c.TTFT.name + "_count")


@pytest.mark.parametrize("value, text", [
    (1.0, "1"), (0.005, "0.005"), (1e6, "1e+06"), (123456.0, "123456"), (1234567.0, "1.234567e+06"),
    (1.7672256e9, "1.7672256e+09"), (1e-5, "1e-05"), (0.0001, "0.0001"), (-3.25, "-3.25"),
    (math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN"), (0.0, "0"),
])
def test_go_float_matches_gos_shortest_g_format(value, text):
    assert go_float(value) == text


def test_complete_histogram_fills_inf_and_count_and_rejects_broken_ones():
    labels = {"model": "m"}

    def b(le, v):
        return NormSample(c.TTFT, {**labels, "le": le}, v, "_bucket")

    total = NormSample(c.TTFT, dict(labels), 4, "_count")
    fixed = complete_histogram([b("0.5", 1), b("1", 3), total])
    assert [(s.suffix, s.labels.get("le"), s.value) for s in fixed] == [
        ("_bucket", "0.5", 1), ("_bucket", "1", 3), ("_bucket", "+Inf", 4), ("_count", None, 4)]
    fixed = complete_histogram([b("+Inf", 7), b("1", 3)])
    assert fixed[-1].suffix == "_count" and fixed[-1].value == 7
    assert complete_histogram([b("0.5", 5), b("1", 3), b("+Inf", 5)]) is None  # not cumulative
    assert complete_histogram([b("fast", 1), b("+Inf", 1)]) is None  # edge is not a number
    assert complete_histogram([b("0.5", 1)]) is None  # neither +Inf nor _count
    whole = [b("0.5", 1), b("+Inf", 4), NormSample(c.TTFT, dict(labels), 2.5, "_sum"), total]
    assert complete_histogram(whole) is whole  # complete and in order already: kept as it is
    shuffled = [whole[2], whole[1], whole[3], whole[0]]
    assert complete_histogram(shuffled) == whole  # put in that order otherwise
    twice = [*whole[:3], NormSample(c.TTFT, dict(labels), 9, "_count"), total]
    assert complete_histogram(twice) == whole  # a repeated _count: the last one, once


def _fake_adapter(monkeypatch, kind: str, adapt) -> None:
    real = adapters.get(kind)
    monkeypatch.setitem(adapters.ADAPTERS, kind, Adapter(kind=kind, wanted=real.wanted, adapt=adapt))


def test_broken_histogram_from_an_adapter_is_dropped_and_counted(monkeypatch, pages_dir):
    real = adapters.get("vllm")

    def adapt_then_break(families, identity):
        out = real.adapt(families, identity)
        for s in out:  # make the TTFT histogram non-cumulative
            if s.metric.name == c.TTFT.name and s.suffix == "_bucket" and s.labels.get("le") == "0.001":
                s.value = 1e9
        return out

    _fake_adapter(monkeypatch, "vllm", adapt_then_break)
    [snap] = collect([TargetConfig(kind="vllm", url=(pages_dir / "vllm-v1.prom").as_uri(), name="v")])
    names = {s.metric.name for s in snap.samples}
    assert c.TTFT.name not in names and c.E2E.name in names
    assert self_metric(snap, c.EXPORTER_SERIES_DROPPED, target="v", reason=INVALID_HISTOGRAM) > 0


def test_an_adapter_that_raises_takes_down_only_its_target(monkeypatch, pages_dir):
    def explode(families, identity):
        raise RuntimeError("adapter bug")

    _fake_adapter(monkeypatch, "tgi", explode)
    [snap] = collect([
        TargetConfig(kind="tgi", url=(pages_dir / "tgi.prom").as_uri(), name="tgi"),
        TargetConfig(kind="vllm", url=(pages_dir / "vllm-v1.prom").as_uri(), name="vllm"),
    ])
    status = {t.target: t for t in snap.targets}
    assert status["tgi"].reason == "adapter_error" and not status["tgi"].up
    assert status["vllm"].up
    assert self_metric(snap, c.EXPORTER_LAST_ERROR, target="tgi", engine="tgi", reason="adapter_error") == 1


# --------------------------------------------------------------------------------------
# auto detection
# --------------------------------------------------------------------------------------
def test_auto_detects_every_engine_and_then_parses_only_what_its_adapter_reads(monkeypatch, sample_pages):
    wants: list[frozenset | None] = []
    real_parse = promtext.parse_page

    def recording_parse(text, want=None, **kw):
        wants.append(frozenset(want) if want is not None else None)
        return real_parse(text, want, **kw)

    monkeypatch.setattr(promtext, "parse_page", recording_parse)
    for page, kind in sample_pages.items():
        wants.clear()
        snap1, snap2 = collect([TargetConfig(kind="auto", url=page.as_uri(), name="t")], cycles=2)
        assert [t.engine for t in snap2.targets] == [kind], page.name
        assert self_metric(snap2, c.EXPORTER_TARGET_UP, target="t", engine=kind) == 1
        engine_labels = {s.labels.get("engine") for s in snap2.samples if s.metric in c.ENGINE_METRICS}
        assert engine_labels == {kind}, page.name
        assert wants == [adapters.WANT_ALL, adapters.get(kind).wanted], page.name  # detected once, then cached


def test_auto_marks_a_page_of_no_known_engine_down(tmp_path):
    page = tmp_path / "other.prom"
    page.write_text("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n")
    [snap] = collect([TargetConfig(kind="auto", url=page.as_uri(), name="x")])
    assert snap.targets[0].reason == "unknown_engine"


# --------------------------------------------------------------------------------------
# Cardinality guard
# --------------------------------------------------------------------------------------
def _labels(**extra):
    return {"engine": "vllm", "model": "m", "pod": "", "namespace": "", "node": "n", **extra}


def test_series_cap_keeps_whole_histograms_and_counts_the_rest():
    hist = [NormSample(c.TTFT, _labels(le=le), 1, "_bucket") for le in ("0.1", "1", "+Inf")]
    hist += [NormSample(c.TTFT, _labels(), 0.5, "_sum"), NormSample(c.TTFT, _labels(), 1, "_count")]
    gauges = [NormSample(c.REQUESTS_RUNNING, _labels(), 1), NormSample(c.REQUESTS_WAITING, _labels(), 0)]
    guard = CardinalityGuard(Limits(max_series_per_target=4, max_lora_adapters_per_target=10))
    kept = guard.apply("t", hist + gauges)
    assert kept == gauges  # the 5-line histogram does not fit in 4: all of it goes, none of it is cut
    assert guard.dropped() == {("t", SERIES_LIMIT): 5}
    guard.apply("t", hist + gauges)
    assert guard.dropped() == {("t", SERIES_LIMIT): 10}  # a counter: it accumulates
    guard.forget(["other"])
    assert guard.dropped() == {}


def test_lora_cap_keeps_the_same_adapters_every_cycle():
    names = [5, 1, 9, 3]
    guard = CardinalityGuard(Limits(max_series_per_target=100, max_lora_adapters_per_target=2))
    for order in (names, list(reversed(names))):
        samples = [NormSample(c.LORA_ADAPTER_ACTIVE, _labels(adapter=f"lora-{i:02d}", state="running"), 1) for i in order]
        kept = guard.apply("t", samples)
        assert sorted(s.labels["adapter"] for s in kept) == ["lora-01", "lora-03"]
    assert guard.dropped() == {("t", LORA_ADAPTER_LIMIT): 4}


def test_lora_cap_on_a_real_vllm_page(pages_dir):
    target = TargetConfig(kind="vllm", url=(pages_dir / "vllm-v1.prom").as_uri(), name="v")
    [full] = collect([target])
    adapters_seen = sorted({s.labels[c.LABEL_ADAPTER] for s in full.samples if s.labels.get(c.LABEL_ADAPTER)})
    assert len(adapters_seen) >= 2, adapters_seen
    [capped] = collect([target], limits=Limits(max_lora_adapters_per_target=1))
    kept = {s.labels[c.LABEL_ADAPTER] for s in capped.samples if s.labels.get(c.LABEL_ADAPTER)}
    assert kept == {adapters_seen[0]}
    assert self_metric(capped, c.EXPORTER_SERIES_DROPPED, target="v", reason=LORA_ADAPTER_LIMIT) > 0


def test_series_cap_applies_to_a_real_page_and_is_reported(pages_dir):
    target = TargetConfig(kind="vllm", url=(pages_dir / "vllm-v1.prom").as_uri(), name="v")
    [full] = collect([target])
    engine_series = full.targets[0].series
    [capped] = collect([target], limits=Limits(max_series_per_target=20))
    assert 0 < capped.targets[0].series <= 20
    dropped = self_metric(capped, c.EXPORTER_SERIES_DROPPED, target="v", reason=SERIES_LIMIT)
    assert dropped == engine_series - capped.targets[0].series
    assert promtool_problems(render(capped.samples)) == []


def test_two_targets_producing_the_same_series_keep_it_once(pages_dir):
    url = (pages_dir / "vllm-v1.prom").as_uri()
    [snap] = collect([TargetConfig(kind="vllm", url=url, name="a"), TargetConfig(kind="vllm", url=url, name="b")])
    body = render(snap.samples)
    series = [ln for ln in body.decode().splitlines() if ln.startswith("llm_requests_running{")]
    assert len(series) == 1
    assert self_metric(snap, c.EXPORTER_SERIES_DROPPED, target="b", reason=DUPLICATE_SERIES) == snap.targets[1].series
    assert self_metric(snap, c.EXPORTER_SERIES_DROPPED, target="a", reason=DUPLICATE_SERIES) == 0
    assert promtool_problems(body) == []
