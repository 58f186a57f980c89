"""The harness itself: the engine starts from the model built here, serves the OpenAI API with the lengths
asked for, and its page carries the KV geometry it was started with."""

from __future__ import annotations

import json
import urllib.request

from realengine.vllm_server import SERVED_NAME, VllmConfig


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def test_the_engine_serves_the_lengths_asked_for_and_states_its_kv_geometry(vllm):
    out = _post(vllm.url + "/v1/completions",
                {"model": SERVED_NAME, "prompt": "w1 w2 w3 w4 w5", "max_tokens": 17, "ignore_eos": True})
    # a word-level vocabulary: five words are five prompt tokens; ignore_eos makes the length exact
    assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 17, "total_tokens": 22} | {
        k: v for k, v in out["usage"].items() if k not in ("prompt_tokens", "completion_tokens", "total_tokens")}
    assert out["choices"][0]["finish_reason"] == "length"
    info = [line for line in vllm.metrics().splitlines() if line.startswith("vllm:cache_config_info{")]
    assert len(info) == 1
    cfg = VllmConfig()
    assert f'num_gpu_blocks="{cfg.num_blocks}"' in info[0]
    assert f'block_size="{cfg.block_size}"' in info[0]
    assert f'kv_cache_size_tokens="{cfg.num_blocks * cfg.block_size}"' in info[0]


def test_a_hang_stops_generation_while_the_api_server_answers(vllm):
    pids = vllm.hang()
    try:
        assert pids
        with urllib.request.urlopen(vllm.url + "/v1/models", timeout=10) as r:
            assert r.status == 200 and SERVED_NAME in r.read().decode()
        req = urllib.request.Request(vllm.url + "/v1/completions", data=json.dumps(
            {"model": SERVED_NAME, "prompt": "w1", "max_tokens": 4, "ignore_eos": True}).encode(),
            headers={"content-type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=3)
            raise AssertionError("a completion came back while the engine core was stopped")
        except TimeoutError:
            pass
    finally:
        vllm.resume()
    out = _post(vllm.url + "/v1/completions",
                {"model": SERVED_NAME, "prompt": "w1", "max_tokens": 4, "ignore_eos": True})
    assert out["usage"]["completion_tokens"] == 4
