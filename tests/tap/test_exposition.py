"""The tap's page: the same samples as prometheus_client would write, valid for promtool, rendered in slices."""

from __future__ import annotations

import asyncio
import random
import shutil
import subprocess
from collections.abc import Callable

import aiohttp
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter import promtext
from exporter.adapters import tap as tap_adapter
from exporter.tap import exposition
from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.exposition import PageRenderer
from exporter.tap.metrics import TapMetrics
from exporter.tap.timing import Timings
from exporter.tap.workers import merge_expositions
from llmslo import conventions as C

CONFIG = SloConfig(
    (SloClass("interactive", 0.333, 0.047, ("chat-*",)), SloClass("batch", 7.77, 0.19)),
    {"ttft": (0.333, 7.77), "tpot": (0.047, 0.19), "e2e": (12.3,)},
)
ODD_MODELS = ("chat-a", 'chat-"quoted"', "chat-back\\slash", "chat-ünï")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parsed(page: bytes | str) -> Samples:
    text = page.decode() if isinstance(page, bytes) else page
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in text_string_to_metric_families(text) for s in fam.samples if not s.name.endswith("_created")
    }


def populate(m: TapMetrics, seed: int, n: int = 200, models: tuple[str, ...] = ODD_MODELS) -> None:
    rng = random.Random(seed)
    for _ in range(n):
        outcome = rng.choice((C.OUTCOME_OK, C.OUTCOME_OK, C.OUTCOME_ABORTED, C.OUTCOME_UPSTREAM_TIMEOUT))
        t = Timings(rng.random() / 10, rng.choice((None, rng.random())), rng.random() / 5, rng.random() * 20,
                    rng.randrange(0, 50), rng.choice((C.USAGE_SOURCE_ENGINE, C.USAGE_SOURCE_CHUNKS)))
        m.record(rng.choice(models), rng.choice(("interactive", "batch")), outcome, t, rng.random() < 0.5)
        if rng.random() < 0.05:
            m.usage_rejected(rng.choice(models), "interactive")
        if rng.random() < 0.05:
            m.refused(rng.choice(C.REFUSED_REASONS))


def test_the_page_has_exactly_the_samples_prometheus_client_would_write() -> None:
    m = TapMetrics(CONFIG)
    populate(m, 1)
    page = PageRenderer(m).render_now()
    assert parsed(page) == parsed(generate_latest(m.registry))
    names = {fam.name for fam in text_string_to_metric_families(page.decode())}
    assert names == {d.name.removesuffix("_total") for d in C.TAP_METRICS}


def test_the_page_passes_promtool_also_once_summed_by_the_workers_parent() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is installed by scripts/install-system-deps.sh"
    parts = [TapMetrics(CONFIG), TapMetrics(CONFIG)]
    populate(parts[0], 2)
    populate(parts[1], 3, models=ODD_MODELS[:2])
    pages = [PageRenderer(p).render_now().decode() for p in parts]
    for page in (*pages, merge_expositions(pages), PageRenderer(TapMetrics(CONFIG)).render_now().decode()):
        proc = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_workers_parent_sums_pages_to_what_one_process_would_show() -> None:
    parts, whole = [TapMetrics(CONFIG), TapMetrics(CONFIG)], TapMetrics(CONFIG)
    for seed in (4, 5):
        populate(parts[seed % 2], seed)
        populate(whole, seed)
    merged = parsed(merge_expositions(PageRenderer(p).render_now().decode() for p in parts))
    want = parsed(PageRenderer(whole).render_now())
    assert merged.keys() == want.keys()
    assert merged == pytest.approx(want)


def test_only_series_that_changed_are_rendered_again() -> None:
    m = TapMetrics(CONFIG)
    populate(m, 6)
    r = PageRenderer(m)
    first = r.render_now()
    kept = {key: s.rendered for key, s in m.series.items()}
    assert r.render_now() == first
    t = Timings(0.01, 0.2, 0.01, 1.0, 3, C.USAGE_SOURCE_ENGINE)
    m.record("chat-a", "batch", C.OUTCOME_OK, t, True)
    page = r.render_now()
    for key, s in m.series.items():
        assert (s.rendered is kept[key]) == (key != ("chat-a", "batch")), key
    assert parsed(page) == parsed(generate_latest(m.registry)) != parsed(first)


def test_render_yields_to_the_loop_between_slices_and_each_series_stays_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a zero budget the renderer yields after every series it renders; requests recorded
    meanwhile never leave a series with buckets, sum and count that disagree."""
    monkeypatch.setattr(exposition, "SLICE_S", 0.0)
    m = TapMetrics(CONFIG)
    models = tuple(f"chat-{i}" for i in range(40))
    populate(m, 7, n=400, models=models)
    r = PageRenderer(m)
    stale = sum(1 for s in m.series.values() if s.rendered_at != s.changes)
    turns = 0

    async def go() -> bytes:
        nonlocal turns
        loop = asyncio.get_running_loop()
        rng = random.Random(8)
        done = False

        def meanwhile() -> None:
            nonlocal turns
            if done:
                return
            turns += 1
            t = Timings(0.01, rng.random(), 0.01, rng.random() * 5, 2, C.USAGE_SOURCE_ENGINE)
            m.record(rng.choice(models), rng.choice(("interactive", "batch")), C.OUTCOME_OK, t, True)
            loop.call_soon(meanwhile)

        loop.call_soon(meanwhile)
        page = await r.render()
        done = True
        return page

    page = asyncio.run(go())
    assert stale > 40 and turns >= stale - 1, (stale, turns)
    samples = parsed(page)
    for d in (C.TAP_TTFT, C.TAP_E2E):
        counts = {labels: v for (name, labels), v in samples.items() if name == d.count()}
        for labels, count in counts.items():
            assert samples[(d.bucket(), labels | {("le", "+Inf")})] == count
            series = frozenset(kv for kv in labels if kv[0] != C.LABEL_BUCKETS)  # the histograms' own label
            ok = samples[(C.TAP_REQUESTS.name, series | {("outcome", C.OUTCOME_OK)})]
            assert ok >= count  # TTFT is absent for some completed requests, E2E never
            if d is C.TAP_E2E:
                assert ok == count, "a series' requests and its histograms come from the same moment"


def test_the_node_exporter_passes_every_family_through_with_identity_labels() -> None:
    m = TapMetrics(CONFIG)
    populate(m, 9)
    m.refused(C.REFUSED_HEAD_TIMEOUT)
    fams = promtext.parse_page(PageRenderer(m).render_now().decode()).families
    identity = {"pod": "pod-a", "namespace": "ns", "node": "n1", "model": "pod-model"}
    out = tap_adapter.adapt(fams, identity)
    assert {s.metric for s in out} == set(C.TAP_METRICS)
    refusals = {s.labels["reason"]: s for s in out if s.metric == C.TAP_REFUSALS}
    assert set(refusals) == set(C.REFUSED_REASONS)
    assert refusals[C.REFUSED_HEAD_TIMEOUT].value == m.refusals[C.REFUSED_HEAD_TIMEOUT] >= 1
    # Tap-wide: the pod's identity, with the pod's model, as every normalized series carries one.
    assert refusals[C.REFUSED_HEAD_TIMEOUT].labels == {
        "engine": "tap", "pod": "pod-a", "namespace": "ns", "node": "n1", "model": "pod-model", "reason": "head_timeout",
    }
    rejected = [s for s in out if s.metric == C.TAP_USAGE_REJECTED]
    assert rejected and all(s.labels["model"] in ODD_MODELS and s.labels["slo_class"] == "interactive" for s in rejected)


def test_the_tap_serves_the_page_on_its_metrics_port(stack: Callable) -> None:
    from tests.tap.test_proxy import chat, post

    async def go() -> None:
        async with stack() as st:
            await post(st.tap_url + "/v1/chat/completions", chat())
            async with aiohttp.ClientSession() as s, s.get(st.metrics_url + "/metrics") as resp:
                assert resp.headers["Content-Type"] == exposition.CONTENT_TYPE
                page = await resp.read()
            got = parsed(page)
            assert got == parsed(generate_latest(st.server.metrics.registry))
            assert got[(C.TAP_REQUESTS.name, frozenset({("model", "chat-a"), ("slo_class", "default"),
                                                        ("outcome", "ok")}))] == 1

    asyncio.run(go())
