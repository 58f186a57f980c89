"""The HTTP server against real clients on loopback: the official openai client, aiohttp streams, /metrics."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import aiohttp
import openai
import pytest

from exporter.promtext import parse_page
from llmslo.conventions import VLLM as V
from simulator.faults import FaultState


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)


def _metrics(url: str) -> dict:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return parse_page(resp.read().decode()).families


def _value(families: dict, family: str, suffix: str = "", **labels: str) -> float:
    total = 0.0
    for s in families[family].samples:
        if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items()):
            total += s.value
    return total


def _post_json(url: str, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# ---------------------------------------------------------------------------- openai client
@pytest.mark.parametrize("include_usage", [False, True])
def test_openai_chat_streaming(sim_server, quick_cost, include_usage):
    srv = sim_server(cost_params=quick_cost)
    kwargs = {"stream_options": {"include_usage": True}} if include_usage else {}
    stream = _client(srv.url).chat.completions.create(
        model=srv.server.config.model_name, messages=[{"role": "user", "content": "tell me a story"}],
        max_tokens=12, stream=True, extra_body={"ignore_eos": True}, **kwargs,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and not chunks[0].choices[0].delta.content
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content) == 12 and all(piece.startswith(" ") for piece in content)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    if include_usage:
        assert chunks[-1].choices == []
        assert chunks[-1].usage.completion_tokens == 12
        assert chunks[-1].usage.prompt_tokens == 4 + 3  # 4 words + <user> <end> <assistant>
    else:
        assert all(c.usage is None for c in chunks)


@pytest.mark.parametrize("include_usage", [False, True])
def test_openai_completions_streaming(sim_server, quick_cost, include_usage):
    srv = sim_server(cost_params=quick_cost)
    kwargs = {"stream_options": {"include_usage": True}} if include_usage else {}
    stream = _client(srv.url).completions.create(
        model=srv.server.config.model_name, prompt="one two three four", max_tokens=7, stream=True,
        extra_body={"ignore_eos": True}, **kwargs,
    )
    chunks = list(stream)
    text = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert len(text) == 7
    assert chunks[-1 if not include_usage else -2].choices[0].finish_reason == "length"
    if include_usage:
        assert chunks[-1].usage.prompt_tokens == 4 and chunks[-1].usage.completion_tokens == 7


def test_openai_non_streaming_and_natural_stops(sim_server, quick_cost):
    srv = sim_server(cost_params=quick_cost, output_len_median=3)
    client = _client(srv.url)
    model = srv.server.config.model_name
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=200)
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason == "stop"  # stopped by itself, well before max_tokens
    assert chat.usage.completion_tokens == len(chat.choices[0].message.content.split()) < 200
    comp = client.completions.create(model=model, prompt="a b c", max_tokens=4, extra_body={"ignore_eos": True})
    assert comp.usage.completion_tokens == 4 and len(comp.choices[0].text.split()) == 4
    assert comp.choices[0].finish_reason == "length"


def test_generated_text_is_deterministic_per_seed(sim_server, quick_cost):
    def texts(seed: int) -> list[str]:
        srv = sim_server(cost_params=quick_cost, seed=seed)
        client = _client(srv.url)
        return [
            client.completions.create(model=srv.server.config.model_name, prompt="a b c", max_tokens=6,
                                      extra_body={"ignore_eos": True}).choices[0].text
            for _ in range(2)
        ]

    first = texts(seed=1)
    assert first[0] != first[1]  # each request its own words
    assert texts(seed=1) == first  # the same seed, the same words
    assert texts(seed=2) != first


def test_models_lora_and_errors(sim_server, quick_cost):
    srv = sim_server(cost_params=quick_cost, lora_adapters=("sql", "chat"), max_loras=1)
    client = _client(srv.url)
    listed = [m.id for m in client.models.list().data]
    assert listed == [srv.server.config.model_name, "sql", "chat"]
    out = client.completions.create(model="sql", prompt="select", max_tokens=3, extra_body={"ignore_eos": True})
    assert out.model == "sql" and out.usage.completion_tokens == 3
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="nope", prompt="x", max_tokens=3)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model="sql", prompt="x", max_tokens=10_000)
    status, body = _post_json(srv.url, "/v1/completions", {"prompt": "x", "max_tokens": 2, "stream_options": {}})
    assert status == 400 and "stream=True" in body["error"]["message"]


def test_health_and_state(sim_server):
    srv = sim_server()
    with urllib.request.urlopen(srv.url + "/health", timeout=5) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(srv.url + "/admin/state", timeout=5) as resp:
        state = json.loads(resp.read())
    assert state["running"] == 0 and state["kv_blocks"] == srv.server.config.num_gpu_blocks


# ---------------------------------------------------------------------------- metrics vs streams
async def _stream_words(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, bool]:
    """Content chunks received and whether [DONE] arrived."""
    words, done = 0, False
    async with session.post(url, json=body) as resp:
        assert resp.status == 200
        async for raw in resp.content:
            line = raw.strip()
            if line == b"data: [DONE]":
                done = True
            elif line.startswith(b"data: "):
                for choice in json.loads(line[6:])["choices"]:
                    if choice.get("text") or (choice.get("delta") or {}).get("content"):
                        words += 1
    return words, done


def test_tokens_streamed_equal_generation_tokens_and_histogram_counts_equal_finished(sim_server, quick_cost):
    srv = sim_server(cost_params=quick_cost, output_len_median=8, lora_adapters=("a",), max_loras=1)

    async def drive() -> list[tuple[int, bool]]:
        async with aiohttp.ClientSession() as session:
            jobs = []
            for i in range(16):
                chat = i % 2 == 0
                body = {"model": "a" if i % 4 == 1 else srv.server.config.model_name, "stream": True,
                        "max_tokens": 5 + i}
                if chat:
                    body["messages"] = [{"role": "user", "content": "word " * (20 + i)}]
                else:
                    body["prompt"] = "word " * (20 + i)
                path = "/v1/chat/completions" if chat else "/v1/completions"
                jobs.append(_stream_words(session, srv.url + path, body))
            return await asyncio.gather(*jobs)

    results = asyncio.run(drive())
    assert all(done for _, done in results)
    streamed = sum(words for words, _ in results)
    fam = _metrics(srv.url)
    assert _value(fam, V.GENERATION_TOKENS, "_total") == streamed
    finished = _value(fam, V.REQUEST_SUCCESS, "_total")
    assert finished == 16
    assert _value(fam, V.REQUEST_SUCCESS, "_total", finished_reason="abort") == 0
    for hist in (V.E2E, V.QUEUE_TIME, V.REQUEST_TPOT, V.PREFILL_TIME, V.DECODE_TIME, V.INFERENCE_TIME,
                 V.REQUEST_PROMPT_TOKENS, V.REQUEST_GENERATION_TOKENS, V.TTFT):
        assert _value(fam, hist, "_count") == finished, hist
        assert _value(fam, hist, "_bucket", le="+Inf") == finished, hist
    assert _value(fam, V.REQUEST_GENERATION_TOKENS, "_sum") == streamed
    assert _value(fam, V.ITL, "_count") == streamed - finished  # one ITL per token after the first
    assert _value(fam, V.PROMPT_TOKENS, "_total") == _value(fam, V.REQUEST_PROMPT_TOKENS, "_sum")
    assert _value(fam, V.NUM_REQUESTS_RUNNING) == 0 and _value(fam, V.KV_CACHE_USAGE_PERC) == 0
    lora = [s.labels for s in fam[V.LORA_REQUESTS_INFO].samples]
    assert any(labels["running_lora_adapters"] == "a" for labels in lora)
    assert all(labels["max_lora"] == "1" for labels in lora)


def test_client_disconnect_aborts_the_request(sim_server, quick_cost):
    srv = sim_server(cost_params=quick_cost)

    async def read_two_then_leave() -> None:
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "hello", "max_tokens": 500, "stream": True, "ignore_eos": True}
            async with session.post(srv.url + "/v1/completions", json=body) as resp:
                seen = 0
                async for raw in resp.content:
                    if raw.startswith(b"data: "):
                        seen += 1
                        if seen == 2:
                            break
        await asyncio.sleep(0)

    asyncio.run(read_two_then_leave())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        fam = _metrics(srv.url)
        if _value(fam, V.REQUEST_SUCCESS, "_total", finished_reason="abort") == 1:
            break
        time.sleep(0.05)
    assert _value(fam, V.REQUEST_SUCCESS, "_total", finished_reason="abort") == 1
    assert _value(fam, V.NUM_REQUESTS_RUNNING) == 0
    assert _value(fam, V.GENERATION_TOKENS, "_total") < 500


# ---------------------------------------------------------------------------- faults
def _mean_itl(url: str) -> tuple[float, float]:
    fam = _metrics(url)
    return _value(fam, V.ITL, "_sum"), _value(fam, V.ITL, "_count")


def test_slowdown_raises_inter_token_latency(sim_server, quick_cost):
    srv = sim_server(cost_params=quick_cost)
    client = _client(srv.url)
    model = srv.server.config.model_name

    def run_one() -> None:
        client.completions.create(model=model, prompt="a b", max_tokens=10, extra_body={"ignore_eos": True})

    run_one()
    s0, c0 = _mean_itl(srv.url)
    status, state = _post_json(srv.url, "/admin/faults", {"slowdown": 4})
    assert status == 200 and state["slowdown"] == 4.0
    run_one()
    s1, c1 = _mean_itl(srv.url)
    base, slow = s0 / c0, (s1 - s0) / (c1 - c0)
    assert 2.5 < slow / base < 5.5, (base, slow)


def test_http500_fault_and_engine_error_count(sim_server, quick_cost):
    srv = sim_server(cost_params=quick_cost, faults=FaultState(error_rate=1.0, error_mode="http500"))
    client = _client(srv.url)
    with pytest.raises(openai.InternalServerError):
        client.completions.create(model=srv.server.config.model_name, prompt="x", max_tokens=3)
    fam = _metrics(srv.url)
    assert _value(fam, V.REQUEST_SUCCESS, "_total", finished_reason="error") == 1
    assert _value(fam, V.E2E, "_count") == 1
    _post_json(srv.url, "/admin/faults", {"reset": True})
    out = client.completions.create(model=srv.server.config.model_name, prompt="x", max_tokens=3)
    assert out.usage.completion_tokens >= 1


def test_abort_fault_breaks_the_stream_midway(sim_server, quick_cost):
    srv = sim_server(cost_params=quick_cost)
    status, _ = _post_json(srv.url, "/admin/faults", {"error_rate": 1.0, "error_mode": "abort"})
    assert status == 200

    async def one() -> tuple[int, bool, str]:
        words, done, error = 0, False, ""
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "x y", "max_tokens": 20, "stream": True, "ignore_eos": True}
            try:
                async with session.post(srv.url + "/v1/completions", json=body) as resp:
                    async for raw in resp.content:
                        if raw.startswith(b"data: [DONE]"):
                            done = True
                        elif raw.startswith(b"data: "):
                            words += 1
            except aiohttp.ClientError as e:
                error = type(e).__name__
        return words, done, error

    words, done, error = asyncio.run(one())
    assert 1 <= words < 20 and not done and error  # some tokens, then a broken connection
    with pytest.raises(openai.APIConnectionError):
        _client(srv.url).completions.create(model=srv.server.config.model_name, prompt="x", max_tokens=5)
    fam = _metrics(srv.url)
    assert _value(fam, V.REQUEST_SUCCESS, "_total", finished_reason="abort") == 2


def test_kv_capacity_fault_causes_preemptions_and_requests_still_finish(sim_server, quick_cost):
    srv = sim_server(cost_params=quick_cost, num_gpu_blocks_override=64, max_model_len=512)
    status, _ = _post_json(srv.url, "/admin/faults", {"kv_capacity_factor": 0.25})  # 16 blocks = 256 tokens
    assert status == 200

    async def drive() -> list[tuple[int, bool]]:
        async with aiohttp.ClientSession() as session:
            body = {"prompt": "w " * 60, "max_tokens": 40, "stream": True, "ignore_eos": True}
            return await asyncio.gather(*(_stream_words(session, srv.url + "/v1/completions", body) for _ in range(4)))

    results = asyncio.run(drive())
    assert results == [(40, True)] * 4
    fam = _metrics(srv.url)
    assert _value(fam, V.NUM_PREEMPTIONS, "_total") > 0
    assert _value(fam, V.REQUEST_NUM_PREEMPTIONS, "_sum") == _value(fam, V.NUM_PREEMPTIONS, "_total")


def test_stall_holds_requests_until_cleared(sim_server, quick_cost):
    srv = sim_server(cost_params=quick_cost)
    _post_json(srv.url, "/admin/faults", {"stall": True})

    async def drive() -> float:
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            task = asyncio.create_task(_stream_words(session, srv.url + "/v1/completions",
                                                     {"prompt": "x", "max_tokens": 3, "stream": True}))
            await asyncio.sleep(0.4)
            assert not task.done()
            with urllib.request.urlopen(srv.url + "/admin/state", timeout=5) as resp:
                assert json.loads(resp.read())["waiting"] == 1
            async with session.post(srv.url + "/admin/faults", json={"stall": False}) as resp:
                assert (await resp.json())["stalled"] is False
            words, done = await task
            assert done and words >= 1
            return time.monotonic() - started

    assert asyncio.run(drive()) >= 0.4


def test_fault_admin_rejects_bad_input_naming_the_field(sim_server):
    srv = sim_server()
    for body, field in (({"slowdown": -2}, "slowdown"), ({"error_mode": "explode"}, "error_mode"),
                        ({"kv_capacity_factor": 2}, "kv_capacity_factor"), ({"nonsense": 1}, "nonsense")):
        status, answer = _post_json(srv.url, "/admin/faults", body)
        assert status == 400 and field in answer["error"]["message"]
    with urllib.request.urlopen(srv.url + "/admin/faults", timeout=5) as resp:
        assert json.loads(resp.read())["slowdown"] == 1.0  # nothing changed
