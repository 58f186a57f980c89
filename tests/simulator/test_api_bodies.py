"""Bad JSON bodies to the simulator's API get a 400 naming the field (issue 27), never a 500 or a silent default.

Before: a deeply nested body ended in RecursionError (500) on /admin/faults and /v1/completions,
`{"reset": "yes"}` was ignored with a 200, and `"stream": "no"` streamed.
"""

from __future__ import annotations

import json
import tracemalloc
import urllib.error
import urllib.request

import pytest

from simulator.api import MAX_JSON_DEPTH, json_depth
from simulator.tokens import PromptTooLong, tokenize, tokenize_chat


def _post(url: str, path: str, raw: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url + path, raw, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

# (path, body, the field the error must name: in `param` and in the message)
BAD_BODIES = [
    ("/admin/faults", {"reset": "yes"}, "reset"),
    ("/admin/faults", {"reset": 1}, "reset"),
    ("/admin/faults", {"slowdown": "3"}, "slowdown"),
    ("/admin/faults", {"slowdown": 1e308}, "slowdown"),
    ("/admin/faults", {"stall": "long"}, "stall"),
    ("/admin/faults", {"error_mode": ["abort"]}, "error_mode"),
    ("/v1/completions", {"prompt": "hi", "stream": "no"}, "stream"),
    ("/v1/completions", {"prompt": "hi", "ignore_eos": "yes"}, "ignore_eos"),
    ("/v1/completions", {"prompt": [1, -5]}, "prompt"),
    ("/v1/completions", {"prompt": "hi", "model": 7}, "model"),
    ("/v1/completions", {"prompt": "hi", "stream": True, "stream_options": "usage"}, "stream_options"),
    ("/v1/completions", {"prompt": "hi", "stream": True, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage"),
    ("/v1/chat/completions", CHAT | {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages"),
    ("/v1/chat/completions", CHAT | {"n": True}, "n"),
]


@pytest.mark.parametrize("path,body,field", BAD_BODIES, ids=[f"{p} {f}" for p, _, f in BAD_BODIES])
def test_a_wrong_type_or_range_is_a_400_naming_the_field(sim_server, path, body, field):
    srv = sim_server()
    status, answer = _post(srv.url, path, json.dumps(body).encode())
    assert status == 400, answer
    assert answer["error"]["param"] == field and field in answer["error"]["message"], answer
    assert _post(srv.url, "/admin/faults", b"{}")[1]["slowdown"] == 1.0  # nothing changed


@pytest.mark.parametrize("path", ["/admin/faults", "/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 100_000])
def test_deeply_nested_json_is_a_400(sim_server, path, depth):
    srv = sim_server()
    status, answer = _post(srv.url, path, _nested(depth))
    assert status == 400, answer
    assert f"deeper than {MAX_JSON_DEPTH} levels" in answer["error"]["message"]


@pytest.mark.parametrize("path", ["/admin/faults", "/v1/completions"])
def test_json_the_parser_refuses_is_a_400(sim_server, path):
    srv = sim_server()
    for raw in (b'{"max_tokens": ' + b"9" * 5000 + b"}", b"\xff\xfe", b"{"):  # past Python's int digit limit
        status, answer = _post(srv.url, path, raw)
        assert status == 400 and "not valid JSON" in answer["error"]["message"], answer


def test_bodies_within_the_depth_and_types_still_work(sim_server):
    srv = sim_server()
    status, answer = _post(srv.url, "/admin/faults", json.dumps({"reset": True, "stall": 0}).encode())
    assert status == 200 and answer["stalled"] is False
    parts = CHAT | {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "stream": False,
                    "ignore_eos": True, "response_format": {"type": "json_schema", "json_schema": _schema(4)}}
    status, answer = _post(srv.url, "/v1/chat/completions", json.dumps(parts).encode())
    assert status == 200 and answer["usage"]["completion_tokens"] == 2


def _schema(depth: int) -> dict:
    node: dict = {"type": "string"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"x": node}}
    return node


def test_json_depth():
    assert json_depth(1) == 0 and json_depth([]) == 1 and json_depth({"a": [1, {"b": []}]}) == 4
    assert json_depth(json.loads(_nested(50))) > MAX_JSON_DEPTH


def test_a_prompt_longer_than_the_context_is_refused_before_it_is_tokenized(sim_server):
    """Before: the whole prompt was split into words first (a 64 MiB body of one-letter words: 32 million
    strings, ~2 GB) and only then refused for its length."""
    srv = sim_server(max_model_len=2048)
    status, answer = _post(srv.url, "/v1/completions", json.dumps({"prompt": "ka " * 2048}).encode())
    assert status == 400 and answer["error"]["param"] == "prompt" and "2048" in answer["error"]["message"]
    chat = {"messages": [{"role": "user", "content": "ka " * 1000}] * 3}
    status, answer = _post(srv.url, "/v1/chat/completions", json.dumps(chat).encode())
    assert status == 400 and answer["error"]["param"] == "messages", answer
    status, _ = _post(srv.url, "/v1/completions", json.dumps({"prompt": "ka " * 2000, "max_tokens": 8}).encode())
    assert status == 200


def test_tokenizing_stops_at_the_limit():
    text = "ka " * 1_000_000
    tracemalloc.start()
    try:
        with pytest.raises(PromptTooLong):
            tokenize(text, 8191)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(text), f"{peak:,} bytes to refuse a {len(text):,}-byte prompt"
    assert tokenize("ka  be\nka", 3) == tokenize("ka be ka") and len(tokenize_chat([{"role": "user", "content": "a b"}], 5)) == 5
    with pytest.raises(PromptTooLong):
        tokenize_chat([{"role": "user", "content": "a b"}], 4)
