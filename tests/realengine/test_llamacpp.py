"""llama.cpp's server (llama-server, CPU build of llama.cpp 0c1e570) as a real engine of the stack.

`make llamacpp-deps` builds it (scripts/install-llamacpp.sh); without it this file fails at collection with that
fix (tests/realengine/conftest.py), it never skips. Proved here on the real server: the page is the one the unit
tests build (tests/exporter/engine_pages.llamacpp_page, same HELP and TYPE lines in the same order); after real
traffic (a shared prefix, so slots reuse their cache) the exporter detects the server (`auto`) and every `llm_*`
value equals what docs/metrics.md's mapping makes of the server's page at rest, and the page agrees with what the
clients got; slots and the deferred queue under load equal the page; the goodput tap in front of the server
counts requests, tokens and goodput equal to what its clients measured.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from realengine import llamacpp_server
from realengine.llamacpp_server import SERVED_NAME, LlamacppConfig, LlamacppServer
from tests.exporter import engine_pages
from tests.realengine.tap_harness import start_tap
from tests.realengine.test_exporter_vllm import (
    _exporter_once,
    _flat,
    _key,
    _post,
    _stream,
    exported_series,
    settled_page,
)

REAL_ENGINE = "llamacpp"  # tests/realengine/conftest.py: what this file needs installed
REPO = Path(__file__).resolve().parents[2]
NODE = "realengine-node"  # as _exporter_once names the node
TIMEOUT = 120.0
# Throughput averaged since the previous scrape: every read of /metrics resets them, so they differ between reads.
PER_SCRAPE = ("llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds")

Series = dict[tuple[str, frozenset], float]


@pytest.fixture(scope="module")
def llamacpp(tmp_path_factory) -> Iterator[LlamacppServer]:
    log = tmp_path_factory.mktemp("llamacpp") / "llama-server.log"
    with LlamacppServer(LlamacppConfig(), log_path=log) as server:
        yield server


def _words(start: int, n: int) -> str:
    return " ".join(f"w{i}" for i in range(start, start + n))


def _lines(page: str) -> list[str]:
    """The server's series that stay put while nothing runs (the per-scrape throughput gauges left out)."""
    return [line for line in page.splitlines() if line.startswith("llamacpp:") and not line.startswith(PER_SCRAPE)]


def _value(flat, name: str) -> float:
    (value,) = [v for n, _, v in flat if n == name]
    return value


def _quiesce(server: LlamacppServer, timeout: float = TIMEOUT) -> str:
    def idle(page: str) -> bool:
        flat = _flat(page)
        return _value(flat, "llamacpp:requests_processing") == 0 and _value(flat, "llamacpp:requests_deferred") == 0

    return settled_page(server.metrics, idle, _lines, "llama-server", timeout, every_s=0.5)


MAPPED = ("llamacpp:requests_processing ", "llamacpp:requests_deferred ", "llamacpp:prompt_tokens_total ",
          "llamacpp:prompt_tokens_cached_total ", "llamacpp:tokens_predicted_total ")


def _mapped_lines(page: str) -> list[str]:
    """The lines the mapping reads: under load, decode calls and the busy-slot average move on, these need not."""
    return [line for line in page.splitlines() if line.startswith(MAPPED)]


def _collect_around(server: LlamacppServer, settle: bool = True) -> tuple[str, str] | None:
    """(server page, exporter page) when the server's series (under load: the mapped ones) are the same before and
    after the collection."""
    before = _quiesce(server) if settle else server.metrics()
    exported = _exporter_once(server.url)
    after = server.metrics()
    same = _lines(after) == _lines(before) if settle else _mapped_lines(after) == _mapped_lines(before)
    return (before, exported) if same else None


# ------------------------------------------------------------------------------------------
# The mapping, written from docs/metrics.md ("Per-engine mapping", llama.cpp), not from the adapter
# ------------------------------------------------------------------------------------------
def expected_from_server_page(page: str) -> Series:
    flat = _flat(page)
    ident = {"engine": "llamacpp", "model": "", "pod": "", "namespace": "", "node": NODE}
    decoded, cached = _value(flat, "llamacpp:prompt_tokens_total"), _value(flat, "llamacpp:prompt_tokens_cached_total")
    values = {
        "llm_requests_running": _value(flat, "llamacpp:requests_processing"),
        "llm_requests_waiting": _value(flat, "llamacpp:requests_deferred"),
        "llm_prompt_tokens_total": decoded + cached,
        "llm_prefix_cache_queries_total": decoded + cached,
        "llm_prefix_cache_hits_total": cached,
        "llm_generation_tokens_total": _value(flat, "llamacpp:tokens_predicted_total"),
        "llm_prompt_tokens_cached_total": cached,
        # speculative decoding, as vLLM names it; the pinned server writes the counters (0 without a draft model)
        "llm_spec_decode_drafts_total": _value(flat, "llamacpp:spec_decode_num_drafts_total"),
        "llm_spec_decode_draft_tokens_total": _value(flat, "llamacpp:spec_decode_num_draft_tokens_total"),
        "llm_spec_decode_accepted_tokens_total": _value(flat, "llamacpp:spec_decode_num_accepted_tokens_total"),
    }
    out = {_key(name, ident): v for name, v in values.items()}
    # a deferred request waits for a slot: the capacity is the reason
    out[_key("llm_requests_waiting_by_reason", {**ident, "reason": "capacity"})] = _value(flat, "llamacpp:requests_deferred")
    for name, labels, v in flat:
        if name == "llamacpp:spec_decode_num_accepted_tokens_per_pos_total":
            out[_key("llm_spec_decode_accepted_tokens_by_position_total", {**ident, **labels})] = v
    return out


def assert_every_value_equals_the_server_page(page: str, exported: str, server: LlamacppServer) -> Series:
    up = [(lab, v) for n, lab, v in _flat(exported) if n == "llm_exporter_target_up"]
    assert up == [({"target": f"{server.url}/metrics", "engine": "llamacpp"}, 1.0)], "auto did not detect llama.cpp"
    want, got = expected_from_server_page(page), exported_series(exported)
    assert got == want
    return got


# ------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------
def test_the_server_is_the_pinned_build_and_writes_the_page_the_unit_tests_build(llamacpp):
    version = subprocess.run([str(llamacpp_server.server_binary()), "--version"], capture_output=True, text=True,
                             timeout=30)
    assert f"commit {llamacpp_server.LLAMACPP_COMMIT}" in version.stdout + version.stderr
    script = (REPO / "scripts" / "install-llamacpp.sh").read_text()
    assert re.search(r"^VERSION=(\S+)", script, re.M).group(1) == llamacpp_server.VERSION

    def declarations(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.startswith("#")]

    real = llamacpp.metrics()
    assert declarations(real) == declarations(engine_pages.llamacpp_page())
    assert [line.split(" ")[0] for line in _lines(real)] == [line.split(" ")[0]
                                                             for line in _lines(engine_pages.llamacpp_page())]


def test_every_exported_value_equals_the_real_servers_page_after_real_traffic(llamacpp):
    base = _flat(_quiesce(llamacpp))
    comp, chat = llamacpp.url + "/v1/completions", llamacpp.url + "/v1/chat/completions"
    prefix = _words(100, 200)
    results = []
    # one after another with one shared prefix: the slot that served the last one reuses its cache
    for i in range(4):
        results.append(_post(comp, {"model": SERVED_NAME, "prompt": f"{prefix} {_words(1000 + 10 * i, 5)}",
                                    "max_tokens": 20 + i, "ignore_eos": True}))
        results.append(_stream(comp, {"model": SERVED_NAME, "prompt": f"{prefix} {_words(2000 + 10 * i, 3)}",
                                      "max_tokens": 17, "ignore_eos": True}))
    results.append(_post(chat, {"model": SERVED_NAME, "messages": [{"role": "user", "content": _words(5, 30)}],
                                "max_tokens": 9, "ignore_eos": True}))
    # and a burst: more requests than slots at once
    burst: list[dict] = []
    threads = [threading.Thread(target=lambda i=i: burst.append(_post(comp, {
        "model": SERVED_NAME, "prompt": _words(3000 + 40 * i, 30), "max_tokens": 40, "ignore_eos": True})))
        for i in range(7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
    results += burst
    assert len(results) == 16
    usages = [r["usage"] for r in results]
    assert [u["completion_tokens"] for u in usages] == [20, 17, 21, 17, 22, 17, 23, 17, 9] + [40] * 7

    collected = None
    for _ in range(5):
        collected = _collect_around(llamacpp)
        if collected:
            break
    assert collected, "the server's page kept changing around the exporter's collection"
    page, exported = collected
    got = assert_every_value_equals_the_server_page(page, exported, llamacpp)

    # ... and the page agrees with what the clients were told (so the equality above compared real counts)
    flat = _flat(page)

    def delta(name: str) -> float:
        return _value(flat, name) - _value(base, name)

    assert delta("llamacpp:tokens_predicted_total") == sum(u["completion_tokens"] for u in usages)
    assert (delta("llamacpp:prompt_tokens_total") + delta("llamacpp:prompt_tokens_cached_total")
            == sum(u["prompt_tokens"] for u in usages))
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert delta("llamacpp:prompt_tokens_cached_total") == cached
    assert cached >= 200 * 3  # the shared prefix was reused (N words are N tokens, + BOS)
    assert got[_key("llm_prefix_cache_hits_total", {"engine": "llamacpp", "model": "", "pod": "", "namespace": "",
                                                    "node": NODE})] == _value(flat, "llamacpp:prompt_tokens_cached_total")


def test_slots_and_the_deferred_queue_under_load_equal_the_page(llamacpp):
    """Six long requests on four slots: four processing, two deferred. While the four generate, the token counters
    stand still (generated tokens are added when a slot is released), so the page is the same around a collection."""
    _quiesce(llamacpp)
    comp = llamacpp.url + "/v1/completions"
    n, out_tokens = 6, 1900
    results: list[dict] = []
    threads = [threading.Thread(target=lambda i=i: results.append(_stream(comp, {
        "model": SERVED_NAME, "prompt": _words(500 + 7 * i, 6), "max_tokens": out_tokens, "ignore_eos": True})))
        for i in range(n)]
    for t in threads:
        t.start()
    try:
        compared = None
        deadline = time.monotonic() + TIMEOUT
        while compared is None and time.monotonic() < deadline:
            flat = _flat(llamacpp.metrics())
            if (_value(flat, "llamacpp:requests_processing"), _value(flat, "llamacpp:requests_deferred")) != (4, 2):
                time.sleep(0.05)
                continue
            collected = _collect_around(llamacpp, settle=False)
            if collected and (_value(_flat(collected[0]), "llamacpp:requests_processing"),
                              _value(_flat(collected[0]), "llamacpp:requests_deferred")) == (4, 2):
                compared = collected
        assert compared, "no collection with 4 slots busy and 2 requests deferred and the page unchanged around it"
        got = assert_every_value_equals_the_server_page(*compared, llamacpp)
        ident = {"engine": "llamacpp", "model": "", "pod": "", "namespace": "", "node": NODE}
        assert (got[_key("llm_requests_running", ident)], got[_key("llm_requests_waiting", ident)]) == (4, 2)
    finally:
        for t in threads:
            t.join(timeout=TIMEOUT)
    assert sorted(r["usage"]["completion_tokens"] for r in results) == [out_tokens] * n
    page, exported = _collect_around(llamacpp) or _collect_around(llamacpp)
    assert_every_value_equals_the_server_page(page, exported, llamacpp)


def test_the_tap_in_front_counts_what_the_clients_measured(llamacpp, tmp_path):
    """Requests, outcomes, output tokens and goodput through the tap equal the clients' own counts (objectives far
    above anything this server takes, so every request is good goodput by the clients' clocks too)."""
    tap = start_tap(llamacpp.url, tmp_path, objectives=(30.0, 1.0))
    try:
        base = _flat(_quiesce(llamacpp))
        comp = tap.url + "/v1/completions"
        measured: list[dict] = []

        def client(i: int) -> None:
            body = {"model": SERVED_NAME, "prompt": _words(50 * i, 12), "max_tokens": 15 + 3 * i, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}}
            req = urllib.request.Request(comp, data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
            t0 = time.monotonic()
            first = last = None
            usage, done = None, False
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                for raw in r:
                    line = raw.decode().strip()
                    if not line.startswith("data: "):
                        continue
                    if line == "data: [DONE]":
                        done = True
                        break
                    event = json.loads(line[len("data: "):])
                    usage = event.get("usage") or usage
                    if any(ch.get("text") for ch in event.get("choices", ())):
                        first = first or time.monotonic()
                        last = time.monotonic()
            measured.append({"done": done, "tokens": usage["completion_tokens"], "ttft": first - t0,
                             "tpot": (last - first) / max(usage["completion_tokens"] - 1, 1)})

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=TIMEOUT)
        assert len(measured) == 8 and all(m["done"] for m in measured)
        tokens = sum(m["tokens"] for m in measured)
        assert tokens == sum(15 + 3 * i for i in range(8))
        assert all(m["ttft"] < 30.0 and m["tpot"] < 1.0 for m in measured)  # good by the clients' clocks
        deadline = time.monotonic() + 10
        while tap.value("llm_tap_requests_total") < 8 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tap.outcomes() == {"ok": 8}
        assert tap.value("llm_output_tokens_total", usage_source="usage") == tokens
        assert tap.value("llm_output_tokens_total", usage_source="chunks") == 0
        assert tap.value("llm_goodput_requests_total") == 8
        assert tap.value("llm_goodput_tokens_total") == tokens
        assert tap.value("llm_tap_time_to_first_token_seconds_count") == 8
        # the tap's clock starts after the client's and reads each event first: its TTFT is never the larger
        assert tap.value("llm_tap_time_to_first_token_seconds_sum") <= sum(m["ttft"] for m in measured)
        # and the server counted the same tokens
        flat = _flat(_quiesce(llamacpp))
        assert _value(flat, "llamacpp:tokens_predicted_total") - _value(base, "llamacpp:tokens_predicted_total") == tokens
    finally:
        tap.stop()
