"""A flood against the simulator's OpenAI API: past `--max-num-queued-reqs` requests in flight, or
`--max-num-queued-tokens` prompt tokens waiting for prefill, new requests get 503 with Retry-After (as vLLM
answers), cost the server next to no memory, and the server admits again once the queue drains."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp

from simulator import limits as L
from simulator.admission import RETRY_AFTER_S, QueueLimits
from simulator.api import SimulatorServer, start
from simulator.config import EngineConfig
from simulator.faults import FaultState

ROOT = Path(__file__).resolve().parents[2]
CAP = 200
PROMPT = " ".join(["lorem"] * 2000)  # 2,000 tokens: some 60 KiB a queued request before the fix, 30 KiB after


def _rss(pid: int, key: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(key)


async def _post(session: aiohttp.ClientSession, url: str, statuses: list, prompt: str = PROMPT) -> None:
    async with session.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 5}) as resp:
        body = await resp.json()
        statuses.append((resp.status, resp.headers.get("Retry-After"), body))


async def _state(session, url) -> dict:
    async with session.get(url + "/admin/state") as resp:
        return await resp.json()


async def _until_held(session, url, n: int) -> None:
    """Until the server counts n requests in flight."""
    for _ in range(600):
        if (await _state(session, url))["in_flight"] >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the queue never filled")


async def _flood(url: str, pid: int) -> dict:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CAP + 50),
                                     timeout=aiohttp.ClientTimeout(total=120)) as session:
        held: list = []
        tasks = [asyncio.create_task(_post(session, url, held)) for _ in range(CAP)]
        await _until_held(session, url, CAP)
        refused: list = []
        await asyncio.gather(*(_post(session, url, refused) for _ in range(50)))  # the extra connections, opened
        rss_full = _rss(pid)
        for _ in range(20):  # 1,000 refusals over the same connections
            await asyncio.gather(*(_post(session, url, refused) for _ in range(50)))
        rss_after = _rss(pid)
        async with session.post(url + "/admin/faults", json={"stall": 0}) as resp:  # the engine runs again
            assert resp.status == 200
        await asyncio.gather(*tasks)
        again: list = []
        await _post(session, url, again)
        return {"held": held, "refused": refused, "again": again, "rss_full": rss_full, "rss_after": rss_after}


def test_a_flood_past_max_num_queued_reqs_is_refused_with_503_and_costs_no_memory():
    proc = subprocess.Popen([sys.executable, "-m", "simulator.cli", "serve", "--port", "0", "--max-model-len", "4096",
                             "--stall", "inf", "--max-num-queued-reqs", str(CAP)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        line = proc.stdout.readline()
        assert "serving" in line, line
        base = _rss(proc.pid)
        got = asyncio.run(_flood(line.rsplit(" ", 1)[-1].strip(), proc.pid))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        proc.stdout.close()
    assert [s for s, _, _ in got["held"]] == [200] * CAP  # every admitted request was served in the end
    assert len(got["refused"]) == 1050
    assert {(status, retry) for status, retry, _ in got["refused"]} == {(503, str(RETRY_AFTER_S))}
    error = got["refused"][0][2]["error"]
    assert error["code"] == 503 and "--max-num-queued-reqs" in error["message"] and f"limit is {CAP}" in error["message"]
    assert got["again"][0][0] == 200  # the queue drained: admitted again
    held_kib = (got["rss_full"] - base) / CAP / 1024
    refused_kib = (got["rss_after"] - got["rss_full"]) / 1000 / 1024
    print(f"{CAP} held requests of 2,000 tokens: {held_kib:.1f} KiB each; 1,000 refusals: {refused_kib:.2f} KiB each")
    assert held_kib < 40  # the prompt as 4-byte ids, no body kept: 60 KiB before
    assert refused_kib < 2  # a refusal keeps nothing (measured: under 1 MiB for 1,000 or 5,000, allocator noise)


def test_prompt_tokens_waiting_for_prefill_are_bounded_too():
    async def scenario():
        server = SimulatorServer(EngineConfig(max_model_len=4096), faults=FaultState(stall_until=float("inf")),
                                 queue_limits=QueueLimits(max_num_queued_reqs=100, max_num_queued_tokens=3000))
        runner, url = await start(server)
        try:
            async with aiohttp.ClientSession() as session:
                held: list = []
                tasks = [asyncio.create_task(_post(session, url, held)) for _ in range(2)]  # 2 x 2,000 tokens
                while server.admission.prefill_tokens < 3000:
                    await asyncio.sleep(0.01)
                refused: list = []
                await _post(session, url, refused, "x")
                server.faults.update({"stall": 0}, server.core.clock.now())
                server.loop.notify()
                await asyncio.gather(*tasks)
                return held, refused, server.admission.prefill_tokens, server.admission.in_flight
        finally:
            await runner.cleanup()

    held, [(status, retry, body)], tokens_left, in_flight = asyncio.run(scenario())
    assert [s for s, _, _ in held] == [200, 200]
    assert (status, retry) == (503, str(RETRY_AFTER_S))
    assert "--max-num-queued-tokens" in body["error"]["message"] and "4000 prompt tokens" in body["error"]["message"]
    assert (tokens_left, in_flight) == (0, 0)


def test_the_flags_are_bounded_and_default_to_the_limits_module():
    assert QueueLimits() == QueueLimits(L.DEFAULT_MAX_NUM_QUEUED_REQS, L.DEFAULT_MAX_NUM_QUEUED_TOKENS)
    proc = subprocess.run([sys.executable, "-m", "simulator.cli", "serve", "--max-num-queued-reqs", "0"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--max-num-queued-reqs" in proc.stderr
