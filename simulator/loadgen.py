"""`llmslo-load`: an open-loop load generator for OpenAI-compatible servers, measuring what a client sees.

Requests leave on a Poisson schedule whether or not earlier ones have finished (open loop, so a slow server
builds a queue instead of slowing the generator down). Each streams; TTFT is taken at the first chunk that
carries content (a chat stream's role-only chunk does not count), TPOT is vLLM's benchmark definition
(E2E - TTFT) / (output tokens - 1), and the output token count comes from the usage chunk. A stream that ends
without `[DONE]` or a connection that breaks counts as failed. `run_load()` returns the per-request records
for callers (the demo, the integration tests) that judge goodput themselves.

The goodput thresholds are `--ttft` / `--tpot`, or a goodput class read from SLO files with `--slo` (and
`--class`), as `llmslo-sim plan` reads them. A run says how far it is on stderr every PROGRESS_EVERY_S seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp

from simulator import cliargs
from simulator import limits as L
from simulator.stats import RequestRecord, render_text, summarize
from simulator.tokens import render
from simulator.workload import WorkItem, WorkloadSpec, generate


async def fetch_base_model(session: aiohttp.ClientSession, url: str) -> tuple[str, int]:
    """The first base model /v1/models lists, and its context length (vLLM reports `max_model_len`)."""
    async with session.get(f"{url}/v1/models") as resp:
        resp.raise_for_status()
        data = (await resp.json())["data"]
    base = [m for m in data if not m.get("parent")] or data
    return base[0]["id"], int(base[0].get("max_model_len") or 1 << 30)


def _payload(item: WorkItem, model: str, chat: bool, render_prompt: Callable[[list[int]], str] = render) -> dict:
    text = render_prompt(item.prompt_token_ids)
    body: dict = {
        "model": item.lora or model,
        "max_tokens": item.output_len,
        "ignore_eos": True,  # the workload decides the output length, as vLLM's benchmark does
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def _has_content(event: dict, chat: bool) -> bool:
    for choice in event.get("choices") or ():
        piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
        if piece:
            return True
    return False


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict | None]:
    """The JSON events of a streamed completion's body, then None at `data: [DONE]`. Resumed past it, it reads
    the body to its end, as well-behaved clients do: a proxy in between (the tap) then sees a completed
    response rather than a client that went away."""
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            yield None
            await resp.content.read()
            return
        yield json.loads(data)


async def send_one(
    session: aiohttp.ClientSession, url: str, item: WorkItem, model: str, chat: bool, t0: float,
    render_prompt: Callable[[list[int]], str] = render,
) -> RequestRecord:
    """One streamed request, timed from the moment it is sent; `render_prompt` turns token ids into the
    server's words (the simulator's vocabulary by default)."""
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    sent = time.perf_counter()
    rec = RequestRecord(start=sent - t0, ok=False, prompt_tokens=0)
    chunks = 0
    done = False
    try:
        async with session.post(url + endpoint, json=_payload(item, model, chat, render_prompt)) as resp:
            if resp.status != 200:
                rec.error = f"http {resp.status}"
                await resp.read()
                return rec
            async for event in sse_events(resp):
                if event is None:  # [DONE]; sse_events then reads the body to its end
                    done = True
                    rec.e2e = time.perf_counter() - sent
                    continue
                if _has_content(event, chat):
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


PROGRESS_EVERY_S = 5.0  # a run shorter than this prints no progress


@dataclass
class Progress:
    """How far a run is: requests scheduled, sent and finished."""

    total: int
    sent: int = 0
    done: int = 0
    failed: int = 0

    def line(self, elapsed: float) -> str:
        return (f"llmslo-load: {elapsed:.0f} s: {self.sent}/{self.total} sent, {self.done} done "
                f"({self.failed} failed), {self.sent - self.done} in flight")


async def _report_progress(progress: Progress, t0: float, every: float, say: Callable[[str], None]) -> None:
    while True:
        await asyncio.sleep(every)
        say(progress.line(time.perf_counter() - t0))


async def run_load(
    url: str,
    spec: WorkloadSpec,
    *,
    model: str | None = None,
    chat: bool = True,
    concurrency_limit: int = 0,
    timeout: float = 600.0,
    session: aiohttp.ClientSession | None = None,
    render_prompt: Callable[[list[int]], str] = render,
    progress: Callable[[str], None] | None = None,
    progress_every_s: float = PROGRESS_EVERY_S,
) -> list[RequestRecord]:
    """Send the spec's workload to `url` on its Poisson schedule; one record per request, in send order.
    `progress`, if given, is told how far the run is every `progress_every_s` seconds (never on a shorter run)."""
    url = url.rstrip("/")
    own = session is None
    if session is None:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=timeout)
        )
    try:
        listed, max_model_len = await fetch_base_model(session, url)
        model = model or listed
        gate = asyncio.Semaphore(concurrency_limit) if concurrency_limit > 0 else None
        items = list(generate(spec, max_model_len))
        state = Progress(len(items))
        t0 = time.perf_counter()

        async def launch(item: WorkItem) -> RequestRecord:
            delay = item.arrival - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            state.sent += 1
            if gate is None:
                rec = await send_one(session, url, item, model, chat, t0, render_prompt)
            else:
                async with gate:
                    rec = await send_one(session, url, item, model, chat, t0, render_prompt)
            state.done += 1
            state.failed += not rec.ok
            return rec

        reporter = (asyncio.create_task(_report_progress(state, t0, progress_every_s, progress))
                    if progress is not None else None)
        try:
            return list(await asyncio.gather(*(launch(item) for item in items)))
        finally:
            if reporter is not None:
                reporter.cancel()
    finally:
        if own:
            await session.close()


def summary_of(records: list[RequestRecord], ttft: float, tpot: float) -> dict:
    """The same summary virtual mode prints, over the span from the first send to the last finish."""
    ends = [r.start + r.e2e for r in records if r.e2e is not None]
    elapsed = max(ends) - min(r.start for r in records) if ends else 0.0
    return summarize(records, elapsed, ttft, tpot)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llmslo-load", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="base URL of the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default="", help="base model name (default: the first base model /v1/models lists)")
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat",
                   help="OpenAI API to call: /v1/chat/completions or /v1/completions (default %(default)s)")
    p.add_argument("--concurrency-limit", type=L.CONCURRENCY_LIMIT, default=0,
                   help=L.CONCURRENCY_LIMIT.help("cap requests in flight (default 0: no cap)"))
    p.add_argument("--timeout", type=L.TIMEOUT, default=600.0,
                   help=L.TIMEOUT.help("per-request timeout, seconds (default 600)"))
    p.add_argument("--quiet", action="store_true",
                   help=f"print no progress (by default a line every {PROGRESS_EVERY_S:g} s on stderr)")
    cliargs.add_workload_arguments(p)
    cliargs.add_slo_arguments(p)
    p.add_argument("--slo", action="append", default=[], metavar="PATH",
                   help="SLO file or directory with an llmslo/goodput SLO (repeatable): its class's ttft and tpot "
                        "replace --ttft and --tpot, as `llmslo-sim plan --slo` reads them (default: none)")
    p.add_argument("--class", dest="slo_class", default="",
                   help="the goodput class to read from --slo (default: the only one)")
    return p


def _thresholds(args: argparse.Namespace) -> tuple[float, float]:
    """--ttft/--tpot, or the goodput class of --slo (an unconstrained one: no limit); ValueError names the flag."""
    if not args.slo:
        if args.slo_class:
            raise ValueError("--class needs --slo: the class is read from SLO files")
        return args.ttft, args.tpot
    from simulator.plan import load_goodput_class  # only with --slo

    cls = load_goodput_class(args.slo, args.slo_class)
    ttft = math.inf if cls.ttft is None else cls.ttft
    tpot = math.inf if cls.tpot is None else cls.tpot
    print(f"llmslo-load: goodput class {cls.name!r} ({cls.origin}): ttft {ttft:g} s, tpot {tpot:g} s",
          file=sys.stderr)
    return ttft, tpot


def main(argv: list[str] | None = None) -> int:
    args = cliargs.parse(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        spec = cliargs.workload_spec(args)
        ttft, tpot = _thresholds(args)
    except ValueError as e:
        print(f"llmslo-load: {e}", file=sys.stderr)
        return 2
    say = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    try:
        records = asyncio.run(run_load(
            args.url, spec, model=args.model or None, chat=args.endpoint == "chat",
            concurrency_limit=args.concurrency_limit, timeout=args.timeout, progress=say,
        ))
    except (aiohttp.ClientError, OSError) as e:
        print(f"llmslo-load: cannot reach {args.url}: {e}", file=sys.stderr)
        return 1
    summary = summary_of(records, ttft, tpot)
    print(json.dumps(summary, indent=2) if args.json else render_text(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
