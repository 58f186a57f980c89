"""The upstream's model list: parsed entry by entry, read periodically, kept through any failure."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from exporter.tap import models as M
from exporter.tap.classes import SloClass, SloConfig
from exporter.tap.metrics import OVERFLOW_MODEL
from exporter.tap.models import ModelListError, ServedModels, iter_model_ids, model_ids

CLASSES = SloConfig((SloClass("interactive", 0.5, 0.05, ("chat-*",)),), {"ttft": (0.5,), "tpot": (0.05,), "e2e": ()})


def vllm_list(base: str, adapters: list[str]) -> dict[str, Any]:
    """What vLLM answers on /v1/models: the base model, then each LoRA adapter with its parent."""
    perm = [{"id": "modelperm-1", "object": "model_permission", "allow_sampling": True, "group": None}]
    data = [{"id": base, "object": "model", "created": 1, "owned_by": "vllm", "root": base, "parent": None,
             "max_model_len": 8192, "permission": perm}]
    data += [{"id": a, "object": "model", "created": 1, "owned_by": "vllm", "root": f"/adapters/{a}", "parent": base,
              "max_model_len": 8192, "permission": perm} for a in adapters]
    return {"object": "list", "data": data}


# -- parsing ---------------------------------------------------------------------------------
def test_ids_of_an_openai_model_list_with_lora_adapters() -> None:
    text = json.dumps(vllm_list("meta-llama/Llama-3.1-8B-Instruct", ["sql-lora", "chat-lora"]), indent=2)
    assert model_ids(text) == {"meta-llama/Llama-3.1-8B-Instruct", "sql-lora", "chat-lora"}
    # Key order, whitespace and other members do not matter.
    assert model_ids(' { "data" : [ {"object":"model", "id" : "a"} , {"id":"b"} ] , "object" : "list" } ') == {"a", "b"}
    assert model_ids('{"object":"list","data":[]}') == frozenset()


def test_entries_that_cannot_be_label_values_are_skipped() -> None:
    data = [{"id": "ok"}, {"id": 7}, {"name": "no-id"}, "a-string", None, {"id": "x" * (M.MAX_LABEL_CHARS + 1)},
            {"id": "bad\nname"}, {"id": ""}, {"id": "y" * M.MAX_LABEL_CHARS}]
    assert model_ids(json.dumps({"data": data})) == {"ok", "y" * M.MAX_LABEL_CHARS}


@pytest.mark.parametrize("text", [
    "", "null", "[]", '"data"', "{", '{"data":', '{"data":[', '{"data":[{"id":"a"}', '{"data":[{"id":"a"},]}',
    '{"data":{"id":"a"}}', '{"object":"list"}', '{"data":[] "x":1}', '{"data":[]} trailing', "<html>oops</html>",
    '{"data":[{"id":"a"} {"id":"b"}]}', '{"data":[],}', '{"data":[]}}', "[" * 100_000 + "]" * 100_000,
])
def test_anything_but_a_model_list_is_an_error(text: str) -> None:
    with pytest.raises(ModelListError):
        model_ids(text)


def test_a_deeply_nested_value_is_an_error_not_a_crash() -> None:
    with pytest.raises(ModelListError):
        model_ids('{"x":' + "[" * 200_000 + "]" * 200_000 + ',"data":[]}')


def test_ids_are_capped_and_the_parser_pauses_between_slices() -> None:
    text = json.dumps({"data": [{"id": f"m{i}"} for i in range(5000)]})
    steps = list(iter_model_ids(text, max_ids=3000))
    assert len([s for s in steps if s is not None]) == 3000
    pauses = [i for i, s in enumerate(steps) if s is None]
    assert len(pauses) == 3000 // M.ENTRIES_PER_SLICE
    assert all(b - a == M.ENTRIES_PER_SLICE + 1 for a, b in zip(pauses, pauses[1:], strict=False)), "a pause every slice"


# -- reading it from the upstream --------------------------------------------------------------
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def _served(handler: Handler, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """`handler` answering every GET on a loopback port while the block runs; yields its base URL."""
    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
        scheme = "https" if ssl_context else "http"
        yield f"{scheme}://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


class Scripted:
    """An upstream whose /v1/models answer the test changes as it goes."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.names = ["chat-a", "sql-lora"]
        self.paths: list[str] = []

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.paths.append(request.path)
        mode = self.mode
        if mode == "ok":
            return web.json_response(vllm_list(self.names[0], self.names[1:]))
        if mode == "500":
            return web.json_response({"error": "loading"}, status=500)
        if mode == "html":
            return web.Response(text="<html>not here</html>", content_type="text/html")
        if mode == "slow":
            await asyncio.sleep(5)
            return web.json_response(vllm_list("late", []))
        if mode == "huge":  # a valid list, but over the cap: declared by Content-Length
            return web.json_response(vllm_list("big", [f"a{i}-" + "x" * 100 for i in range(20_000)]))
        if mode == "endless":  # no Content-Length: chunks until the reader stops
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            await resp.write(b'{"data":[')
            for _ in range(10_000):
                await resp.write(b'{"id":"' + b"z" * 1000 + b'"},')
            return resp
        if mode == "empties":  # #27: just under 1 MiB of empty entries, a model list in form only
            return web.Response(body=b'{"data":[' + b",".join([b"{}"] * 349_000) + b"]}",
                                content_type="application/json")
        if mode == "gzip":
            body = gzip.compress(json.dumps(vllm_list("zipped", [])).encode())
            return web.Response(body=body, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        raise AssertionError(mode)


def test_the_list_is_read_and_every_failure_keeps_the_last_good_one() -> None:
    async def go() -> None:
        up = Scripted()
        async with _served(up.handle) as url:
            served = ServedModels(url + "/", refresh_s=0, timeout_s=0.5, max_bytes=256 * 1024)
            assert await served.refresh() and served.names == {"chat-a", "sql-lora"}
            assert up.paths == ["/v1/models"] and served.last_error == ""
            for mode in ("500", "html", "slow", "huge", "endless", "gzip"):
                up.mode = mode
                assert not await served.refresh(), mode
                assert served.names == {"chat-a", "sql-lora"}, mode
                assert served.last_error, mode
            up.mode, up.names = "ok", ["chat-a", "new-adapter"]
            assert await served.refresh() and served.names == {"chat-a", "new-adapter"} and not served.last_error
        assert not await served.refresh(), "the upstream is gone"
        assert served.names == {"chat-a", "new-adapter"}

    asyncio.run(go())


def test_an_answer_of_a_million_bytes_of_empty_entries_is_refused_and_decoded_off_the_loop(monkeypatch) -> None:
    """#27: its entries are bounded (MAX_ENTRIES), and the decoding runs in a worker thread, not on the relay's loop."""
    threads: list[str] = []
    real = M.model_ids

    def recording(*args: object) -> frozenset[str]:
        threads.append(threading.current_thread().name)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(M, "model_ids", recording)

    async def go() -> None:
        up = Scripted()
        async with _served(up.handle) as url:
            served = ServedModels(url, refresh_s=0)
            assert await served.refresh() and served.names == {"chat-a", "sql-lora"}
            up.mode = "empties"
            assert not await served.refresh()
            assert f"more than {M.MAX_ENTRIES} entries" in served.last_error
            assert served.names == {"chat-a", "sql-lora"}

    asyncio.run(go())
    assert len(threads) == 2 and threading.main_thread().name not in threads


def test_an_upstream_path_prefix_is_kept() -> None:
    async def go() -> None:
        up = Scripted()
        async with _served(up.handle) as url:
            assert await ServedModels(url + "/engine-a", refresh_s=0).refresh()
            assert up.paths == ["/engine-a/v1/models"]

    asyncio.run(go())


def test_an_https_upstream_is_verified_against_the_proxy_s_ca(certs: dict[str, Path]) -> None:
    async def go() -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(certs["server_crt"], certs["server_key"])
        async with _served(Scripted().handle, ctx) as url:
            trusted = ServedModels(url, str(certs["ca_crt"]), refresh_s=0)
            assert await trusted.refresh() and trusted.names == {"chat-a", "sql-lora"}
            untrusted = ServedModels(url, refresh_s=0)  # the system's CAs do not know this one
            assert not await untrusted.refresh() and "Certificate" in untrusted.last_error

    asyncio.run(go())


def test_the_refresher_runs_periodically_until_stopped() -> None:
    async def go() -> None:
        up = Scripted()
        async with _served(up.handle) as url:
            served = ServedModels(url, refresh_s=0.02)
            await served.start()
            assert served.names == {"chat-a", "sql-lora"}, "start() waits for the first read"
            up.names = ["chat-a", "loaded-later"]
            for _ in range(200):
                if "loaded-later" in served.names:
                    break
                await asyncio.sleep(0.01)
            assert served.names == {"chat-a", "loaded-later"}
            await served.stop()
            attempts = served.attempts
            await asyncio.sleep(0.1)
            assert served.attempts == attempts, "no reads after stop()"

    asyncio.run(go())


def test_start_does_not_wait_long_for_an_upstream_that_hangs() -> None:
    async def go() -> None:
        up = Scripted()
        up.mode = "slow"
        async with _served(up.handle) as url:
            served = ServedModels(url, refresh_s=30)
            await served.start(wait_s=0.05)
            assert served.names == frozenset() and served.attempts == 1
            await served.stop()

    asyncio.run(go())


def test_refresh_zero_never_asks() -> None:
    async def go() -> None:
        up = Scripted()
        async with _served(up.handle) as url:
            served = ServedModels(url, refresh_s=0)
            await served.start()
            await asyncio.sleep(0.05)
            await served.stop()
            assert up.paths == [] and served.attempts == 0

    asyncio.run(go())


# -- through a tap -----------------------------------------------------------------------------
def test_the_tap_labels_served_models_and_globs_and_nothing_else(stack: Callable) -> None:
    from tests.tap.test_proxy import chat, post

    async def go() -> None:
        async with stack(slo=CLASSES) as st:  # its upstream serves chat-a
            assert st.server.served.names >= {"chat-a"}, "read before the tap took its first request"
            url = st.tap_url + "/v1/chat/completions"
            for model in ("chat-a", "chat-zz", "made-up", "x" * 5000):
                status, _, _ = await post(url, chat(model=model))
                assert status == 200
            assert [r.model for r in st.records] == ["chat-a", "chat-zz", OVERFLOW_MODEL, OVERFLOW_MODEL]

    asyncio.run(go())


def test_a_tap_whose_upstream_has_no_model_list_admits_class_globs_only(stack: Callable) -> None:
    from tests.tap.test_proxy import chat, post

    async def go() -> None:
        async with stack(slo=CLASSES, models_refresh_s=0) as st:
            url = st.tap_url + "/v1/chat/completions"
            for model in ("chat-a", "llama"):
                await post(url, chat(model=model))
            assert [r.model for r in st.records] == ["chat-a", OVERFLOW_MODEL]

    asyncio.run(go())


# -- the flag ----------------------------------------------------------------------------------
def test_models_refresh_flag() -> None:
    from exporter.tap import cli

    parser = argparse.ArgumentParser()
    cli.add_parser(parser.add_subparsers(dest="command"))
    base = ["tap", "--listen", ":0", "--upstream", "http://127.0.0.1:1", "--metrics-listen", ":0"]
    assert parser.parse_args(base).models_refresh == M.DEFAULT_REFRESH_S == 30.0
    assert parser.parse_args([*base, "--models-refresh", "0"]).models_refresh == 0.0
    assert parser.parse_args([*base, "--models-refresh", "5"]).models_refresh == 5.0
    for bad in ("0.5", "-1", "nan", "inf", "soon"):
        with pytest.raises(argparse.ArgumentTypeError):
            M.refresh_seconds(bad)
