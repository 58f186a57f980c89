"""The exporter on a real vLLM (CPU build 0.32): every `llm_*` value it emits equals the engine's own page.

Real traffic first (completions and chat, streamed and not, a shared prefix so the prefix cache hits, stop and
length finishes), then the engine is quiesced (nothing running or waiting, the page unchanged between two
reads) and the exporter's collection (`llmslo-exporter --once --engine auto=URL`) runs between two reads of the
page that must be identical. The expected normalized series are computed here, independently of the exporter's
code, from the raw page per docs/metrics.md's mapping (prometheus_client's own parser reads both pages), and the
two sets must be the same series with the same values: gauges, counters, every histogram bucket, sum and count,
finished reasons, cache_config_info's blocks and block size, free blocks.

Also on the real engine: preemptions forced through a small KV cache; what client disconnects do to vLLM's
`finished_reason="abort"` (nothing: the abort gap, asserted so that a vLLM that starts counting them is
noticed); a client's own 4xx never counted as an error.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from llmslo.conventions import FINISHED_REASONS
from realengine.vllm_server import SERVED_NAME, VllmConfig, VllmServer

REPO = Path(__file__).resolve().parents[2]
NODE = "realengine-node"
TIMEOUT = 180.0  # generous: two shared cores, other engines running beside this one

Series = dict[tuple[str, frozenset], float]


# ------------------------------------------------------------------------------------------
# Clients
# ------------------------------------------------------------------------------------------
def _post(url: str, body: dict, timeout: float = TIMEOUT) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def _status_of(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _stream(url: str, body: dict) -> dict:
    """A streamed request read to its end: the usage it reported, the finish reason, the chunks that carried text."""
    body = body | {"stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    usage, finish, chunks, done = None, None, 0, False
    with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            usage = event.get("usage") or usage
            for choice in event.get("choices", ()):
                finish = choice.get("finish_reason") or finish
                if choice.get("text") or (choice.get("delta") or {}).get("content"):
                    chunks += 1
    assert done, "the stream ended without [DONE]"
    return {"usage": usage, "finish_reason": finish, "chunks": chunks}


def _words(start: int, n: int) -> str:
    return " ".join(f"w{i}" for i in range(start, start + n))


# ------------------------------------------------------------------------------------------
# Pages
# ------------------------------------------------------------------------------------------
def _flat(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a page as (sample name, labels, value), read by prometheus_client's parser."""
    return [(s.name, dict(s.labels), s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def _vllm_lines(text: str) -> list[str]:
    """The engine's own series (the http_* and process_* families change with every scrape)."""
    return [line for line in text.splitlines() if line.startswith("vllm:")]


def _value(flat, name: str, **labels) -> float:
    picked = [v for n, lab, v in flat if n == name and all(lab.get(k) == w for k, w in labels.items())]
    assert picked, f"{name}{labels} is not on the engine's page"
    return math.fsum(picked)


def settled_page(read: Callable[[], str], idle: Callable[[str], bool], steady: Callable[[str], list[str]],
                 what: str, timeout: float, every_s: float) -> str:
    """The page `read` returns once `idle(page)` holds and two reads `every_s` apart show the same `steady`
    lines; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        page = read()
        quiet = idle(page)
        if quiet and last is not None and steady(page) == steady(last):
            return page
        last = page if quiet else None
        time.sleep(every_s)
    raise AssertionError(f"{what} did not settle within {timeout:.0f} s")


def _quiesce(server: VllmServer, timeout: float = TIMEOUT) -> str:
    """The page once nothing runs or waits and two reads a second apart are the same."""

    def idle(page: str) -> bool:
        flat = _flat(page)
        return _value(flat, "vllm:num_requests_running") == 0 and _value(flat, "vllm:num_requests_waiting") == 0

    return settled_page(server.metrics, idle, _vllm_lines, "the engine", timeout, every_s=1.0)


def _exporter_once(url: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "exporter", "--once", "--gpu", "off", "--node-name", NODE,
         "--engine", f"auto={url}/metrics", "--log-level", "warning"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _collect_at_rest(server: VllmServer) -> tuple[str, str]:
    """(engine page, exporter page) at one moment: the engine's series are the same before and after."""
    for _ in range(5):
        before = _quiesce(server)
        exported = _exporter_once(server.url)
        after = server.metrics()
        if _vllm_lines(after) == _vllm_lines(before):
            return before, exported
    raise AssertionError("the engine's page kept changing around the exporter's collection")


# ------------------------------------------------------------------------------------------
# The mapping, written from docs/metrics.md ("Per-engine mapping", vLLM V1), not from the adapter
# ------------------------------------------------------------------------------------------
REASONS = {"stop": "stop", "length": "length", "abort": "abort", "error": "error", "repetition": "stop"}
SCALARS = {
    "llm_requests_running": "vllm:num_requests_running",
    "llm_requests_waiting": "vllm:num_requests_waiting",
    "llm_preemptions_total": "vllm:num_preemptions_total",
    "llm_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "llm_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
    "llm_prompt_tokens_total": "vllm:prompt_tokens_total",
    "llm_generation_tokens_total": "vllm:generation_tokens_total",
}
# The newest signals (docs/metrics.md rows since #37), each label value one vLLM's source lists, else `other`.
QUEUE_CAPS = ("max_num_queued_reqs", "max_num_queued_tokens")
LABELLED = {
    "llm_requests_waiting_by_reason": ("vllm:num_requests_waiting_by_reason", "reason", "reason",
                                       {"capacity": "capacity", "deferred": "deferred"}),
    "llm_prompt_tokens_by_source_total": ("vllm:prompt_tokens_by_source_total", "source", "source",
                                          {"local_compute": "computed", "local_cache_hit": "local_cache",
                                           "external_kv_transfer": "external_transfer"}),
    "llm_prompt_tokens_cached_by_tier_total": ("vllm:prompt_tokens_cached_by_source_total", "source", "tier",
                                               {"device": "device", "host": "host", "disk": "disk", "p2p": "p2p",
                                                "external_unspecified": "external"}),
    "llm_spec_decode_accepted_tokens_by_position_total": ("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                                                          "position", "position", {str(i): str(i) for i in range(16)}),
}
NEWEST_SCALARS = {  # the spec-decode counters exist only with a draft model (none on this CPU engine)
    "llm_prompt_tokens_cached_total": "vllm:prompt_tokens_cached_total",
    "llm_spec_decode_drafts_total": "vllm:spec_decode_num_drafts_total",
    "llm_spec_decode_draft_tokens_total": "vllm:spec_decode_num_draft_tokens_total",
    "llm_spec_decode_accepted_tokens_total": "vllm:spec_decode_num_accepted_tokens_total",
}
HISTOGRAMS = {
    "llm_time_to_first_token_seconds": "vllm:time_to_first_token_seconds",
    "llm_inter_token_latency_seconds": "vllm:inter_token_latency_seconds",
    "llm_time_per_output_token_seconds": "vllm:request_time_per_output_token_seconds",
    "llm_e2e_request_latency_seconds": "vllm:e2e_request_latency_seconds",
    "llm_request_queue_time_seconds": "vllm:request_queue_time_seconds",
    "llm_request_prompt_tokens": "vllm:request_prompt_tokens",
    "llm_request_generation_tokens": "vllm:request_generation_tokens",
    "llm_request_prefill_computed_tokens": "vllm:request_prefill_kv_computed_tokens",
}


def _key(name: str, labels: dict[str, str]) -> tuple[str, frozenset]:
    if "le" in labels:
        labels = labels | {"le": float(labels["le"])}  # bucket edges compared as numbers
    return name, frozenset(labels.items())


def expected_from_engine_page(page: str) -> Series:
    """The normalized series the docs say this page makes (one model, one data-parallel engine)."""
    flat = _flat(page)
    models = {lab["model_name"] for n, lab, _ in flat if n.startswith("vllm:") and "model_name" in lab}
    assert models == {SERVED_NAME}
    ident = {"engine": "vllm", "model": SERVED_NAME, "pod": "", "namespace": "", "node": NODE}
    out: Series = {}

    def put(name: str, value: float, **extra: str) -> None:
        key = _key(name, ident | extra)
        out[key] = out.get(key, 0.0) + value

    for name, source in SCALARS.items():
        put(name, _value(flat, source))
    for _, lab, v in (s for s in flat if s[0] == "vllm:request_success_total"):
        put("llm_requests_finished_total", v, reason=REASONS.get(lab["finished_reason"], "error"))
    for _, lab, v in (s for s in flat if s[0] == "vllm:admission_rejections_total"):
        put("llm_requests_rejected_total", v, reason=lab["reason"] if lab["reason"] in QUEUE_CAPS else "other")
        put("llm_requests_finished_total", v, reason="error")  # refused with 503: the engine's overload
    for name, (source, theirs, ours, known) in LABELLED.items():
        for _, lab, v in (s for s in flat if s[0] == source):
            put(name, v, **{ours: known.get(lab[theirs], "other")})
    for name, source in NEWEST_SCALARS.items():
        if any(n == source for n, _, _ in flat):
            put(name, _value(flat, source))
    for reason in FINISHED_REASONS:  # every reason at 0 from the model's first scrape (the first event counts)
        put("llm_requests_finished_total", 0.0, reason=reason)
    usage = _value(flat, "vllm:kv_cache_usage_perc")
    (cfg,) = [lab for n, lab, _ in flat if n == "vllm:cache_config_info"]
    # usable blocks: vLLM V1 sets one of num_gpu_blocks aside as its null block and reports usage over the rest
    blocks, block_size = float(cfg["num_gpu_blocks"]) - 1, float(cfg["block_size"])
    put("llm_kv_cache_usage_ratio", usage)
    put("llm_kv_cache_blocks", blocks)
    put("llm_kv_cache_block_size_tokens", block_size)
    put("llm_kv_cache_free_blocks", float(round(blocks * (1.0 - usage))))
    put("llm_engine_sleeping", 0.0 if _value(flat, "vllm:engine_sleep_state", sleep_state="awake") == 1 else 1.0)
    for name, source in HISTOGRAMS.items():
        for n, lab, v in flat:
            if n == source + "_bucket":
                put(name + "_bucket", v, le=lab["le"])
            elif n in (source + "_sum", source + "_count"):
                put(name + n[len(source):], v)
    return out


def exported_series(page: str) -> Series:
    """The exporter's normalized engine series (its own llm_exporter_* health left out)."""
    out: Series = {}
    for name, labels, value in _flat(page):
        if name.startswith("llm_") and not name.startswith("llm_exporter_"):
            key = _key(name, labels)
            assert key not in out, f"{name}{labels} twice on the exporter's page"
            out[key] = value
    return out


def assert_every_value_equals_the_engine_page(server: VllmServer) -> tuple[list, Series]:
    page, exported = _collect_at_rest(server)
    flat_export = _flat(exported)
    up = [(lab, v) for n, lab, v in flat_export if n == "llm_exporter_target_up"]
    assert up == [({"target": f"{server.url}/metrics", "engine": "vllm"}, 1.0)], "auto did not detect vLLM"
    want, got = expected_from_engine_page(page), exported_series(exported)
    missing = sorted(str(k) for k in want.keys() - got.keys())
    extra = sorted(str(k) for k in got.keys() - want.keys())
    assert not missing and not extra, f"missing: {missing[:10]}\nunexpected: {extra[:10]}"
    wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not wrong, f"exporter vs engine page: {wrong}"
    # every histogram the mapping names is there, with buckets: the comparison compared something
    for name in HISTOGRAMS:
        assert sum(1 for n, _ in want if n == name + "_bucket") >= 5, name
    return _flat(page), got


def _exported(got: Series, name: str, **labels: str) -> float:
    picked = [v for (n, lab), v in got.items() if n == name and all((k, w) in lab for k, w in labels.items())]
    assert len(picked) == 1, (name, labels, picked)
    return picked[0]


# ------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------
def test_every_exported_value_equals_the_real_engines_page_after_mixed_traffic(vllm):
    base = _flat(_quiesce(vllm))
    comp, chat = vllm.url + "/v1/completions", vllm.url + "/v1/chat/completions"
    prefix = _words(100, 96)  # three full 32-token blocks shared by every request below
    # one request first, so the shared blocks are cached when the rest arrive
    first = _post(comp, {"model": SERVED_NAME, "prompt": prefix + " w1", "max_tokens": 12, "ignore_eos": True})
    calls: list[tuple[str, Callable[[], dict]]] = []
    for i in range(4):
        p = f"{prefix} {_words(1000 + 10 * i, 5)}"
        calls.append(("length", lambda p=p: _post(comp, {"model": SERVED_NAME, "prompt": p, "max_tokens": 40,
                                                         "ignore_eos": True})))
        calls.append(("length", lambda p=p: _stream(comp, {"model": SERVED_NAME, "prompt": p + " w7",
                                                           "max_tokens": 33, "ignore_eos": True})))
    for i in range(3):
        msg = [{"role": "user", "content": f"{prefix} {_words(2000 + 10 * i, 4)}"}]
        calls.append(("length", lambda m=msg: _post(chat, {"model": SERVED_NAME, "messages": m, "max_tokens": 30,
                                                           "ignore_eos": True})))
        calls.append(("length", lambda m=msg: _stream(chat, {"model": SERVED_NAME, "messages": m, "max_tokens": 21,
                                                             "ignore_eos": True})))
        # every generated word starts with "w": the first token meets the stop string
        calls.append(("stop", lambda i=i: _post(comp, {"model": SERVED_NAME, "prompt": f"{prefix} w{3000 + i}",
                                                       "max_tokens": 40, "stop": ["w"]})))
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda call: call[1](), calls))
    results.append(first)
    wanted = [w for w, _ in calls] + ["length"]
    finishes = [r.get("finish_reason") or r["choices"][0]["finish_reason"] for r in results]
    assert finishes == wanted
    prompt = sum(r["usage"]["prompt_tokens"] for r in results)
    generated = sum(r["usage"]["completion_tokens"] for r in results)

    flat, got = assert_every_value_equals_the_engine_page(vllm)

    # ... and the page itself agrees with what the clients got (so the equalities above compared real counts)
    def delta(name: str, **labels: str) -> float:
        return _value(flat, name, **labels) - _value(base, name, **labels)

    assert delta("vllm:request_success_total", finished_reason="length") == wanted.count("length") == 15
    assert delta("vllm:request_success_total", finished_reason="stop") == wanted.count("stop") == 3
    assert delta("vllm:generation_tokens_total") == generated
    assert delta("vllm:prompt_tokens_total") == prompt
    assert delta("vllm:e2e_request_latency_seconds_count") == len(results)
    assert delta("vllm:request_generation_tokens_sum") == generated
    assert delta("vllm:prefix_cache_hits_total") >= 96 * (len(results) - 1) * 0.5  # the prefix was found
    assert _exported(got, "llm_prefix_cache_hits_total") > 0
    assert _exported(got, "llm_requests_finished_total", reason="stop") >= 3
    assert _exported(got, "llm_kv_cache_blocks") == VllmConfig().num_blocks - 1  # the null block aside
    assert _exported(got, "llm_kv_cache_block_size_tokens") == VllmConfig().block_size
    # at rest, the prefix cache holds blocks, yet they count as free (vLLM's usage gauge leaves them out)
    assert _exported(got, "llm_kv_cache_free_blocks") == VllmConfig().num_blocks - 1
    assert _exported(got, "llm_requests_running") == 0
    # the newest signals on the real engine: the sources add up to the prompt tokens, the cached ones to the hits
    sources = {s: _exported(got, "llm_prompt_tokens_by_source_total", source=s)
               for s in ("computed", "local_cache", "external_transfer")}
    assert sum(sources.values()) == _exported(got, "llm_prompt_tokens_total") and sources["local_cache"] > 0
    assert _exported(got, "llm_prompt_tokens_cached_total") == sources["local_cache"] + sources["external_transfer"]
    assert _exported(got, "llm_prompt_tokens_cached_by_tier_total", tier="device") > 0
    assert _exported(got, "llm_request_prefill_computed_tokens_sum") < _exported(got, "llm_request_prompt_tokens_sum")
    assert _exported(got, "llm_requests_waiting_by_reason", reason="capacity") == 0


def test_gauges_under_load_equal_the_engines_page_with_the_engine_core_stopped(vllm):
    """At rest the gauges are 0 and usage 0; to compare them mid-flight, the engine core is stopped (SIGSTOP) with
    requests running: the API server keeps serving the last page, which stays the same around the collection."""
    comp = vllm.url + "/v1/completions"
    n, out_tokens = 4, 1800  # long enough that none finishes before the engine core is stopped, even on idle cores
    first_tokens = threading.Barrier(n + 1)
    results: list[dict] = []

    def run(i: int) -> None:
        body = {"model": SERVED_NAME, "prompt": _words(700 + 50 * i, 40), "max_tokens": out_tokens, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        req = urllib.request.Request(comp, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
        events, tokens = 0, None
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            for raw in r:
                if raw.startswith(b"data: ") and b"[DONE]" not in raw:
                    events += 1
                    tokens = (json.loads(raw[len(b"data: "):]).get("usage") or {}).get("completion_tokens", tokens)
                    if events == 2:  # tokens are flowing: one more event may carry several of them
                        first_tokens.wait(timeout=TIMEOUT)
        results.append({"tokens": tokens})

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    first_tokens.wait(timeout=TIMEOUT)
    vllm.hang()
    try:
        time.sleep(1.0)  # the last stats the engine core sent before it stopped reach the API server
        for _ in range(5):
            page = vllm.metrics()
            time.sleep(1.0)
            if _vllm_lines(vllm.metrics()) != _vllm_lines(page):
                continue
            exported = _exporter_once(vllm.url)
            if _vllm_lines(vllm.metrics()) == _vllm_lines(page):
                break
        else:
            raise AssertionError("the page of a stopped engine kept changing")
    finally:
        vllm.resume()
    for t in threads:
        t.join(timeout=TIMEOUT)
    assert [r["tokens"] for r in results] == [out_tokens] * n
    want, got = expected_from_engine_page(page), exported_series(exported)
    assert want.keys() == got.keys()
    assert {k: got[k] for k in want if got[k] != want[k]} == {}
    flat = _flat(page)
    running, usage = _value(flat, "vllm:num_requests_running"), _value(flat, "vllm:kv_cache_usage_perc")
    assert running == n == _exported(got, "llm_requests_running")
    assert 0 < usage == _exported(got, "llm_kv_cache_usage_ratio")
    free = _exported(got, "llm_kv_cache_free_blocks")
    assert free == round((VllmConfig().num_blocks - 1) * (1 - usage)) < VllmConfig().num_blocks - 1


def test_a_clients_own_4xx_is_no_error_on_the_real_engine(vllm):
    base, exported_before = _collect_at_rest(vllm)
    comp = vllm.url + "/v1/completions"
    too_long = {"model": SERVED_NAME, "prompt": _words(1, VllmConfig().max_model_len + 10), "max_tokens": 4}
    bad = [too_long, {"model": SERVED_NAME, "prompt": "w1", "max_tokens": -1},
           {"model": SERVED_NAME, "prompt": "w1", "max_tokens": 4, "temperature": -3}]
    codes = [_status_of(comp, body)[0] for body in bad]
    codes.append(_status_of(comp, {"model": "no-such-model", "prompt": "w1", "max_tokens": 4})[0])
    assert codes == [400, 400, 400, 404]
    page, exported = _collect_at_rest(vllm)
    before, after = _flat(base), _flat(page)
    for reason in REASONS:  # vLLM counts none of them, under any reason
        assert (_value(after, "vllm:request_success_total", finished_reason=reason)
                == _value(before, "vllm:request_success_total", finished_reason=reason))
    assert _value(after, "vllm:admission_rejections_total") == _value(before, "vllm:admission_rejections_total")
    got_before, got_after = exported_series(exported_before), exported_series(exported)
    for reason in ("error", "abort"):
        assert (_exported(got_after, "llm_requests_finished_total", reason=reason)
                == _exported(got_before, "llm_requests_finished_total", reason=reason) == 0)


def test_client_disconnects_are_not_counted_as_aborts_by_vllm_0_32(vllm):
    """The abort gap: vLLM's frontend aborts a request whose client went away (output_processor.abort_requests
    pops its state and records no finished-request stats; the engine core's finish_requests sends no output), so
    `request_success_total{finished_reason="abort"}` stays where it was. Engine-side availability cannot see
    disconnects; the tap does (client_disconnected / client_gave_up). If this fails, vLLM started counting them:
    update docs/metrics.md ("Client disconnects")."""
    base = _flat(_quiesce(vllm))
    n, max_tokens = 4, 1500
    host, port = "127.0.0.1", vllm.port
    started = threading.Barrier(n)

    def leave_mid_stream(i: int) -> int:
        conn = http.client.HTTPConnection(host, port, timeout=TIMEOUT)
        body = {"model": SERVED_NAME, "prompt": _words(500 + 20 * i, 8), "max_tokens": max_tokens,
                "ignore_eos": True, "stream": True}
        conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        seen = 0
        while seen < 3:  # three token events, then the client leaves
            line = resp.fp.readline()
            assert line, "the stream ended early"
            if line.startswith(b"data: ") and b"[DONE]" not in line:
                seen += 1
        started.wait(timeout=TIMEOUT)
        # shut the socket down for real: the response's file object still references it, so close() alone
        # would leave the connection open and the engine streaming into the kernel's buffers to the end
        conn.sock.shutdown(socket.SHUT_RDWR)
        resp.close()
        conn.close()
        return seen

    with ThreadPoolExecutor(n) as pool:
        assert list(pool.map(leave_mid_stream, range(n))) == [3] * n
    page = _quiesce(vllm)
    flat = _flat(page)

    def delta(name: str, **labels: str) -> float:
        return _value(flat, name, **labels) - _value(base, name, **labels)

    generated = delta("vllm:generation_tokens_total")
    assert 3 * n <= generated < n * max_tokens  # the engine did work, and stopped before the requests' end
    assert delta("vllm:prompt_tokens_total") == 8 * n  # prefilled: the engine saw the requests
    assert delta("vllm:request_success_total", finished_reason="abort") == 0  # the gap
    assert delta("vllm:request_success_total") == 0  # under no reason at all
    assert delta("vllm:e2e_request_latency_seconds_count") == 0
    # the exporter passes that on: its abort count is the page's
    flat_page, got = assert_every_value_equals_the_engine_page(vllm)
    assert _exported(got, "llm_requests_finished_total", reason="abort") == _value(
        flat_page, "vllm:request_success_total", finished_reason="abort") == 0


def test_preemptions_through_a_small_kv_cache_equal_the_engines_count(start_vllm):
    # 16 blocks of 32 tokens; six requests of 20 + 200 tokens need 7 blocks each, 42 together
    server = start_vllm(VllmConfig(num_blocks=16, max_num_seqs=8, max_model_len=256, max_num_batched_tokens=256))
    comp = server.url + "/v1/completions"
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(
            lambda i: _post(comp, {"model": SERVED_NAME, "prompt": _words(10 + 30 * i, 20), "max_tokens": 200,
                                   "ignore_eos": True}), range(6)))
    # preempted requests are recomputed and still finish as asked
    assert [r["usage"]["completion_tokens"] for r in results] == [200] * 6
    flat, got = assert_every_value_equals_the_engine_page(server)
    preemptions = _value(flat, "vllm:num_preemptions_total")
    assert preemptions > 0
    assert _exported(got, "llm_preemptions_total") == preemptions
    assert _exported(got, "llm_kv_cache_blocks") == 16 - 1
    assert _value(flat, "vllm:request_success_total", finished_reason="length") == 6


def test_refusals_at_a_real_queue_cap_are_counted_by_reason_and_as_errors(start_vllm):
    """vLLM with `--max-num-queued-reqs 2`: of 8 requests sent at once, the ones past the cap get 503 from the API
    server; the exporter's llm_requests_rejected_total{reason="max_num_queued_reqs"} is exactly the 503s the clients
    got, each is an `error` (what LLMEngineRefusingRequests and the availability SLO read), and every other value
    still equals the page."""
    server = start_vllm(VllmConfig(extra_args=["--max-num-queued-reqs", "2"]))
    comp = server.url + "/v1/completions"
    body = {"model": SERVED_NAME, "prompt": _words(10, 20), "max_tokens": 48, "ignore_eos": True}
    with ThreadPoolExecutor(8) as pool:
        statuses = [status for status, _ in pool.map(lambda _: _status_of(comp, body), range(8))]
    refused = statuses.count(503)
    assert refused >= 1 and statuses.count(200) >= 2 and refused + statuses.count(200) == 8, statuses
    _, got = assert_every_value_equals_the_engine_page(server)
    assert _exported(got, "llm_requests_rejected_total", reason="max_num_queued_reqs") == refused
    assert _exported(got, "llm_requests_rejected_total", reason="max_num_queued_tokens") == 0
    assert _exported(got, "llm_requests_finished_total", reason="error") == refused
    assert _exported(got, "llm_requests_finished_total", reason="length") == 8 - refused
