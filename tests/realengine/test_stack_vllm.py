"""The whole stack on a real vLLM (CPU build, tiny model): slogen's generated rules in a real Prometheus over the
exporter, the tap and the engine, with Alertmanager running slogen's generated routing.

- The incident: `make demo ENGINE=vllm`'s story in its fast mode (demo.fullstack.vllm_variant): steady load, the
  engine really slowed 30x (its engine core and worker stopped for 2.9 s of every 3 s), exactly one page for the
  chat service through the generated routing, its all-clear after recovery, and goodput counted by Prometheus
  (taps -> exporter -> Prometheus) equal to the load generator's own count, but for requests the client saw
  within its own read lag past a threshold (the tap may count those good; none the other way).
- The seats: the capacity rules' free tokens and seats against the engine's own figures: idle, the free tokens
  equal the engine's kv_cache_size_tokens (vllm:cache_config_info) less the one block vLLM V1 keeps as its null
  block; with long requests frozen in flight, they
  equal what the engine's usage gauge implies, the gauge itself equals the blocks those requests hold (counted
  from their own token counts), and llm:kv_seats:p99 equals the free tokens over the p99 footprint computed
  here from the engine's own request-size histograms.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import aiohttp

from demo.alertmanager import PAGE_ROUTE, TICKET_ROUTE
from demo.fullstack import vllm_variant
from demo.incident import IncidentReport, Scenario, expected_resolve_bound, pipeline_lag_s, sent_between
from demo.procs import lingering_in_groups, live_children_of
from demo.realload import prompt_text
from demo.stack import VLLM_ENGINES, VLLM_SLOS, LocalStack, StackSettings
from llmslo import conventions as C
from tests.helpers.incident_runs import run_staged_incident
from tests.helpers.incident_runs import timeline as incident_timeline

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------- the incident

def test_a_real_slowdown_pages_once_clears_and_goodput_agrees(tmp_path):
    started = time.monotonic()
    children_before = set(live_children_of(os.getpid()))
    settings, scenario = vllm_variant(StackSettings.fast(slo_paths=VLLM_SLOS, workdir=tmp_path / "stack"),
                                      Scenario(steady_s=15.0, max_incident_s=90.0, max_resolve_s=240.0, segment_s=3.0))
    groups: list[int] = []
    out = run_staged_incident(settings, scenario, groups)
    elapsed = time.monotonic() - started
    report: IncidentReport = out["report"]
    t_inc, t_rec = report.incident_at, report.recovered_at
    assert t_inc is not None and t_rec is not None
    timeline = incident_timeline(report)
    print(f"\nstack up in {out['start_s']:.1f}s (real vLLM included); whole test {elapsed:.1f}s\n{timeline}")

    # nothing left running: the supervisor's groups (the vLLM API server's holds its engine core and worker)
    assert len(groups) == len(settings.engines) * 2 + 3  # engine + tap each, exporter, Alertmanager, Prometheus
    assert lingering_in_groups(groups) == []
    assert [c for c in live_children_of(os.getpid()) if c not in children_before] == []

    # the page: one notification for the chat service, after the fault, from the generated routing
    slo = report.slo
    assert report.fired is not None, f"no page for {slo.service} within {scenario.max_incident_s}s:\n{timeline}"
    page = report.fired
    assert page.route == PAGE_ROUTE and page.status == "firing" and page.received_at > t_inc
    for alert in page.firing():
        labels = alert["labels"]
        assert labels[C.SLO.LABEL_SERVICE] == "chat" and labels[C.SLO.LABEL_SEVERITY] == "page"
        assert labels[C.LABEL_CLUSTER] == settings.cluster and labels.get("routing") == "pager"
        assert Path(alert["annotations"]["runbook_url"].removeprefix("file://")).name == f"{labels[C.LABEL_ALERTNAME]}.md"
    assert report.load is not None
    bad = report.load.bad_ttft_share(out["engine"], slo.threshold_s, t_inc, page.received_at)
    print(f"paged {page.received_at - t_inc:.1f}s after the fault ({slo.service}/{slo.name}: {bad:.0%} of the "
          f"requests sent meanwhile missed TTFT {slo.threshold_s}s); pipeline lag bound "
          f"{pipeline_lag_s(settings, out['timers']):.1f}s")
    assert bad is not None and bad > 0.3, f"the real slow-down did not degrade TTFT (bad share {bad})"

    # the all-clear, after recovery, in the same group
    assert report.resolved is not None, f"no all-clear within {scenario.max_resolve_s}s:\n{timeline}"
    clear = report.resolved
    assert clear.route == PAGE_ROUTE and clear.group_key == page.group_key and clear.received_at > t_rec
    assert all(a["status"] == "resolved" for a in clear.alerts)
    ends = [t + rec.e2e for t, rec, _ in report.load.records(out["engine"]) if t_inc <= t < t_rec and rec.e2e]
    tail = max(ends, default=t_rec) - t_rec
    bound = expected_resolve_bound(settings, out["timers"], tail)
    print(f"all clear {clear.received_at - t_rec:.1f}s after recovery (bound {bound:.1f}s)")
    assert clear.received_at - t_rec <= bound

    # one incident, one page; no ticket while it was open; none before it either
    notes = out["notifications"]
    pages = [n for n in notes if n.route == PAGE_ROUTE and n.status == "firing"]
    assert len(pages) == 1, [n.payload for n in pages]
    assert sent_between(notes, TICKET_ROUTE, page.received_at, clear.received_at) == []
    assert [n for n in notes if n.received_at < t_inc] == [], "a notification before the fault"

    # goodput two ways: the taps' count in Prometheus equals the load generator's own
    good_load, total = report.load.good(), report.load.requests()
    print(f"goodput: load generator {good_load} good of {total}; Prometheus {out['good_prom']}; "
          f"tap outcomes {out['outcomes']}")
    assert 0 < good_load < total
    # The tap times a token when it relays it, the client when its event loop reads it: later, by the relay and
    # by a loop that takes a burst of tokens for every stream at once each time the throttled engine runs
    # (tens of ms). A request that close to a threshold may be good for the tap and just late for the client,
    # never the other way round; every other request must agree.
    near = _near_thresholds(report)
    assert all(rec_ok for rec_ok, _ in near), near
    assert good_load <= out["good_prom"] <= good_load + len(near), (out["good_prom"], good_load, near)


# how much later than the tap the client may see a request's first token, and its mean token gap
CLIENT_LAG_TTFT_S, CLIENT_LAG_TPOT_S = 0.1, 0.01


def _near_thresholds(report: IncidentReport) -> list[tuple[bool, str]]:
    """Requests the client judged bad within its own lag of a threshold (the tap may have judged them good),
    and the ones that failed outright (none should)."""
    out = []
    assert report.load is not None
    for _, res in report.load.segments:
        for r in res.values():
            for rec, o in zip(r.records, r.objectives, strict=True):
                if not rec.ok:
                    out.append((False, f"failed: {rec.error}"))
                    continue
                for name, value, limit, lag in (("ttft", rec.ttft, o.ttft, CLIENT_LAG_TTFT_S),
                                                ("tpot", rec.tpot, o.tpot, CLIENT_LAG_TPOT_S)):
                    if value is not None and limit is not None and limit < value <= limit + lag:
                        out.append((True, f"{name}={value:.4f} (threshold {limit})"))
                        break
    return out


# ---------------------------------------------------------------------------------------------- the seats

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _samples(page: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in page.splitlines():
        m = _SAMPLE.match(line)
        if m and m.group(1) == name:
            out.append((dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def _one(page: str, name: str) -> tuple[dict[str, str], float]:
    found = _samples(page, name)
    assert len(found) == 1, f"{name}: {found}"
    return found[0]


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (le, count) buckets: the rank's bucket, linear inside it,
    the lowest bucket starting at 0, the +Inf bucket answered with the highest finite bound."""
    buckets = sorted(buckets)
    assert buckets and math.isinf(buckets[-1][0]), buckets
    total = buckets[-1][1]
    assert total > 0
    rank = q * total
    i = next(i for i, (_, count) in enumerate(buckets) if count >= rank)
    if i == len(buckets) - 1:
        return buckets[-2][0]
    upper, count = buckets[i]
    lower, below = (0.0, 0.0) if i == 0 else buckets[i - 1]
    if i == 0 and upper <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / (count - below)


def _buckets(page: str, name: str) -> list[tuple[float, float]]:
    return [(float(labels["le"]), value) for labels, value in _samples(page, name + "_bucket")]


async def _engine_page(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics") as resp:
        return await resp.text()


async def _prom_value(stack: LocalStack, expr: str) -> float | None:
    rows = await stack.prom().query(expr)
    assert len(rows) <= 1, rows
    return float(rows[0]["value"][1]) if rows else None


async def _until(stack: LocalStack, expr: str, want: float, timeout_s: float = 60.0) -> float | None:
    """Poll Prometheus until `expr` equals `want` (or time runs out): the pipeline's lag, not a tolerance."""
    deadline = time.monotonic() + timeout_s
    got = None
    while time.monotonic() < deadline:
        got = await _prom_value(stack, expr)
        if got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=0.0):
            return got
        await asyncio.sleep(0.5)
    return got


def test_seats_equal_the_engines_own_kv_figures(tmp_path):
    spec = replace(VLLM_ENGINES[0], kv_blocks=128)
    settings = StackSettings.fast(slo_paths=VLLM_SLOS, engines=(spec,), gpus=1, workdir=tmp_path / "stack")
    free_expr = f'llm:kv_cache_free_tokens{{pod="{spec.name}"}}'
    out: dict = {}

    async def body() -> None:
        async with LocalStack(settings) as stack, aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=600)) as session:
            engine = stack.engine(spec.name)
            assert engine.vllm is not None
            page = await _engine_page(session, engine.sim_url)
            info, _ = _one(page, "vllm:cache_config_info")
            n, b, size = int(info["num_gpu_blocks"]), int(info["block_size"]), int(info["kv_cache_size_tokens"])
            assert (n, b) == (128, 32) and size == n * b

            # idle: every block free but the null block vLLM V1 sets aside (kv_cache_size_tokens counts it)
            usable = size - b
            out["idle"] = await _until(stack, free_expr, usable)
            assert out["idle"] == usable, f"idle: Prometheus free tokens {out['idle']} != kv_cache_size_tokens {size} - {b}"

            # requests of known sizes complete: the engine's own request-size histograms hold them
            sizes = [(40, 10), (90, 30), (150, 60), (300, 120), (600, 20), (70, 200), (250, 45), (500, 90)]

            async def complete(i: int, prompt: int, gen: int) -> dict:
                body = {"model": spec.model, "prompt": prompt_text([1000 + 37 * i + k for k in range(prompt)]),
                        "max_tokens": gen, "ignore_eos": True}
                async with session.post(engine.tap_url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    return (await resp.json())["usage"]

            usages = await asyncio.gather(*(complete(i, p, g) for i, (p, g) in enumerate(sizes)))
            assert sorted((u["prompt_tokens"], u["completion_tokens"]) for u in usages) == sorted(sizes)
            page = await _engine_page(session, engine.sim_url)
            prompt_b = _buckets(page, "vllm:request_prompt_tokens")
            gen_b = _buckets(page, "vllm:request_generation_tokens")
            assert prompt_b[-1][1] == gen_b[-1][1] == len(sizes)
            footprint = {q: histogram_quantile(q, prompt_b) + histogram_quantile(q, gen_b) for q in (0.99, 0.5)}
            out["footprint"] = footprint
            # idle again: the finished requests' blocks stay in the prefix cache, evictable, so free
            assert await _until(stack, free_expr, usable) == usable
            got = await _until(stack, f'llm:request_tokens:p99{{pod="{spec.name}"}}', footprint[0.99])
            assert got is not None and math.isclose(got, footprint[0.99], rel_tol=1e-9), (got, footprint)
            got = await _until(stack, f'llm:kv_seats:p99{{pod="{spec.name}"}}', usable / footprint[0.99])
            assert got is not None and math.isclose(got, usable / footprint[0.99], rel_tol=1e-9), (got, usable, footprint)

            # long requests in flight, then the engine core frozen (SIGSTOP): its page, the exporter's and
            # Prometheus' must agree on one state
            prompts = [480, 333, 611]
            tokens = [0] * len(prompts)

            async def stream(i: int, prompt: int) -> None:
                body = {"model": spec.model, "prompt": prompt_text([2000 + 101 * i + k for k in range(prompt)]),
                        "max_tokens": 1400, "ignore_eos": True, "stream": True,
                        "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
                async with session.post(engine.sim_url + "/v1/completions", json=body) as resp:
                    async for raw in resp.content:
                        line = raw.strip()
                        if line.startswith(b"data:") and line != b"data: [DONE]":
                            usage = json.loads(line[5:]).get("usage") or {}
                            assert usage.get("prompt_tokens", prompt) == prompt
                            tokens[i] = usage.get("completion_tokens", tokens[i])

            streams = [asyncio.ensure_future(stream(i, p)) for i, p in enumerate(prompts)]
            try:
                deadline = time.monotonic() + 120
                while min(tokens) < 40 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                assert min(tokens) >= 40, f"the long requests did not get going: {tokens}"
                engine.vllm.hang()
                await asyncio.sleep(3.0)  # the API server has relayed every output the engine core sent
                page = await _engine_page(session, engine.sim_url)
                _, usage = _one(page, "vllm:kv_cache_usage_perc")
                _, running = _one(page, "vllm:num_requests_running")
                frozen = list(tokens)
                # the engine's usage is 1 - free / (blocks - 1) (one block is vLLM's null block); the running
                # requests hold one block per 32 tokens of prompt + output whose KV was computed: all but the
                # newest output token
                held = sum(math.ceil((p + g - 1) / b) for p, g in zip(prompts, frozen, strict=True))
                engine_free = round((1 - usage) * (n - 1))
                out["frozen"] = dict(tokens=frozen, usage=usage, held=held, engine_free_blocks=engine_free)
                assert running == len(prompts)
                assert engine_free == n - 1 - held, out["frozen"]
                # the exporter's free blocks are exactly the engine's (usable x (1 - usage)), seats follow
                want_free = engine_free * b
                got_free = await _until(stack, free_expr, want_free)
                out["frozen"].update(prom_free_tokens=got_free, want_free_tokens=want_free)
                assert got_free == want_free, out["frozen"]
                assert got_free < usable
                # what the running requests will still take, as the rules approximate it: running x the p50
                # output of the finished requests (none waiting); seats are the free tokens net of it
                committed = running * histogram_quantile(0.5, gen_b)
                got_committed = await _until(stack, f'llm:kv_cache_committed_tokens{{pod="{spec.name}"}}', committed)
                assert got_committed is not None and math.isclose(got_committed, committed, rel_tol=1e-9), (
                    got_committed, committed)
                want_net = max(0.0, want_free - committed)
                want_seats = want_net / footprint[0.99]
                got_seats = await _until(stack, f'llm:kv_seats:p99{{pod="{spec.name}"}}', want_seats)
                assert got_seats is not None and math.isclose(got_seats, want_seats, rel_tol=1e-9), (got_seats, want_seats)
                want_p50 = want_net / footprint[0.5]
                got_p50 = await _until(stack, f'llm:kv_seats:p50{{pod="{spec.name}"}}', want_p50)
                assert got_p50 is not None and math.isclose(got_p50, want_p50, rel_tol=1e-9), (got_p50, want_p50)
                out["frozen"].update(seats_p99=got_seats, seats_p50=got_p50)
            finally:
                engine.vllm.resume()
                for s in streams:
                    s.cancel()
                await asyncio.gather(*streams, return_exceptions=True)

    asyncio.run(body())
    print(f"\nseats: {out}")
