"""Load for the real engine: the simulator's seeded workload, sent with the tiny model's own words.

`simulator.loadgen` renders prompts in the simulator's vocabulary; the tiny random Llama the real-engine
tier builds (realengine/build_model.py) has a word-level vocabulary of its own (`w0`, `w1`, ...), so those
words would all be `<unk>`: every prompt the same token, one prefix shared by all, a KV cache that never
fills. Here each prompt token id becomes one of the model's words, so a prompt of N words is N tokens and
prompts differ as the workload drew them (the shared-prefix share included). Timing is the load
generator's (`simulator.loadgen`'s definitions): TTFT at the first chunk with content, E2E at `[DONE]`,
the output token count from the usage chunk; a stream that ends without `[DONE]` failed.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from realengine.build_model import SPECIALS, ROLE_WORDS, word
from simulator.loadgen import fetch_base_model
from simulator.stats import RequestRecord
from simulator.workload import WorkItem, WorkloadSpec, generate

# The tiny model's vocabulary (build_model.py's default --vocab 4096): specials, role words, then w0..w4088.
MODEL_WORDS = 4096 - len(SPECIALS) - len(ROLE_WORDS)


def prompt_text(token_ids: list[int]) -> str:
    """One model word per token id: the tokenizer gives back exactly len(token_ids) tokens."""
    return " ".join(word(t % MODEL_WORDS) for t in token_ids)


def payload(item: WorkItem, model: str) -> dict:
    return {
        "model": item.lora or model,
        "messages": [{"role": "user", "content": prompt_text(item.prompt_token_ids)}],
        "max_tokens": item.output_len,
        "ignore_eos": True,  # random weights: the workload decides the length, as vLLM's benchmark does
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def send_one(session: aiohttp.ClientSession, url: str, item: WorkItem, model: str, t0: float) -> RequestRecord:
    """One streamed chat completion, timed from the moment it is sent."""
    sent = time.perf_counter()
    rec = RequestRecord(start=sent - t0, ok=False, prompt_tokens=0)
    chunks = 0
    done = False
    try:
        async with session.post(url + "/v1/chat/completions", json=payload(item, model)) as resp:
            if resp.status != 200:
                rec.error = f"http {resp.status}"
                await resp.read()
                return rec
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    rec.e2e = time.perf_counter() - sent
                    await resp.content.read()  # to the end of the body: the tap sees a completed response
                    break
                event = json.loads(data)
                if any((c.get("delta") or {}).get("content") for c in event.get("choices") or ()):
                    chunks += 1
                    if rec.ttft is None:
                        rec.ttft = time.perf_counter() - sent
                usage = event.get("usage")
                if usage:
                    rec.prompt_tokens = usage.get("prompt_tokens", 0)
                    rec.output_tokens = usage.get("completion_tokens", 0)
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, ValueError) as e:
        rec.error = f"aborted: {type(e).__name__}"
        rec.e2e = time.perf_counter() - sent
        rec.output_tokens = rec.output_tokens or chunks
        return rec
    if rec.e2e is None:
        rec.e2e = time.perf_counter() - sent
    rec.output_tokens = rec.output_tokens or chunks
    rec.ok = done
    if not done:
        rec.error = "aborted: stream ended without [DONE]"
    return rec


async def run_load(url: str, spec: WorkloadSpec, *, model: str, session: aiohttp.ClientSession) -> list[RequestRecord]:
    """The spec's workload on its Poisson schedule (open loop); one record per request, in send order."""
    url = url.rstrip("/")
    _, max_model_len = await fetch_base_model(session, url)
    t0 = time.perf_counter()

    async def launch(item: WorkItem) -> RequestRecord:
        delay = item.arrival - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        return await send_one(session, url, item, model, t0)

    return list(await asyncio.gather(*(launch(item) for item in generate(spec, max_model_len))))
