"""The tap relays bytes unchanged, injects and strips usage invisibly, and times and classifies requests."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
from collections.abc import Callable
from typing import Any

import aiohttp

from exporter.tap.classes import SloClass, SloConfig
from llmslo import conventions as C

CLASSES = SloConfig(
    (SloClass("interactive", 0.08, 0.02, ("chat-*",)), SloClass("default", 5.0, 1.0)),
    {"ttft": (0.08, 5.0), "tpot": (0.02, 1.0), "e2e": ()},
)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def post(url: str, body: dict[str, Any] | bytes, **headers: str) -> tuple[int, bytes, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        async with s.post(url, data=data, headers={"Content-Type": "application/json", **headers}) as r:
            return r.status, await r.read(), r.headers


def chat(model: str = "chat-a", stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {"model": model, "stream": stream, "messages": [{"role": "user", "content": "hello"}], **extra}


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_stream_without_usage_gets_usage_injected_and_stripped(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            body = json.dumps(chat()).encode()
            status, got, headers = await post(st.tap_url + "/v1/chat/completions", body, **{"x-request-id": "a", "x-test-chunks": "4", "x-test-tokens-per-chunk": "3"})
            sent = st.upstream.records["a"]
            assert status == 200 and headers["Content-Type"] == "text/event-stream"
            assert sent.include_usage, "the tap asked the upstream for usage"
            assert json.loads(sent.body) == {**json.loads(body), "stream_options": {"include_usage": True}}
            assert sent.body.encode().endswith(body[1:]), "the client's bytes follow the spliced-in key unchanged"
            assert b'"usage"' not in got and got.endswith(b"data: [DONE]\n\n")
            assert sha(got) == sent.public()["sha_without_usage"] != sent.public()["sha_all"]
            (rec,) = st.records
            assert rec.usage_injected and rec.outcome == C.OUTCOME_OK
            assert rec.timings.n_out == 12 and rec.timings.usage_source == C.USAGE_SOURCE_ENGINE

    run(go())


def test_null_usage_members_added_because_of_the_injection_are_removed(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            url = st.tap_url + "/v1/chat/completions"
            _, got, _ = await post(url, chat(), **{"x-request-id": "n1", "x-test-usage-null": "1", "x-test-chunks": "3"})
            sent = st.upstream.records["n1"].public()
            assert b'"usage"' not in got and sha(got) == sent["sha_without_usage"]
            # A client that asked for usage gets the null members, as the engine sent them.
            body = chat(stream_options={"include_usage": True})
            _, got, _ = await post(url, body, **{"x-request-id": "n2", "x-test-usage-null": "1"})
            assert got.count(b'"usage":null') == 6 and sha(got) == st.upstream.records["n2"].public()["sha_all"]

    run(go())


def test_client_that_asks_for_usage_gets_everything_untouched(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            body = json.dumps(chat(stream_options={"include_usage": True})).encode()
            _, got, _ = await post(st.tap_url + "/v1/chat/completions", body, **{"x-request-id": "b"})
            sent = st.upstream.records["b"]
            assert sent.body.encode() == body
            assert sha(got) == sent.public()["sha_all"] and b'"usage"' in got
            assert not st.records[0].usage_injected and st.records[0].timings.n_out == 5

    run(go())


def test_existing_stream_options_are_kept_when_injecting(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            body = chat(stream_options={"include_usage": False, "continuous_usage_stats": False})
            _, got, _ = await post(st.tap_url + "/v1/chat/completions", body, **{"x-request-id": "c"})
            sent = st.upstream.records["c"]
            assert json.loads(sent.body)["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
            assert sha(got) == sent.public()["sha_without_usage"]

    run(go())


def test_no_inject_usage_counts_chunks_and_leaves_the_body_alone(stack: Callable) -> None:
    async def go() -> None:
        async with stack(inject_usage=False) as st:
            body = json.dumps(chat()).encode()
            _, got, _ = await post(st.tap_url + "/v1/chat/completions", body, **{"x-request-id": "d", "x-test-chunks": "6"})
            sent = st.upstream.records["d"]
            assert sent.body.encode() == body and sha(got) == sent.public()["sha_all"]
            t = st.records[0].timings
            assert (t.n_out, t.usage_source) == (6, C.USAGE_SOURCE_CHUNKS)
            assert st.value(C.OUTPUT_TOKENS.name, usage_source="chunks") == 6

    run(go())


def test_completions_endpoint_is_timed_from_text(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            body = {"model": "m", "prompt": "x", "stream": True}
            _, got, _ = await post(st.tap_url + "/v1/completions", body, **{"x-request-id": "e", "x-test-first-ms": "30"})
            assert sha(got) == st.upstream.records["e"].public()["sha_without_usage"]
            t = st.records[0].timings
            assert t.n_out == 5 and t.ttft is not None and t.ttft >= 0.03

    run(go())


def test_non_streamed_completion_is_timed_as_e2e_only(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            _, got, _ = await post(st.tap_url + "/v1/chat/completions", chat(stream=False), **{"x-request-id": "f", "x-test-chunks": "9"})
            assert sha(got) == st.upstream.records["f"].public()["sha_all"]
            assert not st.upstream.records["f"].include_usage
            rec = st.records[0]
            assert not rec.streamed and not rec.usage_injected
            assert rec.timings.ttft is None and rec.timings.tpot is None and rec.timings.e2e is not None
            assert rec.timings.n_out == 9
            labels = {"model": "chat-a", "slo_class": "default"}
            assert st.value(C.TAP_E2E.count(), **labels) == 1 and st.value(C.TAP_TTFT.count(), **labels) == 0

    run(go())


def test_goodput_needs_both_ttft_and_tpot_within_the_class_objectives(stack: Callable) -> None:
    async def go() -> None:
        async with stack(slo=CLASSES, trust_slo_headers=True) as st:
            url = st.tap_url + "/v1/chat/completions"
            cases = {
                "fast": {"x-test-first-ms": "5", "x-test-delay-ms": "2"},
                "slow-ttft": {"x-test-first-ms": "150", "x-test-delay-ms": "2"},
                "slow-tpot": {"x-test-first-ms": "5", "x-test-delay-ms": "45"},
                "header-relaxed": {"x-test-first-ms": "150", "x-test-delay-ms": "2", "x-slo-ttft-ms": "400"},
            }
            await asyncio.gather(*(post(url, chat(), **{"x-request-id": k, **h}) for k, h in cases.items()))
            good = {r.request_id: r.good for r in st.records}
            assert good == {"fast": True, "slow-ttft": False, "slow-tpot": False, "header-relaxed": True}
            # The header's objective is counted under its own derived class, not the class's (exporter.tap.objectives).
            assert {r.request_id: r.slo_class for r in st.records}["header-relaxed"] == "interactive@ttft400-tpot20"
            assert st.value(C.GOODPUT_REQUESTS.name, slo_class="interactive") == 1
            assert st.value(C.GOODPUT_REQUESTS.name, slo_class="interactive@ttft400-tpot20") == 1
            assert st.value(C.GOODPUT_TOKENS.name, slo_class="interactive") == 5
            assert st.value(C.TAP_REQUESTS.name, outcome="ok") == 4
            # The class threshold is a bucket edge: the SLI reads it exactly.
            assert st.value(C.TAP_TTFT.bucket(), le="0.08") == 2

    run(go())


def test_model_and_header_pick_the_class(stack: Callable) -> None:
    async def go() -> None:
        async with stack(slo=CLASSES, trust_slo_headers=True) as st:
            url = st.tap_url + "/v1/chat/completions"
            await post(url, chat(model="llama"), **{"x-request-id": "1"})
            await post(url, chat(model="chat-z", stream=True), **{"x-request-id": "2", "x-slo-class": "default"})
            # "llama" is neither served by the upstream nor matched by a class's globs: not a label value.
            assert [(r.model, r.slo_class) for r in st.records] == [("__other__", "default"), ("chat-z", "default")]

    run(go())


def test_slo_headers_are_ignored_unless_the_operator_trusts_clients(stack: Callable) -> None:
    """A client cannot make its own slow requests good (or move them to a laxer class) by default."""

    async def go() -> None:
        async with stack(slo=CLASSES) as st:
            url = st.tap_url + "/v1/chat/completions"
            forged = {"x-test-first-ms": "150", "x-slo-ttft-ms": "1e12", "x-slo-tpot-ms": "1e12"}
            await asyncio.gather(*(post(url, chat(), **{"x-request-id": f"f{i}", **forged}) for i in range(20)))
            await post(url, chat(), **{"x-request-id": "c", "x-test-first-ms": "150", "x-slo-class": "default"})
            assert len(st.records) == 21
            assert not any(r.good for r in st.records)
            assert {r.slo_class for r in st.records} == {"interactive"}
            assert {(r.objective.ttft, r.objective.tpot) for r in st.records} == {(0.08, 0.02)}
            assert st.value(C.GOODPUT_REQUESTS.name) == 0

    run(go())


def test_upstream_errors_and_client_errors_are_relayed_and_counted(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            url = st.tap_url + "/v1/chat/completions"
            s500, b500, _ = await post(url, chat(), **{"x-request-id": "e500", "x-test-status": "500"})
            s429, _, _ = await post(url, chat(), **{"x-request-id": "e429", "x-test-status": "429"})
            s400, b400, _ = await post(url, chat(), **{"x-request-id": "e400", "x-test-status": "400"})
            assert (s500, s429, s400) == (500, 429, 400)
            assert sha(b500) == st.upstream.records["e500"].public()["sha_all"]
            assert b"injected" in b400
            outcomes = {r.request_id: (r.outcome, r.good) for r in st.records}
            assert outcomes == {
                "e500": (C.OUTCOME_UPSTREAM_ERROR, False),
                "e429": (C.OUTCOME_UPSTREAM_ERROR, False),
                "e400": (C.OUTCOME_CLIENT_ERROR, False),
            }
            assert st.value(C.GOODPUT_REQUESTS.name) == 0

    run(go())


def test_unreachable_upstream_is_a_502_and_an_upstream_error(stack: Callable) -> None:
    async def go() -> None:
        async with stack(upstream_url="http://127.0.0.1:1") as st:
            status, body, _ = await post(st.tap_url + "/v1/chat/completions", chat())
            assert status == 502 and b"upstream unreachable" in body
            assert st.records[0].outcome == C.OUTCOME_UPSTREAM_ERROR
            async with aiohttp.ClientSession() as s, s.get(st.tap_url + "/v1/models") as r:
                assert r.status == 502

    run(go())


def test_error_event_mid_stream_is_aborted_not_goodput(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            _, got, _ = await post(st.tap_url + "/v1/chat/completions", chat(), **{"x-request-id": "g", "x-test-error-event": "2"})
            assert b"engine died" in got
            assert st.records[0].outcome == C.OUTCOME_ABORTED and not st.records[0].good
            assert st.value(C.TAP_REQUESTS.name, outcome="aborted") == 1

    run(go())


def test_other_paths_pass_through_untouched(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            async with aiohttp.ClientSession(auto_decompress=False) as s:
                async with s.get(st.tap_url + "/metrics") as r:
                    assert "vllm:num_requests_running 3.0" in await r.text()
                async with s.get(st.tap_url + "/v1/models") as r:
                    assert (await r.json())["data"][0]["id"] == "chat-a"
                async with s.get(st.tap_url + "/gzip") as r:
                    assert r.headers["Content-Encoding"] == "gzip"
                    assert await r.read() == gzip.compress(b"compressed by the engine " * 100, mtime=0)
                path = "/echo/a%2Fb/c?x=1&y=%20z"
                async with s.put(
                    st.tap_url + path, data=b"payload", headers={"X-Custom": "kept", "Connection": "keep-alive", "Authorization": "Bearer t"}
                ) as r:
                    echo = await r.json()
                    assert r.headers["X-Echo"] == "1"
            assert echo["method"] == "PUT" and echo["raw_path"] == path
            headers = {k.lower(): v for k, v in echo["headers"].items()}
            assert headers["x-custom"] == "kept" and headers["authorization"] == "Bearer t" and echo["len"] == 7
            assert "user-agent" in headers and headers["user-agent"].startswith("Python")  # the client's, forwarded
            assert st.records == [], "untimed paths are not counted"

    run(go())


def test_websocket_upgrade_is_relayed_as_a_tunnel(stack: Callable) -> None:
    """Engines serve WebSocket endpoints too (vLLM's realtime API); a sidecar tap must not break them."""

    async def go() -> None:
        async with stack() as st:
            async with aiohttp.ClientSession() as s, s.ws_connect(st.tap_url + "/ws", max_msg_size=0) as ws:
                for i in range(3):
                    await ws.send_str(f"m{i}")
                    assert await ws.receive_str() == f"echo:m{i}"
                big = "x" * 4_000_000  # more than any socket buffer: backpressure both ways
                await ws.send_str(big)
                assert await ws.receive_str() == "echo:" + big
            assert st.records == [], "an upgraded connection is relayed, not timed"
            pool = st.server.proxy.pool  # type: ignore[attr-defined]
            for _ in range(100):  # the tunnel's upstream connection closes with the client's
                if not pool.live:
                    break
                await asyncio.sleep(0.01)
            assert not pool.live

    run(go())


def test_null_usage_removal_touches_only_a_trailing_top_level_member() -> None:
    from exporter.tap.relay import _without_null_usage

    assert _without_null_usage(b'data: {"a":1,"usage":null}\n\n') == b'data: {"a":1}\n\n'
    assert _without_null_usage(b'data: {"a":1, "usage": null}\r\n\r\n') == b'data: {"a":1}\r\n\r\n'
    for untouched in (
        b'data: {"a":{"b":1,"usage":null},"c":2}\n\n',  # nested, not the top level's last member
        b'data: {"usage":null,"a":1}\n\n',  # not where the engines put it
        b'data: {"a":1,\ndata: "usage":null}\n\n',  # a multi-line event
        b'data: {"a":1,"usage":{"completion_tokens":3}}\n\n',
    ):
        assert _without_null_usage(untouched) is untouched


def test_an_event_too_large_to_follow_is_relayed_blindly_and_intact(stack: Callable) -> None:
    async def go() -> None:
        async with stack() as st:
            headers = {"x-request-id": "huge", "x-test-chunks": "3", "x-test-chunk-bytes": str(5 * 1024 * 1024)}
            _, got, _ = await post(st.tap_url + "/v1/chat/completions", chat(), **headers)
            # Past 4 MiB without an event boundary the tap stops parsing, so it can no longer
            # take out the injected usage event: the client gets every byte the engine sent.
            assert sha(got) == st.upstream.records["huge"].public()["sha_all"]
            assert st.records[0].outcome == C.OUTCOME_OK

    run(go())


def test_the_official_openai_client_through_the_tap(stack: Callable, simulator_proc: Any) -> None:
    """What users run: the openai SDK, streaming with and without usage and not streaming, via the tap."""
    import openai

    def use(base_url: str) -> dict[str, Any]:
        client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=30)
        model = client.models.list().data[0].id
        messages = [{"role": "user", "content": "hello"}]
        plain = list(client.chat.completions.create(model=model, messages=messages, stream=True, max_tokens=8))
        asked = list(client.chat.completions.create(model=model, messages=messages, stream=True, max_tokens=8,
                                                    stream_options={"include_usage": True}))
        whole = client.completions.create(model=model, prompt="hello", max_tokens=5)
        return {"plain": plain, "asked": asked, "whole": whole}

    async def go() -> None:
        async with stack(upstream_url=simulator_proc.url, slo=CLASSES) as st:
            got = await asyncio.to_thread(use, st.tap_url)
            records = {(r.path, r.usage_injected): r for r in st.records}
        plain, asked, whole = got["plain"], got["asked"], got["whole"]
        assert "".join(c.choices[0].delta.content or "" for c in plain if c.choices)
        assert all(c.usage is None for c in plain), "the usage the tap asked for is not shown to this client"
        assert asked[-1].usage is not None and asked[-1].choices == []
        n_asked = asked[-1].usage.completion_tokens
        assert whole.usage is not None and whole.choices[0].text
        assert len(records) == 3 and all(r.outcome == C.OUTCOME_OK for r in records.values())
        assert records[("/v1/chat/completions", False)].timings.n_out == n_asked
        assert records[("/v1/chat/completions", True)].timings.usage_source == C.USAGE_SOURCE_ENGINE
        assert records[("/v1/completions", False)].timings.n_out == whole.usage.completion_tokens

    run(go())


def test_https_upstream_is_verified_against_the_ca_given(stack: Callable, certs: dict) -> None:
    """An engine behind TLS with a private CA: trusted with --upstream-ca, refused (502) without it."""
    import ssl

    from aiohttp import web

    from tests.tap.conftest import TestUpstream

    async def go() -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(certs["server_crt"], certs["server_key"])
        runner = web.AppRunner(TestUpstream().app(), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx).start()
        url = f"https://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with stack(upstream_url=url, upstream_ca=str(certs["ca_crt"])) as st:
                status, body, _ = await post(st.tap_url + "/v1/chat/completions", chat())
                assert status == 200 and body.endswith(b"data: [DONE]\n\n")
                assert st.records[0].outcome == C.OUTCOME_OK
            async with stack(upstream_url=url) as st:  # the system's CAs do not know this one
                status, body, _ = await post(st.tap_url + "/v1/chat/completions", chat())
                assert status == 502 and b"SSLCertVerificationError" in body
        finally:
            await runner.cleanup()

    run(go())
