"""`--genai-names`: the tap's TTFT, TPOT and request duration also under the OpenTelemetry GenAI names and buckets
(llmslo.genai), with the same counts as the tap's own histograms; absent without the option."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from prometheus_client import generate_latest

from exporter import promtext
from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.exposition import PageRenderer
from exporter.tap.genai import operation
from exporter.tap.metrics import TapMetrics
from exporter.tap.timing import Timings
from exporter.tap.workers import merge_expositions
from llmslo import conventions as C
from llmslo import genai as G
from llmslo.gofloat import client_float

SLO = SloConfig((SloClass("chat", 0.5, 0.05, ("chat-*",)),), {})
SAME = ((G.SERVER_TTFT, C.TAP_TTFT), (G.SERVER_TPOT, C.TAP_TPOT), (G.SERVER_REQUEST_DURATION, C.TAP_E2E))


async def _post(url: str, path: str, stream: bool, **headers: str) -> int:
    body = {"model": "chat-a", "stream": stream}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"})
    async with aiohttp.ClientSession() as s, s.post(url + path, data=json.dumps(body), headers=headers) as r:
        await r.read()
        return r.status


async def _page(stack: Callable, genai: bool) -> str:
    async with stack(slo=SLO, genai_names=genai) as st:
        chat, text = "/v1/chat/completions", "/v1/completions"
        await asyncio.gather(*(_post(st.tap_url, chat, True, **{"x-test-first-ms": str(5 * i), "x-test-delay-ms": "2"})
                               for i in range(6)))
        await _post(st.tap_url, chat, False)
        await _post(st.tap_url, text, True, **{"x-test-chunks": "3"})
        assert await _post(st.tap_url, chat, True, **{"x-test-status": "500"}) == 500
        async with aiohttp.ClientSession() as s, s.get(st.metrics_url + "/metrics") as r:
            return await r.text()


def _samples(page: str) -> list[Any]:
    return [s for fam in promtext.parse_page(page).families.values() for s in fam.samples]


def _value(samples: list[Any], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def test_with_the_option_the_page_has_the_genai_families_with_the_tap_histograms_counts(stack: Callable) -> None:
    page = asyncio.run(_page(stack, True))
    samples = _samples(page)
    for genai, d in SAME:
        assert f"# TYPE {genai.name} histogram" in page
        for op in (G.OPERATION_CHAT, G.OPERATION_TEXT_COMPLETION):
            ours = {G.LABEL_OPERATION: op, G.LABEL_REQUEST_MODEL: "chat-a", G.LABEL_RESPONSE_MODEL: "chat-a",
                    G.LABEL_PROVIDER: G.PROVIDER_OPENAI}
            ok = [s for s in samples if s.name == genai.count() and s.labels == ours]
            assert len(ok) == 1, (genai.name, op)
        # The tap's own count (every class) equals the GenAI count without error_type, for every family.
        want = _value(samples, d.count(), model="chat-a")
        got = sum(s.value for s in samples if s.name == genai.count() and G.LABEL_ERROR_TYPE not in s.labels)
        assert got == want > 0, genai.name
        assert sum(s.value for s in samples if s.name == genai.sum() and G.LABEL_ERROR_TYPE not in s.labels) == \
            pytest.approx(_value(samples, d.sum(), model="chat-a"))
    # The convention's bucket edges (TTFT to 60 s, as Envoy AI Gateway), each series' whole ladder.
    for d, edges in ((G.SERVER_TTFT, G.TTFT_EDGES), (G.SERVER_TPOT, G.TPOT_EDGES), (G.SERVER_REQUEST_DURATION, G.REQUEST_DURATION_EDGES)):
        les = [s.labels["le"] for s in samples if s.name == d.bucket()
               and s.labels[G.LABEL_OPERATION] == G.OPERATION_CHAT and G.LABEL_ERROR_TYPE not in s.labels]
        assert les == [client_float(e) for e in edges] + ["+Inf"], d.name
    assert G.TTFT_EDGES[-1] == 60.0
    # The chat requests: 6 streamed + 1 not (no TTFT) + the completion's stream; the 500 only under error_type.
    assert _value(samples, G.SERVER_TTFT.count(), gen_ai_operation_name="chat") == 6
    assert _value(samples, G.SERVER_REQUEST_DURATION.count(), error_type=C.OUTCOME_UPSTREAM_ERROR) == 1
    assert not any(s.labels.get(G.LABEL_ERROR_TYPE) for s in samples if s.name in (G.SERVER_TTFT.count(), G.SERVER_TPOT.count()))


def test_without_the_option_no_genai_family_is_on_the_page(stack: Callable) -> None:
    page = asyncio.run(_page(stack, False))
    assert "gen_ai_" not in page
    assert _value(_samples(page), C.TAP_TTFT.count()) == 7  # the requests were timed all the same


def _record(m: TapMetrics, i: int) -> None:
    t = Timings(0.01, 0.02 * i, 0.001 * i, 0.5 + i, 3, C.USAGE_SOURCE_ENGINE)
    outcome = C.OUTCOME_OK if i % 5 else C.OUTCOME_ABORTED
    m.record("chat-a", "chat", outcome, t, True, "/v1/completions" if i % 3 == 0 else "/v1/chat/completions")


def test_the_page_and_the_registry_agree_and_workers_pages_sum() -> None:
    parts, whole = [TapMetrics(SLO, genai=True), TapMetrics(SLO, genai=True)], TapMetrics(SLO, genai=True)
    for i in range(40):
        _record(parts[i % 2], i)
        _record(whole, i)
    page = PageRenderer(whole).render_now().decode()
    registry = generate_latest(whole.registry).decode()

    def genai(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v))): s.value for s in _samples(text)
                if s.name.startswith("gen_ai_") and not s.name.endswith("_created")}

    assert genai(page) == pytest.approx(genai(registry)) and len(genai(page)) > 0
    merged = merge_expositions(PageRenderer(p).render_now().decode() for p in parts)
    assert genai(merged) == pytest.approx(genai(page))
    # A series' lines are rendered again once it changed, and only then.
    renderer = PageRenderer(whole)
    first = renderer.render_now()
    assert renderer.render_now() == first
    _record(whole, 1)
    assert renderer.render_now() != first


@pytest.mark.parametrize(("path", "op"), [
    ("/v1/chat/completions", "chat"), ("/v1/completions?x=1", "text_completion"), ("/v1/completions", "text_completion"),
])
def test_operation_names(path: str, op: str) -> None:
    assert operation(path) == op


def test_a_bad_outcome_has_its_error_type_and_a_neutral_one_is_left_out() -> None:
    m = TapMetrics(SLO, genai=True)
    t = Timings(0.01, None, None, 0.3, 0, C.USAGE_SOURCE_CHUNKS)
    for outcome in C.OUTCOMES:
        if outcome != C.OUTCOME_OK:
            m.record("chat-a", "chat", outcome, t, False, "/v1/chat/completions")
    samples = _samples(PageRenderer(m).render_now().decode())
    got = {s.labels.get(G.LABEL_ERROR_TYPE) for s in samples if s.name == G.SERVER_REQUEST_DURATION.count()}
    assert got == set(C.TAP_BAD_OUTCOMES)
    assert not any(s.name == G.SERVER_TTFT.count() for s in samples)
